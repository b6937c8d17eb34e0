"""DDP026 a collective of the program's own inside DDP's join (its fixture is
tests/lint/fixtures/DDP026_collective_under_join.py)."""

from __future__ import annotations

from helpers import HEAD_DIST, lint_with_defaults

from ddpguard.lint import RULES


def test_one_finding_per_block_and_collective() -> None:
    src = HEAD_DIST + (
        "def train(model, loader, acc):\n"
        "    with model.join():\n"
        "        for batch in loader:\n"
        "            model(batch).sum().backward()\n"
        "            dist.all_reduce(acc)\n"
        "            dist.all_reduce(acc)\n"
        "            dist.barrier()\n")
    got = [(f.code, f.line - HEAD_DIST.count("\n")) for f in lint_with_defaults(src, "t.py")]
    assert got == [("DDP026", 5), ("DDP026", 7)]


def test_on_by_default() -> None:
    assert RULES["DDP026"].default and not RULES["DDP026"].preview
