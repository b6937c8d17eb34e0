"""`ddpguard run` on a correct script: the same result with and without the guard, and the
set_epoch warning. Broken and healthy programs are in test_guard_matrix.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import ROOT, child_env, run_cli

SCRIPT = "tests/guard/scripts/train.py"
pytestmark = pytest.mark.slow


def _line_of(snippet: str) -> int:
    """The line of `snippet` in the fixture, so no test is pinned to a line number."""
    lines = (ROOT / SCRIPT).read_text().splitlines()
    found = [i + 1 for i, text in enumerate(lines) if snippet in text]
    assert len(found) == 1, f"{snippet!r} found at {found}"
    return found[0]


def _run(case: str, tmp_path: Path, *extra: str, guard: bool = True):
    env = child_env(DDPGUARD_NO_LIFE="4", DDPGUARD_REPORT_DIR=str(tmp_path))
    args = ["run", "--nproc-per-node", "2", *([] if guard else ["--no-guard"]), SCRIPT,
            "--case", case, *extra]
    t0 = time.monotonic()
    res = run_cli(*args, timeout=90, env=env)
    return res, time.monotonic() - t0


def test_missing_set_epoch_warns_once_and_succeeds(tmp_path):
    res, _ = _run("no_set_epoch", tmp_path, "--epochs", "3")
    assert res.returncode == 0, res.stderr[-3000:]
    text = res.stderr
    line = _line_of("for step, batch in enumerate(loader):")
    assert "without set_epoch()" in text and f"train.py:{line}" in text
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
