"""DDP028 nn.DataParallel over one device in a process-per-device program.

`nn.DataParallel(model, device_ids=[gpu])` in a module that runs under torch.distributed
(it forms a process group, shards with a DistributedSampler or wraps other models in DDP): one
process per GPU, each wrapping its copy in DataParallel over its own single GPU. DataParallel
synchronises nothing between processes, so no gradient is ever averaged: each rank trains its
own model on its own shard, and the checkpoint rank 0 saves has seen 1/world_size of the data.
This is the certain form of DDP014 (which, as a choice of strategy, stays off by default): a
single device leaves no single-process reading. Fix: `DistributedDataParallel(model,
device_ids=[gpu])`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import ModuleInfo, kwarg
from ..registry import Hit, rule

_NOT_TORCH = ("paddle", "mindspore", "jittor", "oneflow", "tensorflow", "mxnet")


@rule('DDP028', 'data-parallel-per-process', 'warning',
      'nn.DataParallel over one device in a program that runs one process per device',
      'wrap in DistributedDataParallel(model, device_ids=[gpu])')
def ddp028(info: ModuleInfo) -> Iterator[Hit]:
    if not info.distributed:
        return
    for rec in info.calls_named("DataParallel"):
        if (rec.qual or info.qualify(rec.node.func) or "").startswith(_NOT_TORCH):
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


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch
from torch.utils.data import DistributedSampler

sampler = DistributedSampler(train_set)
model = torch.nn.DataParallel(net.cuda(gpu), device_ids=[gpu])
"""

RULE = ddp028
