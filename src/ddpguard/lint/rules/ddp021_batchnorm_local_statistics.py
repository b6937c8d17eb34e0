"""DDP021 BatchNorm never converted to SyncBatchNorm.

A BatchNorm model wrapped in DDP without `convert_sync_batchnorm` anywhere: each rank normalizes
with its own batch statistics. A deliberate, common choice (torchvision's references make
SyncBatchNorm a flag) that matters when the per-rank batch is small, which the code rarely
shows: off by default. `--extend-select DDP021`.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.buffers import batchnorm_wraps
from ..analysis.context import (
    ModuleInfo,
)
from ..registry import Hit, rule


@rule('DDP021', 'batchnorm-local-statistics', 'info',
      'a BatchNorm model wrapped in DDP and never converted to SyncBatchNorm',
      'model = nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP(model), where the '
      'per-rank batch is small', default=False)
def ddp021(info: ModuleInfo) -> Iterator[Hit]:
    """Off by default: each rank normalizing with its own batch statistics is a deliberate,
    common choice (torchvision's references make SyncBatchNorm a flag); it matters when the
    per-rank batch is small, which the code rarely shows."""
    for w, converts in batchnorm_wraps(info):
        if not converts:
            yield w.node, "DDP021", ("model with BatchNorm wrapped in DDP without "
                                     "SyncBatchNorm: each rank normalizes with its own statistics")


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)))
"""

RULE = ddp021
