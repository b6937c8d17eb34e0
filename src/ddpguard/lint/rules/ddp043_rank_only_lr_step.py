"""DDP043 a learning-rate scheduler stepped on some ranks only.

```python
for epoch in range(epochs):
    train_one_epoch(ddp_model, loader, optimizer)
    if rank == 0:
        val_f1 = validate(ddp_model, val_loader)
        scheduler.step(val_f1)       # rank 0's learning rate moves, the others' stays
```

DDP averages the gradients, but each rank's optimizer applies them with its own learning rate:
once rank 0 alone has stepped its scheduler, the replicas take different steps and drift apart,
silently (no error, no hang; the model rank 0 saves is not the one the others train). Reported
where a scheduler (a name with `sched`, or one built from `torch.optim.lr_scheduler`) is
stepped under a rank test, in a program that wraps a model in DDP, and the same scheduler is
not stepped on every rank in that function. Fix: step the scheduler on every rank; for
`ReduceLROnPlateau`, feed it a metric every rank holds (all-reduced, or broadcast from rank 0).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import CallRec, ModuleInfo
from ..analysis.enclosing import inside_rank_test, only_under_rank_tests
from ..analysis.provenance import dotted
from ..registry import Hit, rule


@rule('DDP043', 'rank-only-lr-step', 'warning',
      'a learning-rate scheduler is stepped under a rank test: the ranks train with different '
      'learning rates and the replicas drift apart',
      'step the scheduler on every rank (a plateau scheduler with a metric every rank holds)')
def ddp043(info: ModuleInfo) -> Iterator[Hit]:
    wraps = info.wraps_ddp or info.file_set is not None and bool(
        info.file_set.ddp_handed_in(info))  # type: ignore[attr-defined]
    if not wraps:
        return
    steps = [r for r in info.calls_named("step") if _scheduler(info, r)]
    ranked = {id(r): "" for r in steps if r.guard and inside_rank_test(info, r)}
    for r in steps:
        if id(r) not in ranked and r.func is not None:
            site = only_under_rank_tests(info, r.func)
            if site is not None:
                ranked[id(r)] = (f" (it runs in {r.func.name}(), which is called only under a "
                                 f"rank test, line {site.node.lineno})")
    said: set[tuple[int, str | None]] = set()
    for rec in steps:
        if id(rec) not in ranked:
            continue
        owner = dotted(rec.node.func.value)  # type: ignore[attr-defined]
        if (id(rec.func), owner) in said:
            continue   # `if plateau: scheduler.step(loss) else: scheduler.step()`: one finding
        said.add((id(rec.func), owner))
        if any(r.func is rec.func and id(r) not in ranked
               and dotted(r.node.func.value) == owner for r in steps):  # type: ignore[attr-defined]
            continue
        yield rec.node, "DDP043", (
            f"`{owner}.step()` runs only on the ranks a rank test lets through{ranked[id(rec)]}: "
            "their learning rate moves and the other ranks' stays, so with the gradients DDP "
            "averages each rank still takes its own step and the replicas drift apart (what "
            "rank 0 saves is not what the others train); step the scheduler on every rank")


def _scheduler(info: ModuleInfo, rec: CallRec) -> bool:
    """`scheduler.step()`, `self.lr_sched.step(metric)`, or the step of a name built from
    `torch.optim.lr_scheduler` (`plateau = ReduceLROnPlateau(opt)`)."""
    f = rec.node.func
    if not isinstance(f, ast.Attribute):
        return False
    owner = dotted(f.value)
    if owner is None:
        return False
    last = owner.rsplit(".", 1)[-1].lower()
    if "sched" in last:
        return True
    return any(isinstance(v, ast.Call) and "lr_scheduler" in (info.qualify(v.func) or "")
               for _, v in info.assigns.get(owner, []))


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def fit(model, loader, optimizer, scheduler, epochs):
    model = DDP(model)
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        if dist.get_rank() == 0:
            scheduler.step()
"""

RULE = ddp043
