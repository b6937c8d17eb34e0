"""DDP046 a rank kind mixed up in a program nothing shows runs on more than one node.

```python
rank = dist.get_rank()
torch.cuda.set_device(rank)        # right while every process is on one node
```

DDP025's device and group-rank forms (the global rank as a device index, the local rank as
`init_process_group(rank=)`), where no file of the program, the flagged one or one import away,
shows it runs on more than one node (no `NODE_RANK`, `SLURM_PROCID`, node-count option, product
with a count per node, remote `MASTER_ADDR`). On one node the global and the local rank are one
number, so the code works as shipped; it breaks the day the job spans a second node. Preview:
reviewers judged each such first finding debatable (the repositories ship one-node launches).
Fix: `LOCAL_RANK` for the device, `RANK` (or `dist.get_rank()`) for the process group.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.context import ModuleInfo
from ..analysis.node_evidence import several_nodes
from ..analysis.rank_mixups import WORLD, rank_mixups
from ..registry import Hit, rule


@rule('DDP046', 'rank-kind-mixup-one-node', 'info',
      'the global rank picks the GPU, or the local rank is the group rank, in a program '
      'nothing shows runs on more than one node',
      'LOCAL_RANK picks the device; RANK (dist.get_rank()) is the process-group rank',
      preview=True)
def ddp046(info: ModuleInfo) -> Iterator[Hit]:
    """Right on one node, wrong on the second: a latent mix-up, not a failure of the launch
    the program ships."""
    mixups = [m for m in rank_mixups(info) if m[1] != WORLD]
    if mixups and not several_nodes(info):
        for node, _kind, message in mixups:
            yield node, "DDP046", (f"{message} (nothing in the program shows it runs on more "
                                   "than one node: on one node the two ranks are one number)")


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)  # the global rank: right on one node only
"""

RULE = ddp046
