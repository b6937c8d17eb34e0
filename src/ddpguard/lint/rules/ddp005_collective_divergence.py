"""DDP005 collective-divergence."""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.context import (
    ModuleInfo,
)
from ..analysis.divergence import divergences
from ..registry import At, Hit, rule


@rule("DDP005", "collective-divergence", "error",
      "two rank classes reach different collective sequences (a collective only some ranks "
      "call, or a different one on each side)",
      "call the same collectives, in the same order, on every rank (outside the rank branch)",
      preview=True)
def ddp005(info: ModuleInfo) -> Iterator[Hit]:
    """Every rank must call the same collectives in the same order; one that waits in a
    collective the others never reach waits until the NCCL timeout (docs/pitfalls.md).
    A preview rule since issue 20's twelfth round: each blind half showed a new shape of
    code whose ranks the text cannot tell apart (0 true, 6 false at first contact)."""
    for d in divergences(info):
        if d.code == "DDP005":
            yield At(d.line), "DDP005", d.message


RULE = ddp005
