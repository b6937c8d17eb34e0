"""The four broken programs whose report had the right facts and the wrong title, as real
2-rank gloo jobs through `ddpguard run` (tests/guard/scripts/align_scenarios.py): each must
be stopped with the title the ranks' aligned sequences show, its line, and its culprit. Each
job stops at its fault, so each case is a job of its own. The near twins of each title are in
tests/guard/test_guard_align.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ROOT, child_env, guard_run, run_cli

SCRIPT = "tests/guard/scripts/align_scenarios.py"
SHORT = {"DDPGUARD_NO_LIFE": "3", "DDPGUARD_DUMP_WAIT": "2", "DDPGUARD_DIGEST_INTERVAL": "1"}
pytestmark = pytest.mark.slow


def line_of(snippet: str) -> str:
    lines = (ROOT / SCRIPT).read_text().splitlines()
    found = [i + 1 for i, text in enumerate(lines) if snippet in text]
    assert len(found) == 1, (snippet, found)
    return f"{SCRIPT}:{found[0]}"


# case -> (cause, culprits, texts the printed block must hold)
CASES = {
    "skip_backward": ("skipped_backward", [1], [
        "Rank 1 skipped the backward of batch 11",
        "rank 1 is already in broadcast #",
        f"left the step at {line_of('continue  # a local check')}"]),
    "left_early": ("left_early", [1], [
        f"Rank 1 left its training loop early: its pass over the DataLoader iterated at "
        f"{line_of('for i, (xb, yb) in enumerate(loader)')} ended after 7 of 32 batches",
        line_of("dist.barrier()  # wait for the others")]),
    "object_rank0": ("conditional_collective", [0], [
        "Rank 0 issued broadcast #", line_of("dist.broadcast_object_list(meta, src=0)"),
        "rank 1 died inside its own collective"]),
    "flock": ("blocked_outside", [1], [
        "rank 1: blocked in fcntl.flock (no CPU for", line_of("rank 1 waits for the lock rank 0"),
        "rank 0 waits for it in "]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_title_comes_from_the_aligned_sequences(case, tmp_path):
    cause, culprits, texts = CASES[case]
    # The survivor's own alignment of a gloo abort: under torchrun (torch.multiprocessing
    # ends the survivor at once; the launcher's composed report is test_guard_launchers').
    res = run_cli(*guard_run(torchrun=case == "object_rank0"), SCRIPT, "--case", case,
                  timeout=120,
                  env=child_env(DDPGUARD_REPORT_DIR=str(tmp_path), **SHORT))
    err = res.stderr
    assert res.returncode == 17, (res.returncode, err[-4000:])
    reports = sorted(Path(tmp_path).glob("*.json"))
    assert reports, err[-3000:]
    d = json.loads(reports[0].read_text())["diagnosis"]
    assert d["cause"] == cause, (d["cause"], d["explanation"])
    assert d["culprits"] == culprits, d["culprits"]
    block = err[err.index("=============== ddpguard:"):]
    assert f"likely cause: {d['title']}" in block
    for text in texts:
        assert text in block, (text, block[:3000])
    if case == "flock":
        # Shown as blocked wherever the block says what rank 1 does, never as computing.
        assert "computing" not in block and "running Python code" not in block, block[:3000]
