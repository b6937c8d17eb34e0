"""The hang guard end to end: real broken scripts on 2 gloo ranks through `ddpguard run`.

Each broken case must end within 60 s, non-zero, naming the cause; correct ones end 0 with the
same result as without the guard. The stall floor is lowered through the environment."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from helpers import child_env, run_cli

SCRIPT = "tests/guard_scripts/train.py"
pytestmark = pytest.mark.slow


def _run(case: str, tmp_path: Path, *extra: str, guard: bool = True):
    env = child_env(DDPGUARD_STALL_FLOOR="4", DDPGUARD_REPORT_DIR=str(tmp_path))
    args = ["run", "--nproc-per-node", "2", *([] if guard else ["--no-guard"]), SCRIPT,
            "--case", case, *extra]
    t0 = time.monotonic()
    res = run_cli(*args, timeout=90, env=env)
    return res, time.monotonic() - t0


BROKEN = [
    # case, expected cause text, expected where text
    ("uneven_tail", "ranks have different numbers of batches", "rank 0: 4, rank 1: 3"),
    ("collate_drop", "ranks have different numbers of batches",
     "rank 0 finished epoch 0 after 2 optimizer steps"),
    ("eval_rank0", "the DDP model ran forward on some ranks only", "train.py:91"),
    ("cond_barrier", "a collective inside a rank-conditional branch", "train.py:94"),
    ("slow_loader", "a data loader stalled", "rank 1 at tests/guard_scripts/train.py:40"),
]


@pytest.mark.parametrize("case, cause, where", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_script_is_diagnosed(case, cause, where, tmp_path):
    res, took = _run(case, tmp_path)
    assert res.returncode != 0, res.stderr[-3000:]
    assert took < 60, f"{case} took {took:.0f} s"
    assert f"likely cause: {cause}" in res.stderr, res.stderr[-4000:]
    assert where in res.stderr, res.stderr[-4000:]
    reports = sorted(tmp_path.glob("*.json"))
    assert reports, "no JSON report written"
    data = json.loads(reports[0].read_text())
    assert data["diagnosis"]["title"].startswith(cause)
    assert str(reports[0]) in res.stderr  # the path is printed
    # The report renders.
    out = run_cli("report", str(reports[0]), "--out", str(tmp_path / "r"), timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    page = (tmp_path / "r.html").read_text()
    assert cause in page and "data:image/png;base64," in page


def test_uneven_batches_stop_before_the_first_step(tmp_path):
    res, _ = _run("uneven_tail", tmp_path)
    data = json.loads(sorted(tmp_path.glob("*.json"))[0].read_text())
    assert all(r["hb"]["steps"] == 0 for r in data["ranks"])
    assert "ranks have different numbers of batches: rank 0: 4, rank 1: 3" in res.stderr


def test_crashed_rank_is_named_by_the_others(tmp_path):
    res, took = _run("crash", tmp_path)
    assert res.returncode != 0 and took < 60
    assert "ddpguard: rank 1 crashed: ValueError: bad record in shard 7" in res.stderr
    assert "rank 0 stopped: a peer failed first: rank 1 crashed" in res.stderr \
        or "rank 0 was stopped (SIGTERM) after another rank failed" in res.stderr


def test_sigkilled_rank_is_named(tmp_path):
    res, took = _run("sigkill", tmp_path)
    assert res.returncode != 0 and took < 60
    assert "rank 1" in res.stderr and "SIGKILL" in res.stderr, res.stderr[-3000:]


def test_missing_set_epoch_warns_once_and_succeeds(tmp_path):
    res, _ = _run("no_set_epoch", tmp_path, "--epochs", "3")
    assert res.returncode == 0, res.stderr[-3000:]
    text = res.stderr
    assert "without set_epoch()" in text and "train.py:76" in text
    # Once per rank, not once per epoch.
    assert text.count("without set_epoch()") == 2


def test_correct_script_same_result_with_and_without_guard(tmp_path):
    a, b = tmp_path / "guarded.pt", tmp_path / "plain.pt"
    res1, _ = _run("ok", tmp_path, "--out", str(a))
    res2, _ = _run("ok", tmp_path, "--out", str(b), guard=False)
    assert res1.returncode == 0, res1.stderr[-3000:]
    assert res2.returncode == 0, res2.stderr[-3000:]
    import torch

    assert torch.equal(torch.load(a), torch.load(b))
    assert not list(tmp_path.glob("*.json"))
