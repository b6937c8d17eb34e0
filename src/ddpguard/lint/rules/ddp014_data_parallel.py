"""DDP014 nn.DataParallel.

DataParallel as the multi-GPU strategy: one process drives every GPU from threads bound by the
GIL, replicates the model and gathers outputs on the first GPU each step; markedly slower than
DDP (it is not deprecated and emits no warning). Not reported in a script that also wraps in
DDP: there DataParallel is the single-process fallback. Pitfall in [pitfalls.md](pitfalls.md).
Fix: DistributedDataParallel, one process per device. Off by default: 0 true in 8 findings on
real code (a strategy, not a bug). `--extend-select DDP014`.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.context import (
    ModuleInfo,
)
from ..registry import Hit, rule


@rule('DDP014', 'data-parallel', 'warning',
      'nn.DataParallel as the multi-GPU strategy (one GIL-bound process, slower than DDP)',
      'use DistributedDataParallel with one process per device', default=False)
def ddp014(info: ModuleInfo) -> Iterator[Hit]:
    """A choice of strategy, not a bug: off by default (0 true
    in 8 findings on real code: fallbacks of DDP scripts, other frameworks' wrappers)."""
    # In a script that also wraps in DDP, DataParallel is the single-process fallback branch
    # (pytorch/examples' imagenet, yolov5): a deliberate choice, not a finding.
    if info.wraps_ddp:
        return
    for rec in info.calls:
        # torch's nn.DataParallel only: paddle.DataParallel is one process per device.
        if rec.last == "DataParallel" and not (rec.qual or info.qualify(rec.node.func) or
                                               "").startswith(_NOT_TORCH):
            yield rec.node, "DDP014", (
                "nn.DataParallel runs every GPU from one process: threads bound by the GIL, "
                "the model replicated and outputs gathered on the first GPU each step, "
                "markedly slower than DistributedDataParallel")


_NOT_TORCH = ("paddle", "mindspore", "jittor", "oneflow", "tensorflow", "mxnet")


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
model = torch.nn.DataParallel(net)
"""

RULE = ddp014
