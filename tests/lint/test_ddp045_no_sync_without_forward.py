"""DDP045 `no_sync()` around the backward alone (its fixture is
tests/lint/fixtures/DDP045_no_sync_without_forward.py)."""

from __future__ import annotations

from helpers import HEAD_DDP, lint_with_defaults


def test_the_message_names_the_backwards_line_not_the_blocks_first() -> None:
    # rl-llm-grpo-ppo (corpus35z, first contact): `loss = loss / accum` opens the block and
    # the backward is the line after it
    src = HEAD_DDP + (
        "model = DDP(net)\n"
        "loss = model(x).sum()\n"
        "with model.no_sync():\n"
        "    loss = loss / 4\n"
        "    loss.backward()\n")
    [f] = lint_with_defaults(src, "t.py")
    assert f.code == "DDP045" and "holds only the backward (line 10)" in f.message
