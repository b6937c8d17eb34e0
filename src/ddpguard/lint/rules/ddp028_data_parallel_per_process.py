"""DDP028 nn.DataParallel over one device in a process-per-device program.

`nn.DataParallel(model, device_ids=[gpu])` in a module that runs under torch.distributed
(it forms a process group, shards with a DistributedSampler or wraps other models in DDP): one
process per GPU, each wrapping its copy in DataParallel over its own single GPU. DataParallel
synchronises nothing between processes, so no gradient is ever averaged: each rank trains its
own model on its own shard, and the checkpoint rank 0 saves has seen 1/world_size of the data.
This is the certain form of DDP014 (which, as a choice of strategy, stays off by default): a
single device leaves no single-process reading. Not reported: DataParallel where no group is
formed: the other arm of the `if` that forms it, or the `else` of an `if` with the same test
(`if cfg.DISTRIBUTED: ... DDP(...) else: DataParallel(model, device_ids=[0])`). Fix:
`DistributedDataParallel(model, device_ids=[gpu])`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import CallRec, ModuleInfo, kwarg
from ..analysis.enclosing import enclosing
from ..registry import Hit, rule

_NOT_TORCH = ("paddle", "mindspore", "jittor", "oneflow", "tensorflow", "mxnet")


@rule('DDP028', 'data-parallel-per-process', 'warning',
      'nn.DataParallel over one device in a program that runs one process per device',
      'wrap in DistributedDataParallel(model, device_ids=[gpu])', preview=True)
def ddp028(info: ModuleInfo) -> Iterator[Hit]:
    if not info.distributed:
        return
    for rec in info.calls_named("DataParallel"):
        if (rec.qual or info.qualify(rec.node.func) or "").startswith(_NOT_TORCH) \
                or _single_process_arm(info, rec):
            continue
        ids = kwarg(rec.node, "device_ids")
        if ids is None and len(rec.node.args) > 1:
            ids = rec.node.args[1]
        if isinstance(ids, ast.List | ast.Tuple) and len(ids.elts) == 1 \
                and not isinstance(ids.elts[0], ast.Starred):
            yield rec.node, "DDP028", (
                f"nn.DataParallel over the one device {ast.unparse(ids.elts[0])} in a module "
                "that runs under torch.distributed: DataParallel averages nothing between "
                "processes, so each rank trains its own copy on its own shard")


def _single_process_arm(info: ModuleInfo, rec: CallRec) -> bool:
    """The call sits where no group is formed: in the `else` of an `if` with the test of one
    that forms it, that one or another (`if cfg.DISTRIBUTED: init_process_group(...)` ...
    `if cfg.DISTRIBUTED: DDP(...) else: DataParallel(...)`)."""
    tests: set[str] = set()
    for r in info.calls_named("init_process_group"):
        chain = enclosing(r.func, info.tree, r.stmt or r.node)
        path = [*(chain or []), r.stmt or r.node]
        tests |= {ast.dump(n.test) for i, n in enumerate(path[:-1])
                  if isinstance(n, ast.If) and path[i + 1] in n.body}
    chain = enclosing(rec.func, info.tree, rec.stmt or rec.node)
    path = [*(chain or []), rec.stmt or rec.node]
    return any(isinstance(n, ast.If) and path[i + 1] in n.orelse and ast.dump(n.test) in tests
               for i, n in enumerate(path[:-1]))


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch
from torch.utils.data import DistributedSampler

sampler = DistributedSampler(train_set)
model = torch.nn.DataParallel(net.cuda(gpu), device_ids=[gpu])
"""

RULE = ddp028
