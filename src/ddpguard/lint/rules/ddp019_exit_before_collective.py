"""DDP019 exit-before-collective."""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.context import (
    ModuleInfo,
)
from ..analysis.divergence import divergences
from ..registry import At, Hit, rule


@rule("DDP019", "exit-before-collective", "warning",
      "one rank class can leave in good order (return, break, continue, sys.exit) where the "
      "others go on to a collective",
      "check the condition on every rank (or broadcast it) before anyone leaves")
def ddp019(info: ModuleInfo) -> Iterator[Hit]:
    """A `return` that only rank 0 takes, just before a broadcast: when it runs, the other
    ranks wait in the broadcast for a rank that is gone, and no launcher notices (the rank
    did not fail). A `raise` is DDP022's (issue 20, round 11)."""
    for d in divergences(info):
        if d.code == "DDP019":
            yield At(d.line), "DDP019", d.message


RULE = ddp019
