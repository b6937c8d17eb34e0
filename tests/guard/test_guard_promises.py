"""Promises of the guard that a one-line break of the code once left the whole suite green:
the periodic desync comparison in a long run, DDPGUARD_NO_LIFE changing when a stall is
judged, and a pass of unequal loaders with no collective inside left running."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import ROOT, child_env, guard_run, run_cli

SCRIPT = "tests/guard/scripts/promises.py"
pytestmark = pytest.mark.slow


def line_of(snippet: str) -> str:
    lines = (ROOT / SCRIPT).read_text().splitlines()
    found = [i + 1 for i, text in enumerate(lines) if snippet in text]
    assert len(found) == 1, f"{snippet!r} found at lines {found}"
    return f"promises.py:{found[0]}"


def run_case(case: str, tmp_path: Path, **env: str):
    full = child_env(DDPGUARD_REPORT_DIR=str(tmp_path), DDPGUARD_DUMP_WAIT="2", **env)
    t0 = time.monotonic()
    res = run_cli(*guard_run(), SCRIPT, "--case", case, timeout=150,
                  env=full)
    return res, time.monotonic() - t0


def _report(tmp_path: Path) -> dict:
    reports = sorted(tmp_path.glob("*.json"))
    assert reports, "no JSON report written"
    return json.loads(reports[0].read_text())


def test_periodic_comparison_names_a_desync_in_a_run_that_goes_on(tmp_path):
    # Neither rank hangs, crashes or leaves: only the periodic comparison can stop it, and it
    # must do so while the run still goes on (the exit-time comparison would come 10 s later).
    res, _ = run_case("desync_long", tmp_path, DDPGUARD_DIGEST_INTERVAL="1")
    assert res.returncode == 17, res.stderr[-3000:]
    assert "rank 0 done" not in res.stdout and "rank 1 done" not in res.stdout
    steps = [int(ln.rsplit(" ", 1)[1]) for ln in res.stdout.splitlines() if " step " in ln]
    assert steps and max(steps) < 39, max(steps or [0])
    rep = _report(tmp_path)
    assert rep["diagnosis"]["cause"] == "desync", rep["diagnosis"]
    assert "16 Float" in rep["reason"] and "16 Int" in rep["reason"], rep["reason"]
    assert line_of("desync: float32") in rep["reason"] and line_of("desync: int32") in \
        rep["reason"], rep["reason"]


@pytest.mark.parametrize("no_life", [2, 7])
def test_no_life_setting_decides_when_a_stall_is_judged(no_life, tmp_path):
    res, took = run_case("stall", tmp_path, DDPGUARD_NO_LIFE=str(no_life))
    assert res.returncode == 17, res.stderr[-3000:]
    rep = _report(tmp_path)
    assert rep["diagnosis"]["cause"] == "no_life" and rep["diagnosis"]["culprits"] == [1]
    assert line_of("stall: spins forever") in json.dumps(rep["diagnosis"])
    # Said as a loop burning CPU, not as a wait in a call or as plain computing.
    assert rep["diagnosis"]["positions"]["1"]["doing"].startswith("spinning in a loop")
    # Judged once rank 1 had been quiet for no_life seconds: not before, and not much after.
    waited = rep["created"] - min(float(s[0]) for r in rep["ranks"] if r["rank"] == 0
                                  for s in r["lanes"] if s[2] == "collective")
    assert no_life - 0.5 <= waited <= no_life + 6, (no_life, waited)


def test_a_busy_wait_on_a_flag_nothing_sets_is_judged_a_stall(tmp_path):
    # corpus33f's tuning case: each turn calls a lookup, which moves the stack (once read as
    # work); the loop only evaluates its condition, so it waits, and nothing else works.
    res, _ = run_case("stall_poll", tmp_path, DDPGUARD_NO_LIFE="4")
    assert res.returncode == 17, res.stderr[-3000:]
    rep = _report(tmp_path)
    assert rep["diagnosis"]["cause"] == "no_life" and rep["diagnosis"]["culprits"] == [1]
    # The loop's line leads (not the lookup its condition was in when sampled).
    assert line_of("stall: polls a flag nothing sets") in rep["reason"], rep["reason"]


def test_unequal_loaders_without_collectives_are_left_running(tmp_path):
    # Different shard sizes, local work only in the pass, then collectives on every rank.
    res, _ = run_case("uneven_local", tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rank 0 done" in res.stdout and "rank 1 done" in res.stdout
    assert not list(tmp_path.glob("*.json")), "a report was written for a healthy job"


def test_a_stopped_rank_does_not_outlive_the_verdict(tmp_path):
    # SIGSTOP: the rank cannot follow the stop nor handle torchrun's SIGTERM (whose grace is
    # 30 s). The job must be over within seconds of the report, the stopped rank included
    # (conftest fails the test if any process is left).
    res, took = run_case("sigstop", tmp_path, DDPGUARD_NO_LIFE="2")
    assert res.returncode == 17, res.stderr[-3000:]
    rep = _report(tmp_path)
    assert rep["diagnosis"]["cause"] == "no_life" and rep["diagnosis"]["culprits"] == [1]
    assert "not answering" in json.dumps(rep["diagnosis"])
    assert took < 25, took
