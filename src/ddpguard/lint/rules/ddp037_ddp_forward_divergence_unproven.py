"""DDP037 a forward of the DDP model on some ranks only, where no buffer is visible.

```python
model = DDP(build_model(cfg), device_ids=[local_rank])   # a model built elsewhere
for batch in loader:
    model(batch).sum().backward()
    if dist.get_rank() == 0:
        model(sample)        # hangs if the model has a buffer; harmless if it has none
```

DDP006's forward on some rank classes only, in a program where no buffer is visible: no
BatchNorm and no `register_buffer` in any file linted with it (the model comes from another
package, a file not on the command line, or a config), or a wrap passes
`broadcast_buffers=False`. DDP broadcasts the module's buffers before such a forward and waits
for the other ranks, so it hangs exactly when the model has a buffer (a BatchNorm, running
statistics, a registered `position_ids`); with none it makes no collective at all. A preview
rule: on unseen code this form was wrong three times (models of LSTMs, convolutions and
Group/LayerNorm), so it runs only with `--preview` or when named. Fix: evaluate on every rank,
or call `model.module(...)` on rank 0.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.buffers import rank_forwards
from ..analysis.context import ModuleInfo
from ..registry import At, Hit, rule


@rule("DDP037", "ddp-forward-divergence-unproven", "warning",
      "forward of the DDP-wrapped model on some rank classes only, where no buffer is "
      "visible: it hangs if the model has a buffer",
      "evaluate on every rank, or call model.module(...) on rank 0",
      preview=True)
def ddp037(info: ModuleInfo) -> Iterator[Hit]:
    """The premise of the hang (a buffer to broadcast) is not visible in the files given."""
    found, proven = rank_forwards(info)
    if proven:
        return
    for d in found:
        yield At(d.line), "DDP037", d.message + (
            "; if the model has buffers (e.g. BatchNorm) and broadcast_buffers is on, DDP "
            "broadcasts them before this forward and waits for the other ranks, which make no "
            "matching broadcast: it hangs (no buffer is visible in the files linted)")


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(build_model(cfg))
for batch in loader:
    model(batch).sum().backward()
    if dist.get_rank() == 0:
        print(model(batch))  # hangs if the model has a buffer
"""

RULE = ddp037
