"""A job the guard stopped and torchrun restarted ends as its last attempt did (real 2-rank
jobs under `ddpguard run --max-restarts N`): exit 0 with one line per stopped attempt when it
recovered; the last attempt's block and exit 17 when the guard stopped that one too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ROOT, child_env, run_cli

pytestmark = pytest.mark.slow

JOB = str(ROOT / "tests" / "guard" / "scripts" / "restart_job.py")


def _run(tmp_path: Path, restarts: int, fail: str):
    reports = tmp_path / "reports"
    res = run_cli("run", "--nproc-per-node", "2", "--max-restarts", str(restarts), JOB,
                  "--fail", fail, timeout=240,
                  env=child_env(DDPGUARD_REPORT_DIR=str(reports)))
    return res, reports


def test_a_job_that_recovers_exits_0_with_one_line_per_stopped_attempt(tmp_path):
    # attempt 0: rank 1 crashes while rank 0 waits (the guard reports it); attempt 1: the
    # guard stops a rank-0-only collective; attempt 2 finishes.
    res, reports = _run(tmp_path, 2, "crash,stop")
    err = res.stderr
    assert res.returncode == 0, err[-4000:]
    assert res.stdout.count("FINISHED attempt=2") == 2, res.stdout[-2000:]
    assert "likely cause:" not in err, err[-4000:]  # no block: the job recovered
    for k in (0, 1):
        assert err.count(f"ddpguard run: attempt {k} stopped by the guard:") == 1, err[-4000:]
    assert "restarted (restart 2 of 2)" in err
    assert not list(reports.glob(".ddpguard-attempt-*"))  # the launcher leaves no markers
    attempts = sorted(json.loads(p.read_text())["attempt"] for p in reports.glob("*.json"))
    assert set(attempts) == {0, 1}, attempts  # the reports stay, each with its attempt


def test_a_job_stopped_again_on_its_last_attempt_exits_17_with_that_attempts_block(tmp_path):
    res, reports = _run(tmp_path, 1, "stop,stop")
    err = res.stderr
    assert res.returncode == 17, err[-4000:]
    assert err.count("ddpguard run: attempt 0 stopped by the guard:") == 1, err[-4000:]
    assert err.count("likely cause:") == 1, err[-4000:]
    block = err[err.rindex("=============== ddpguard:"):]
    assert "attempt 1)" in block.splitlines()[0], block[:400]
    assert "restart_job.py:24" in block, block[:3000]
    listing = run_cli("report", str(reports), timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert "attempt 0" in listing.stdout and "attempt 1" in listing.stdout, listing.stdout
