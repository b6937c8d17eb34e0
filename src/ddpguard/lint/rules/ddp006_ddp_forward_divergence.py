"""DDP006 DDP forward on some ranks only.

A divergence of the schedule at a forward through the wrapper (read from the same schedule as
DDP005). `model(x)` on the DDP wrapper under a rank test, `evaluate(model, ...)` with it (the
helper calls its parameter), or a helper that uses the module-level (or `self.`) wrapper and is
called only under a rank test (an `estimate_loss()` with gradients on under `if it %
eval_interval == 0 and master_process:`). The wrapper broadcasts its buffers before a forward
that follows a training step, and waits for the other ranks. Under `torch.no_grad()` (or
`inference_mode`, around the forward or around the call that leads to it) that broadcast happens
once and clears the flag that would make the class's own next training forward sync again, so it
pairs with the others' next forward and nothing hangs (run on two gloo ranks; nanoGPT's own
`estimate_loss` is such a case): then a finding is made only where the others go on to another
collective first (a barrier after rank 0's evaluation, seed 000's shape). Pitfall in
[pitfalls.md](pitfalls.md). Reported where the program visibly has buffers (a BatchNorm or a
`register_buffer` in any file linted with this one) and no wrap passes `broadcast_buffers=False`;
the same forward without visible buffers is DDP037's, a preview rule (it hangs only if the
model has a buffer; DDP006's three false first findings on unseen code were all that form).
apex's `DistributedDataParallel` (no collective in its forward) is not torch's. Under
`no_grad`, when every wrap passes `broadcast_buffers=` something other than a literal True (a
config, physicsnemo's manager), the forward's one collective is unproven: no finding. Nor under
`no_grad` when the wrapped model is built from a class of the file whose layers visibly keep no
buffers (`torch.nn` or PyG layers other than norms with running statistics, and the file's own
classes made of them; `lint/buffers.py`): a model passed in, a model-zoo call or another
package's layer may have buffers and keeps the finding. Fix: evaluate on all ranks and
all-reduce, or use `model.module(x)` on rank 0.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.buffers import rank_forwards
from ..analysis.context import (
    ModuleInfo,
)
from ..registry import At, Hit, rule


@rule("DDP006", "ddp-forward-divergence", "error",
      "forward of the DDP-wrapped model on some rank classes only (directly or in a helper), "
      "in a program that visibly has buffers (BatchNorm, register_buffer)",
      "evaluate on every rank, or call model.module(...) on rank 0")
def ddp006(info: ModuleInfo) -> Iterator[Hit]:
    """DDP broadcasts the module's buffers at the start of each forward and waits for every
    rank: a forward on rank 0 alone hangs when the model has a buffer (docs/pitfalls.md). The
    same forward where no buffer is visible is DDP037's (preview)."""
    found, proven = rank_forwards(info)
    if not proven:
        return
    for d in found:
        yield At(d.line), "DDP006", d.message + (
            "; DDP broadcasts the module's buffers (visible in the program) before this "
            "forward and waits for the other ranks, which make no matching broadcast: it hangs")


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
for batch in loader:
    model(batch).sum().backward()
    if dist.get_rank() == 0:
        print(model(batch))  # a forward on rank 0 alone: it waits for the others
"""

RULE = ddp006
