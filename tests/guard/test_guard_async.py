"""The guard when the host does not wait inside the collective (NCCL's pattern), emulated on CPU
with gloo and async_op=True: the rank issues the collective and waits later, in Work.wait(), a
future, or a busy poll on is_completed() that spins a core the way CUDA's default
synchronisation does. Waiting is not life: each broken case is stopped within seconds with the
right cause, and a rank that polls while its peer computes is left alone.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import ROOT, child_env, guard_run, run_cli

SCRIPT = "tests/guard/scripts/async_scenarios.py"
SHORT = {"DDPGUARD_NO_LIFE": "2", "DDPGUARD_NOTICE_AFTER": "1.5", "DDPGUARD_DUMP_WAIT": "2"}
pytestmark = pytest.mark.slow


def line_of(snippet: str) -> str:
    lines = (ROOT / SCRIPT).read_text().splitlines()
    found = [i + 1 for i, text in enumerate(lines) if snippet in text]
    assert len(found) == 1, f"{snippet!r} found at lines {found}"
    return f"async_scenarios.py:{found[0]}"


def run_case(case: str, wait: str, tmp_path: Path, *opts: str, torchrun: bool = False,
             **env: str):
    full = child_env(DDPGUARD_REPORT_DIR=str(tmp_path), **{**SHORT, **env})
    t0 = time.monotonic()
    res = run_cli(*guard_run(*opts, torchrun=torchrun), SCRIPT, "--case", case, "--wait",
                  wait, timeout=120, env=full)
    return res, time.monotonic() - t0


def _report(tmp_path: Path) -> dict:
    reports = sorted(tmp_path.glob("*.json"))
    assert reports, "no JSON report written"
    return json.loads(reports[0].read_text())


# case, how the host waits, cause key, texts in the report, culprits
BROKEN = [
    ("mismatch", "poll", "conditional_collective", ["barrier #", "all_reduce #"], None),
    ("mismatch", "wait", "conditional_collective", ["barrier #", "all_reduce #"], None),
    ("cross", "poll", None, ["(group 1)", "all_reduce #"], None),
    # A wait the flight recorder does not list: forming a group on one rank only.
    ("new_group", "wait", None, ["new_group (process-group set-up)", "all_reduce #",
                                 line_of("new_group on rank 0 only")], None),
    # Whichever rank decides: rank 0 (it saw rank 1 exit) or rank 1 as it leaves (it found
    # rank 0 already waiting past its last collective), under load either comes first.
    ("early_exit", "poll", "left_early",
     [("rank 1 exited", "rank 1 left (it destroyed its process group or exited)"),
      "rank 0 waits in all_reduce #"], [1]),
]


@pytest.mark.parametrize("case, wait, cause, texts, culprits", BROKEN,
                         ids=[f"{b[0]}-{b[1]}" for b in BROKEN])
def test_async_broken_program_is_stopped_with_the_cause(case, wait, cause, texts, culprits,
                                                        tmp_path):
    res, took = run_case(case, wait, tmp_path)
    assert res.returncode == 17, (res.returncode, res.stderr[-4000:])
    rep = _report(tmp_path)
    d = rep["diagnosis"]
    if cause is not None:
        assert d["cause"] == cause, (d, res.stderr[-3000:])
    assert rep["proof"], "a waiting rank was judged, not proven stuck"
    whole = json.dumps(rep) + res.stderr
    for text in texts:
        options = text if isinstance(text, tuple) else (text,)
        assert any(t in whole for t in options), \
            f"{text!r} not in the report/stderr:\n{res.stderr[-4000:]}"
    if culprits is not None:
        assert d["culprits"] == culprits
    # Proven within 5 s of the last rank starting to wait, however much CPU the wait spun.
    blocked_at = max(float(s[0]) for r in rep["ranks"] for s in r["lanes"]
                     if s[2] == "collective")
    assert rep["created"] - blocked_at < 5.0, rep["created"] - blocked_at
    assert took < 60, took


def test_killed_peer_while_waiting_on_a_future_is_named(tmp_path):
    # gloo notices the closed connection and the survivor's future raises; its guard names
    # the dead peer and the collective it waited for, instead of "Connection closed by peer".
    # torchrun's agent would end the survivor within its monitor interval (1 s): on a loaded
    # machine that can come first, and `ddpguard run` then composes the report from the
    # fault logs (test_guard_ends). Three seconds leave this test the survivor's own report.
    res, took = run_case("peer_gone", "future", tmp_path, "--monitor-interval=3",
                         torchrun=True)
    assert res.returncode != 0 and took < 60, res.stderr[-3000:]
    assert "rank 1 died" in res.stderr and "all_reduce #" in res.stderr, res.stderr[-3000:]
    assert "ddpguard: rank 0 stopped at" in res.stderr, res.stderr[-3000:]


def test_a_rank_polling_while_its_peer_computes_is_left_running(tmp_path):
    # Rank 1 polls is_completed() (a spinning wait) for several seconds, past no_life, while
    # rank 0 computes: the poll is waiting, the compute is life, and nobody is stopped.
    res, _ = run_case("healthy", "poll", tmp_path, ASYNC_WORK="10000")
    assert res.returncode == 0, res.stderr[-4000:]
    assert "rank 0 done" in res.stdout and "rank 1 done" in res.stdout
    assert not list(tmp_path.glob("*.json"))
    # The guard saw rank 1 waiting (a notice names it), not computing.
    assert any("rank 1 has waited" in ln for ln in res.stderr.splitlines()), res.stderr[-3000:]
