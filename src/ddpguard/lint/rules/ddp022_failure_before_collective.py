"""DDP022 failure-before-collective."""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.context import (
    ModuleInfo,
)
from ..analysis.divergence import divergences
from ..registry import At, Hit, rule


@rule("DDP022", "failure-before-collective", "warning",
      "an assert or raise that only some rank classes reach, before a collective the others "
      "go on to",
      "check the condition on every rank (or broadcast it) before anyone can fail",
      default=False)
def ddp022(info: ModuleInfo) -> Iterator[Hit]:
    """An `assert` or `raise` that only rank 0 reaches, just before a broadcast: if it fires,
    the other ranks wait for a rank that is gone, unless the launcher ends the job (torchrun,
    torch.distributed.launch and mp.spawn stop every worker when one fails; srun without
    --kill-on-bad-exit does not). Off by default: on real code most such asserts are
    invariants that cannot fire (1 true in 7 on the tuning corpora of issue 20's sixth
    round), and a rank-0 `raise` under torchrun ends the job with its own error (issue 20,
    round 11: judged false on first contact; rounds 6-9: 2 debatable)."""
    for d in divergences(info):
        if d.code == "DDP022":
            yield At(d.line), "DDP022", d.message


RULE = ddp022
