"""DDP009 SyncBatchNorm conversion after the DDP wrap.

`convert_sync_batchnorm` runs after the model was wrapped (in the same function). Pitfall in
[pitfalls.md](pitfalls.md). Fix: convert, then wrap. A model never converted is DDP021.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.buffers import batchnorm_wraps
from ..analysis.context import (
    ModuleInfo,
)
from ..registry import Hit, rule


@rule('DDP009', 'syncbatchnorm-after-wrap', 'warning',
      'convert_sync_batchnorm runs after the model was wrapped in DDP',
      'model = nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP(model)')
def ddp009(info: ModuleInfo) -> Iterator[Hit]:
    """The conversion builds new modules after DDP registered the old ones: convert, then
    wrap (docs/pitfalls.md)."""
    for w, converts in batchnorm_wraps(info):
        if converts and all(c.node.lineno > w.node.lineno for c in converts
                            if c.func is w.func) and any(c.func is w.func for c in converts):
            yield w.node, "DDP009", ("convert_sync_batchnorm runs after DDP wrapping: "
                                     "convert first, then wrap")


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)))
model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # after the wrap
"""

RULE = ddp009
