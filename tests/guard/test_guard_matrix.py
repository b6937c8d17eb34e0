"""The hang guard on real programs: healthy ones it must leave running, broken ones it must stop
and explain. Each runs through `ddpguard run` on 2 gloo ranks (tests/guard/scripts/scenarios.py),
forked by torch.multiprocessing after one torch import (scripts/forkrun.py: a third of the CPU
of a torchrun job); the tests that read what torchrun's agent adds start the job under torchrun.

Timeouts are shortened through the environment (the defaults run in bench/guard.py): the long
work of a healthy program lasts DUR seconds, more than twice NO_LIFE, so a guard that judged
by time alone would stop it. No process may outlive a test (conftest's fixture checks it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
from helpers import ROOT, child_env, guard_run, run_cli

SCRIPT = "tests/guard/scripts/scenarios.py"
DUR = 4.0
SHORT = {"DDPGUARD_NO_LIFE": "2", "DDPGUARD_NOTICE_AFTER": "1.5", "DDPGUARD_DIGEST_INTERVAL": "1",
         "DDPGUARD_DUMP_WAIT": "2"}
pytestmark = pytest.mark.slow


def line_of(snippet: str) -> str:
    """'scenarios.py:N' for the one line holding `snippet`: no test pinned to a number."""
    lines = (ROOT / SCRIPT).read_text().splitlines()
    found = [i + 1 for i, text in enumerate(lines) if snippet in text]
    assert len(found) == 1, f"{snippet!r} found at lines {found}"
    return f"scenarios.py:{found[0]}"


def lines_of_function(name: str) -> set[str]:
    """'scenarios.py:N' for every line of function `name`: the guard samples the working
    rank's stack, so the line it names may be any line of the loop it is in."""
    lines = (ROOT / SCRIPT).read_text().splitlines()
    start = int(line_of(f"def {name}(").rsplit(":", 1)[1])
    out = set()
    for j in range(start, len(lines)):
        if lines[j].strip() and not lines[j].startswith((" ", "\t")):
            break
        if lines[j].strip():
            out.add(f"scenarios.py:{j + 1}")
    return out


def run_case(case: str, tmp_path: Path, dur: float = DUR, torchrun: bool = False, **env: str):
    """One job: its ranks forked by torch.multiprocessing after one torch import (forkrun.py),
    or, with `torchrun`, started by torchrun (`ddpguard run --nproc-per-node 2 SCRIPT`)."""
    full = child_env(DDPGUARD_REPORT_DIR=str(tmp_path), **{**SHORT, **env})
    t0 = time.monotonic()
    res = run_cli(*guard_run(torchrun=torchrun), SCRIPT, "--case", case, "--dur", str(dur),
                  timeout=150, env=full)
    return res, time.monotonic() - t0


# Healthy programs, several compatible ones chained in one job (one launch instead of six):
# group -> (cases, lines the guard's "still waiting" notices must name as the working rank's)
HEALTHY = {
    "warmups_and_waits": (
        ["slow_first_step",       # compile-like warm-up in rank 1's first forward
         "slow_first_backward",   # the same inside backward
         "slow_first_batch",      # the first batch trickles in from slow storage
         "nanogpt_eval",          # estimate_loss() through DDP on rank 0 (no buffers)
         "step_spike",            # one long step in a fast run
         "ckpt_barrier"],         # rank 0 writes a checkpoint while rank 1 waits in barrier()
        [lines_of_function("busy"),
         lines_of_function("estimate_loss")]),
    "rank0_work": (
        ["rank0_eval_tensors",    # rank 0 evaluates on plain tensors, rank 1 in backward
         "rank0_eval_loader",     # rank 0 evaluates with a DataLoader
         "accelerate_wait",       # main process saves, then wait_for_everyone()
         "val_same_helper",       # rank-0 validation through the training loop's helper
         "random_step_times",     # uneven step times
         "final_ckpt_after_exit"],  # rank 0 saves after rank 1 finished and left
        [lines_of_function("busy")]),
}


@pytest.mark.parametrize("group", sorted(HEALTHY))
def test_healthy_programs_are_left_running(group, tmp_path):
    cases, lines = HEALTHY[group]
    res, took = run_case(",".join(cases), tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    for rank in (0, 1):
        assert f"rank {rank} done" in res.stdout, res.stdout[-2000:]
    for case in cases:
        if case != "random_step_times":
            assert f"phase {case} done" in res.stdout, (case, res.stdout[-2000:])
    assert "stopped by the hang guard" not in res.stderr
    assert not list(tmp_path.glob("*.json")), "a report was written for a healthy job"
    # The waits really happened, and the guard saw who was working where.
    notices = [ln for ln in res.stderr.splitlines() if "has waited" in ln]
    assert notices, res.stderr[-3000:]
    for loop in lines:
        assert any(f"is at tests/guard/scripts/{where} " in n for n in notices
                   for where in loop), (sorted(loop), notices)


# case, cause key, substrings the report must contain, culprit ranks
BROKEN = [
    ("mismatch_before_training", "conditional_collective",
     ["barrier #", "all_reduce #", line_of("dist.all_reduce(torch.ones(3))")], None),
    ("cond_barrier", "conditional_collective",
     ["barrier #", line_of("dist.barrier()  # only rank 0 gets here")], None),
    ("eval_rank0_bn", "forward_on_some_ranks", ["broadcast #", "all_reduce #"], None),
    ("uneven_tail", "uneven_batches",
     ["rank 0: 8, rank 1: 7",
      f"`for` at tests/guard/scripts/{line_of('(xb, yb) in enumerate(loader)')}",
      f"created at tests/guard/scripts/{line_of('loader = DataLoader(data')}"], [1]),
    ("early_exit", "left_early", ["rank 1 exited", "rank 0 waits in all_reduce #"], [1]),
    ("infinite_loop", "no_life", ["rank 1 has shown no sign of life",
                                  line_of("while True:")], [1]),
    ("blocked_read", "blocked_outside", ["rank 1 has shown no sign of life",
                                 line_of("os.read(r, 1)")], [1]),
    ("loader_worker_deadlock", "loader_stall", ["rank 1 has shown no sign of life"], [1]),
]


def _report(tmp_path: Path) -> dict:
    reports = sorted(tmp_path.glob("*.json"))
    assert reports, "no JSON report written"
    return json.loads(reports[0].read_text())


@pytest.mark.parametrize("case, cause, texts, culprits", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_program_is_stopped_and_explained(case, cause, texts, culprits, tmp_path):
    res, took = run_case(case, tmp_path, dur=3.0)
    assert res.returncode == 17, (res.returncode, res.stderr[-4000:])
    assert took < 90, f"{case} took {took:.0f} s"
    rep = _report(tmp_path)
    d = rep["diagnosis"]
    assert d["cause"] == cause, (d, res.stderr[-3000:])
    assert f"likely cause: {d['title']}" in res.stderr
    whole = json.dumps(rep) + res.stderr
    for text in texts:
        assert text in whole, f"{text!r} not in the report/stderr:\n{res.stderr[-4000:]}"
    if culprits is not None:
        assert d["culprits"] == culprits
    # Every rank is accounted for, with where it was.
    assert sorted(int(k) for k in d["positions"]) == [0, 1]
    assert "ddpguard report" in res.stderr  # how to render it
    if case in ("uneven_tail", "mismatch_before_training"):
        # Proof: stopped within 5 s of the last rank blocking (uneven_tail: rank 0, in the
        # all_reduce of a batch rank 1 never had; rank 1 ran out and left).
        blocked_at = max(float(s[0]) for r in rep["ranks"] for s in r["lanes"]
                         if s[2] == "collective")
        assert rep["created"] - blocked_at < 5.0, rep["created"] - blocked_at
    if case == "loader_worker_deadlock":
        # Each rank ended its own DataLoader workers: the launcher's last-resort sweep of
        # orphans found nothing (the conftest fixture checks that nothing at all is left).
        assert "left behind" not in res.stderr, res.stderr[-2000:]
    if case == "mismatch_before_training":
        # The real report renders: one lane per rank in the page, a trace for Perfetto.
        out = run_cli("report", str(sorted(tmp_path.glob("*.json"))[0]), "--out",
                      str(tmp_path / "r"), timeout=120)
        assert out.returncode == 0, out.stderr
        assert (tmp_path / "r.html").read_text().count('<g class="lane') == 2
        trace = json.loads((tmp_path / "r.trace.json").read_text())
        assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0, 1}


def test_crashed_rank_is_named_with_where_the_others_waited(tmp_path):
    res, took = run_case("crash", tmp_path)
    assert res.returncode in (1, 17) and took < 90, res.stderr[-3000:]
    assert ("ddpguard: rank 1 crashed: ValueError: bad record in shard 7 at "
            f"tests/guard/scripts/{line_of('bad record in shard 7')}") in res.stderr
    # The crashed rank lingers until the waiting rank has written the report.
    rep = _report(tmp_path)
    assert rep["diagnosis"]["cause"] == "crashed_rank" and rep["diagnosis"]["culprits"] == [1]
    assert "rank 0 waits in all_reduce #" in rep["reason"], rep["reason"]


def test_desync_is_named_instead_of_the_nonsense_error(tmp_path):
    # Rank 1 dies of "Invalid mt19937 state"; the guard names the desync behind it with both
    # ranks' entries and lines. Which exit code torchrun reports first (rank 1's 1, or rank 0's
    # 17 once its report is written) depends on timing; the explanation does not.
    res, took = run_case("desync_broadcast", tmp_path)
    assert res.returncode in (1, 17) and took < 90, res.stderr[-3000:]
    err = res.stderr
    assert "ddpguard: the real cause: collective #" in err, err[-3000:]
    assert "differs between ranks" in err and "5056 Byte" in err and "16 Float" in err
    assert f"tests/guard/scripts/{line_of('dist.broadcast(state, src=0)')}" in err
    assert f"tests/guard/scripts/{line_of('model(x[:8])  # DDP')}" in err


def test_killed_rank_survivor_says_where_it_waited(tmp_path):
    # torchrun's agent sees the dead worker (forkrun's parent, torch.multiprocessing, ends
    # the survivor at once: test_guard_launchers covers that launcher's report).
    res, took = run_case("sigkill", tmp_path, torchrun=True)
    assert res.returncode != 0 and took < 90
    assert "rank 1 (pid" in res.stderr and "SIGKILL" in res.stderr, res.stderr[-3000:]
    # Said by the survivor's guard, not by torchrun: where rank 0 was, and what it waited on.
    assert "ddpguard: rank 0 stopped at" in res.stderr, res.stderr[-3000:]
    assert "all_reduce #" in res.stderr and "rank 1 died" in res.stderr


def test_mismatched_sizes_gloo_aborts_and_the_survivor_names_it(tmp_path):
    # gloo itself aborts on a size mismatch; the guard names the dead rank and where the other
    # one was, instead of "Connection reset by peer" alone.
    res, _ = run_case("mismatch_sizes", tmp_path, torchrun=True)
    assert res.returncode != 0
    assert "SIGABRT" in res.stderr
    assert f"ddpguard: rank 1 stopped at tests/guard/scripts/{line_of('mismatch_sizes')}" \
        in res.stderr or "rank 0 died" in res.stderr, res.stderr[-3000:]
    # The aborted rank's own last line, from its fault log, not only the survivor's.
    assert "(Fatal Python error: Aborted) inside torch.distributed.all_reduce called at " \
        f"tests/guard/scripts/{line_of('torch.ones(4 if rank == 0 else 5)')}" in res.stderr, \
        res.stderr[-3000:]
    # Only the aborted rank's fault log stays (the survivor removed its empty one).
    faults = [p.name for p in tmp_path.glob("ddpguard-fault-*")]
    assert len(faults) == 1 and "-rank0-" in faults[0], faults


def test_fallback_without_flight_recorder_still_stops_a_deadlock(tmp_path):
    res, took = run_case("cond_barrier", tmp_path, DDPGUARD_LEDGER="0",
                         DDPGUARD_FALLBACK_DEADLOCK="3")
    assert res.returncode == 17, res.stderr[-3000:]
    rep = _report(tmp_path)
    assert rep["diagnosis"]["cause"] == "conditional_collective"
    assert "flight recorder unavailable" in rep["reason"]


def test_frozen_rank_is_stopped_when_others_wait(tmp_path):
    # SIGSTOP: the process exists, its sockets stay open, its guard cannot answer.
    res, took = run_case("frozen", tmp_path)
    assert res.returncode == 17, res.stderr[-3000:]
    rep = _report(tmp_path)
    assert rep["diagnosis"]["cause"] == "no_life" and rep["diagnosis"]["culprits"] == [1]
    assert "not answering" in json.dumps(rep["diagnosis"])


def test_hard_limit_stops_even_a_working_rank(tmp_path):
    res = run_cli("run", "--nproc-per-node", "2", "--stall-timeout", "2", SCRIPT, "--case",
                  "ckpt_barrier", "--dur", str(DUR), timeout=150,
                  env=child_env(DDPGUARD_REPORT_DIR=str(tmp_path), **SHORT))
    assert res.returncode == 17, res.stderr[-3000:]
    assert _report(tmp_path)["diagnosis"]["cause"] == "hard_limit"


def test_guard_alone_stops_on_a_dead_peer_without_torchrun(tmp_path):
    """Under srun nobody watches the ranks: rank 1 dies while a forked child keeps its sockets
    open, so gloo never notices; the guard on rank 0 must stop the job by itself."""
    from ddpguard.testing import RankFailure, run_ranks

    pidfile = tmp_path / "child.pid"
    try:
        with pytest.raises(RankFailure) as info:
            run_ranks(_die_holding_sockets, 2, args=(str(pidfile),), timeout=60,
                      env={"DDPGUARD_REPORT_DIR": str(tmp_path), "DDPGUARD_GRACE": "1"})
    finally:
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)  # our own grandchild
    text = str(info.value)
    assert "rank 0 was stopped by the hang guard (exit code 17" in text, text
    rep = _report(tmp_path)
    assert rep["diagnosis"]["cause"] == "crashed_rank" and rep["diagnosis"]["culprits"] == [1]
    assert "process" in rep["reason"] and "is gone" in rep["reason"]


def _die_holding_sockets(world, pidfile):
    import torch.distributed as dist

    if world.rank == 1:
        child = os.fork()
        if child == 0:  # keeps the inherited gloo sockets open, then leaves quietly
            time.sleep(40)
            os._exit(0)
        Path(pidfile).write_text(str(child))
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    return "unreachable"
