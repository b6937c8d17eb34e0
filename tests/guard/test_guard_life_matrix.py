"""Life of the whole rank, end to end: rank 0 works outside its training thread (a pool, a
subprocess, a worker thread, a trickling download) while rank 1 waits in barrier(); the guard
must leave the job running. A child that is stuck is no life: that job is stopped.

Runs tests/guard/scripts/life_scenarios.py through `ddpguard run` on 2 gloo ranks with shortened
settings (bench/guard.py runs the healthy cases at the defaults): the work lasts DUR seconds,
more than twice NO_LIFE, so a guard that did not see it would stop the job.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, child_env, guard_run, run_cli

SCRIPT = "tests/guard/scripts/life_scenarios.py"
DUR = 7.0
SHORT = {"DDPGUARD_NO_LIFE": "3", "DDPGUARD_NOTICE_AFTER": "1.5", "DDPGUARD_DUMP_WAIT": "2"}
pytestmark = pytest.mark.slow


def run_case(case: str, tmp_path: Path, dur: float = DUR, url: str = "",
             torchrun: bool = False):
    env = child_env(DDPGUARD_REPORT_DIR=str(tmp_path), **SHORT)
    t0 = time.monotonic()
    res = run_cli(*guard_run(torchrun=torchrun), SCRIPT, "--case", case, "--dur", str(dur),
                  "--url", url, timeout=150, env=env)
    return res, time.monotonic() - t0


class TrickleServer:
    """The script's --serve mode in a process of its own (its bytes are not rank 0's)."""

    def __init__(self, dur: float) -> None:
        self.proc = subprocess.Popen([sys.executable, str(ROOT / SCRIPT), "--serve", "--dur",
                                      str(dur)], stdout=subprocess.PIPE, text=True,
                                     env=child_env())
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("URL "), line
        self.url = line.split()[1]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# case -> the words the waiting rank's notice must use for rank 0's last sign of life
HEALTHY = {
    "pool": "work in its child processes",
    "subprocess": "work in its child processes",
    "thread_writes": "work on another of its threads",
    "http": "bytes moving on a socket",
}


# Phases that need nothing from outside run one after another in one job (one launch, not
# three); the trickling download needs its server.
JOBS = ["pool,subprocess,thread_writes", "http"]


@pytest.mark.parametrize("cases", JOBS)
def test_work_outside_the_training_thread_is_left_running(cases, tmp_path):
    server = TrickleServer(DUR) if cases == "http" else None
    try:
        res, took = run_case(cases, tmp_path, url=server.url if server else "")
    finally:
        if server is not None:
            server.close()
    assert res.returncode == 0, res.stderr[-4000:]
    phases = cases.split(",")
    for case in phases:
        assert f"rank 0: phase {case} done" in res.stdout, res.stdout[-2000:]
    for rank in (0, 1):
        assert f"rank {rank} done" in res.stdout, res.stdout[-2000:]
    assert took > DUR * len(phases)  # the work really lasted
    assert "stopped by the hang guard" not in res.stderr
    assert not list(tmp_path.glob("*.json")), "a report was written for a healthy job"
    # Rank 1 really waited, and the guard saw rank 0's work as the kind of life it is.
    notices = [ln for ln in res.stderr.splitlines() if "has waited" in ln]
    assert notices, res.stderr[-3000:]
    for case in phases:
        assert any("rank 0 is at tests/guard/scripts/life_scenarios.py" in n
                   and HEALTHY[case] in n for n in notices), (case, notices)


@pytest.mark.parametrize("case", ["child_deadlock", "child_sleeps"])
def test_a_stuck_child_is_no_life(case, tmp_path):
    # Under torchrun: torch.multiprocessing's parent waits up to 30 s for a rank whose
    # deadlocked child (forked from it) still holds the rank's sentinel pipe, after the
    # verdict (docs/guard.md, Limits).
    res, took = run_case(case, tmp_path, dur=3.0, torchrun=case == "child_deadlock")
    assert res.returncode == 17, (res.returncode, res.stderr[-4000:])
    assert took < 90, f"{case} took {took:.0f} s"
    reports = sorted(tmp_path.glob("*.json"))
    assert reports, res.stderr[-3000:]
    d = json.loads(reports[0].read_text())["diagnosis"]
    assert d["cause"] == "no_life" and d["culprits"] == [0], (d, res.stderr[-3000:])
    assert "rank 0 has shown no sign of life" in res.stderr, res.stderr[-3000:]
    # (rank 0 may print that its phase is done: stopping, the guard ends the stuck child.)


def test_a_busy_helper_does_not_hide_a_mismatch(tmp_path):
    # Rank 0's helper thread writes all along while rank 0 waits in barrier() and rank 1 in
    # all_reduce: waiting in a collective, rank 0 is blocked whatever its helper does, so the
    # mismatch is proven in seconds (were the helper life, nothing would ever stop this job).
    res, took = run_case("mismatch_busy_helper", tmp_path, dur=3.0)
    assert res.returncode == 17, (res.returncode, res.stderr[-4000:])
    assert took < 60, f"took {took:.0f} s"
    reports = sorted(tmp_path.glob("*.json"))
    assert reports, res.stderr[-3000:]
    rep = json.loads(reports[0].read_text())
    assert rep["diagnosis"]["cause"] in ("mismatch", "conditional_collective"), rep["diagnosis"]
    assert "barrier #" in json.dumps(rep) and "all_reduce #" in json.dumps(rep)
    # Proof: within 5 s of the last rank blocking.
    blocked_at = max(float(s[0]) for r in rep["ranks"] for s in r["lanes"]
                     if s[2] == "collective")
    assert rep["created"] - blocked_at < 5.0, rep["created"] - blocked_at
