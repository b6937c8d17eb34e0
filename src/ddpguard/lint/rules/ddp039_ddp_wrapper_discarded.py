"""DDP039 the DDP wrapper is built and thrown away.

```python
model = Net().to(local_rank)
DistributedDataParallel(model, device_ids=[local_rank])   # the wrapper is not kept
loss = criterion(model(x), y)                             # the bare module trains
```

`DistributedDataParallel(model)` returns the wrapper; it does not change `model`. A wrapper
nobody keeps registers its gradient hooks on the module's parameters, but its forward never
runs, so no backward pass ever starts its all-reduce: every rank trains its own replica on its
own shard, and what rank 0 saves is one rank's model. Nothing fails: the run is N single-GPU
runs that report as one. Reported where torch's `DistributedDataParallel(...)` (under any
alias) is a statement of its own, its result neither assigned, returned, passed on nor used.
Fix: `model = DistributedDataParallel(model, device_ids=[local_rank])`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import ModuleInfo
from ..registry import Hit, rule


@rule('DDP039', 'ddp-wrapper-discarded', 'error',
      'a DistributedDataParallel wrapper is built and not kept: every rank trains its own '
      'replica, no gradient is ever all-reduced',
      'keep the wrapper and train through it: model = DistributedDataParallel(model, ...)')
def ddp039(info: ModuleInfo) -> Iterator[Hit]:
    """Silently unsynchronised training: the bare module, not the wrapper, runs the forward."""
    if not info.wraps_ddp:
        return
    for rec in info.calls:
        st = rec.stmt
        # torch's class itself: a project helper named `..._DDP` may set the group up and
        # return nothing (`handle_DDP(rank)`)
        if isinstance(st, ast.Expr) and st.value is rec.node and info.is_ddp_call(rec.node) \
                and info.callee_last(rec.node) == "DistributedDataParallel":
            yield rec.node, "DDP039", (
                f"`{ast.unparse(rec.node.func)}(...)` builds the wrapper and throws it away: "
                "DDP does not change the module it wraps, so the forward and backward run on "
                "the bare module, no gradient is all-reduced, and every rank trains its own "
                "replica; keep it: `model = DistributedDataParallel(model, ...)`")


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch
from torch.nn.parallel import DistributedDataParallel


def build(net, local_rank):
    torch.distributed.init_process_group("nccl")
    model = net.to(local_rank)
    DistributedDataParallel(model, device_ids=[local_rank])
    return model
"""

RULE = ddp039
