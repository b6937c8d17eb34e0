"""DDP044 the loss divided by the world size before a DDP backward (fixture:
tests/lint/fixtures/DDP044_loss_divided_by_world_size.py)."""

from __future__ import annotations

from helpers import HEAD_DDP, lint_with_defaults

from ddpguard.lint import RULES, Selection

ONLY = Selection(select=("DDP044",))

STEP = (
    "def fit(model, loader, optimizer, criterion):\n"
    "    model = DDP(model)\n"
    "    for x, y in loader:\n"
    "        loss = criterion(model(x), y) / dist.get_world_size()\n"
    "        loss.backward()\n"
    "{sync}"
    "        optimizer.step()\n")


def test_the_message_names_the_division_and_the_backward() -> None:
    [f] = [f for f in lint_with_defaults(HEAD_DDP + STEP.format(sync=""), "t.py", ONLY)
           if f.code == "DDP044"]
    assert "(`criterion(model(x), y) / dist.get_world_size()`, line 9) before its backward " \
           "at line 10" in f.message


def test_gradients_summed_by_hand_want_the_division() -> None:
    # A sum over the ranks (all_reduce of each p.grad) is what a divided loss turns into a
    # mean: no DDP average to double.
    sync = ("        for p in model.parameters():\n"
            "            dist.all_reduce(p.grad)\n")
    assert [f for f in lint_with_defaults(HEAD_DDP + STEP.format(sync=sync), "t.py", ONLY)
            if f.code == "DDP044"] == []


def test_in_preview() -> None:
    # Its first tuning findings: one debatable (AdamW), one false (a branch with world size 1).
    assert RULES["DDP044"].preview


def test_a_loss_of_another_function_is_another_name() -> None:
    src = HEAD_DDP + (
        "model = DDP(net)\n"
        "loss = model(x).sum()\n"
        "def shown(loss):\n"
        "    loss = loss.detach() / dist.get_world_size()\n"
        "    return loss\n"
        "print(shown(loss))\n"
        "loss.backward()\n")
    assert [f for f in lint_with_defaults(src, "t.py", ONLY) if f.code == "DDP044"] == []
