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
[pitfalls.md](pitfalls.md). `error` when the module visibly has BatchNorm or `register_buffer`
(and `broadcast_buffers` is not False), `warning` otherwise (it hangs as soon as the model gains
a buffer). apex's `DistributedDataParallel` (no collective in its forward) is not torch's. Under
`no_grad`, when every wrap passes `broadcast_buffers=` something other than a literal True (a
config, physicsnemo's manager), the forward's one collective is unproven: no finding. Nor under
`no_grad` when the wrapped model is built from a class of the file whose layers visibly keep no
buffers (`torch.nn` or PyG layers other than norms with running statistics, and the file's own
classes made of them; `lint/buffers.py`): a model passed in, a model-zoo call or another
package's layer may have buffers and keeps the finding. Fix: evaluate on all ranks and
all-reduce, or use `model.module(x)` on rank 0.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.buffers import wrapped_model_has_no_buffers
from ..analysis.context import (
    ModuleInfo,
)
from ..analysis.divergence import divergences
from ..registry import At, Hit, rule


@rule("DDP006", "ddp-forward-divergence", "error",
      "forward of the DDP-wrapped model on some rank classes only (directly or in a helper); "
      "error when the module visibly has buffers (BatchNorm)",
      "evaluate on every rank, or call model.module(...) on rank 0")
def ddp006(info: ModuleInfo) -> Iterator[Hit]:
    """DDP broadcasts the module's buffers at the start of each forward and waits for every
    rank: a forward on rank 0 alone hangs as soon as the model has a buffer (docs/pitfalls.md)."""
    found = [d for d in divergences(info) if d.code == "DDP006"]
    if found and _buffers_maybe_unsynced(info):
        # Under no_grad a forward's only collective is the buffer broadcast; with
        # `broadcast_buffers` set from a config (modulus: False by default) that is unproven.
        found = [d for d in found if not d.no_grad]
    if found and all(d.no_grad for d in found) and not _visible_buffers(info) \
            and wrapped_model_has_no_buffers(info):
        # Under no_grad the buffer broadcast is the forward's one collective, and the model
        # is built, visibly, from layers without buffers.
        found = []
    if not found:
        return
    sev = "error" if _visible_buffers(info) and not any(
        isinstance(k.value, ast.Constant) and k.value.value is False
        for r in info.calls if r.last == "DistributedDataParallel" or r.last.endswith("_DDP")
        for k in r.node.keywords if k.arg == "broadcast_buffers") else "warning"
    tail = ("; DDP broadcasts the module's buffers (visible in this file) before this "
            "forward and waits for the other ranks, which make no matching broadcast: it hangs") \
        if sev == "error" else (
            "; if the model has buffers (e.g. BatchNorm) and broadcast_buffers is on, DDP "
            "broadcasts them before this forward and waits for the other ranks, which make no "
            "matching broadcast: it hangs")
    for d in found:
        yield At(d.line), "DDP006", d.message + tail, sev



def _visible_buffers(info: ModuleInfo) -> bool:
    """The module visibly holds buffers: a BatchNorm layer, or a `register_buffer` call."""
    return info.batchnorm or any(r.last == "register_buffer" for r in info.calls)

def _buffers_maybe_unsynced(info: ModuleInfo) -> bool:
    """Every DDP wrap of the module passes `broadcast_buffers=` something other than a
    literal True."""
    wraps = [r for r in info.calls if r.last == "DistributedDataParallel" or r.last == "DDP"]
    return bool(wraps) and all(any(
        k.arg == "broadcast_buffers" and not (isinstance(k.value, ast.Constant)
                                              and k.value.value is True)
        for k in r.node.keywords) for r in wraps)


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
