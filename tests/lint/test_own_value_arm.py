"""DDP004: a test on the rank's own loss whose one arm reaches a collective (corpus35v B108: a
"best checkpoint" save that waits in a barrier, entered only by the ranks whose own mean loss
improved). The message names the value the test reads, where it comes from, and the call that
waits."""

from __future__ import annotations

from pathlib import Path

from helpers import lint_paths

FIXTURE = Path(__file__).parent / "fixtures" / "DDP004_own_loss_collective_arm.py"


def _messages() -> dict[int, str]:
    return {f.line: f.message for f in lint_paths([FIXTURE]) if f.code == "DDP004"}


def test_the_message_names_the_kept_losses_and_the_waiting_call() -> None:
    text = FIXTURE.read_text().splitlines()
    line = next(k for k, s in enumerate(text, 1) if "if avg_loss < best_loss:  # expect" in s)
    msg = _messages()[line]
    assert "`avg_loss`, which follows `epoch_losses`" in msg
    assert "kept step by step" in msg
    assert f"`save_checkpoint` at line {line + 2}" in msg
    assert "waits in a collective the others never join" in msg


def test_the_message_names_the_evaluated_value_not_the_best_so_far() -> None:
    text = FIXTURE.read_text().splitlines()
    line = next(k for k, s in enumerate(text, 1) if "if val_loss < best:  # expect" in s)
    msg = _messages()[line]
    assert msg.startswith("this test follows `val_loss`, which comes from evaluate()")
    assert "`best`" not in msg
