"""DDP044 the loss divided by the world size before a DDP backward.

```python
model = DDP(model, device_ids=[rank])
for x, y in loader:
    loss = criterion(model(x), y) / world_size   # DDP already averages the gradients
    loss.backward()
    optimizer.step()
```

DDP's backward all-reduces the gradients and divides them by the world size: they are the
mean over the ranks already. Dividing the loss by the world size as well makes every gradient
1/world_size of what one process would compute, so the effective learning rate shrinks with
the number of GPUs, gradient clipping acts at the wrong scale and a run on 8 GPUs does not
match one on 1. Reported where the value that `.backward()` (or `scaler.scale(...).backward()`)
reads was assigned, in the same function, as something divided by the world size
(`dist.get_world_size()`, a name such as `world_size` or `num_gpus`), in a module that wraps a
model in DDP, and does not all-reduce gradients by hand. Fix: drop the division (scale the
learning rate, not the loss, if a sum over the ranks was meant).

In preview: its first two findings (tuning data, the seventeenth round) were one debatable (the
shipped optimiser is AdamW, which the scale barely moves) and one false (a CPU-only branch
where the world size is 1).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.callgraph import syncs_grads_by_hand
from ..analysis.context import Func, ModuleInfo
from ..analysis.enclosing import block_statements
from ..analysis.provenance import dotted
from ..analysis.world_size import is_world
from ..registry import Hit, rule


@rule('DDP044', 'loss-divided-by-world-size', 'warning',
      'the loss is divided by the world size before a DDP backward, which averages the '
      'gradients already: every gradient is 1/world_size of its value',
      'drop the division; DDP averages the gradients over the ranks', preview=True)
def ddp044(info: ModuleInfo) -> Iterator[Hit]:
    if not info.wraps_ddp:
        return
    aug = "/=" in info.spelled
    divided = {d for d, entries in info.assigns.items() if any(
        isinstance(v, ast.BinOp) and isinstance(v.op, ast.Div) and is_world(info, v.right)
        for _, v in entries)}
    if not divided and not aug or syncs_grads_by_hand(info):
        return
    for rec in info.calls_named("backward"):
        f = rec.node.func
        if not isinstance(f, ast.Attribute):
            continue
        receiver = f.value
        # `scaler.scale(loss).backward()`
        if isinstance(receiver, ast.Call) and info.callee_last(receiver) == "scale" \
                and receiver.args:
            receiver = receiver.args[0]
        name = dotted(receiver)
        if name is None or name not in divided and not aug:
            continue
        div = _divided_by_world(info, rec.func or info.tree, name, rec.node.lineno)
        if div is not None:
            yield div, "DDP044", (
                f"`{name}` is divided by the world size (`{ast.unparse(div)}`, line "
                f"{div.lineno}) before its backward at line {rec.node.lineno}, but DDP's "
                "backward averages the gradients over the ranks already: every gradient is "
                "1/world_size of its value (with SGD the step shrinks with the number of GPUs; "
                "with Adam the scale mostly cancels, but gradient clipping and weight decay "
                "act at the wrong scale); drop the division")


def _divided_by_world(info: ModuleInfo, fn: Func | ast.Module, name: str,
                      line: int) -> ast.BinOp | None:
    """The division by the world size in the last assignment to `name` before `line`."""
    before = [st for st in _assignments(info, fn).get(name, []) if st.lineno < line]
    if not before:
        return None
    last = max(before, key=lambda st: st.lineno)
    if isinstance(last, ast.AugAssign):
        if isinstance(last.op, ast.Div) and is_world(info, last.value):
            return ast.BinOp(left=last.target, op=ast.Div(), right=last.value,
                             lineno=last.lineno, col_offset=last.col_offset)
        return None
    v = last.value
    if isinstance(v, ast.BinOp) and isinstance(v.op, ast.Div) and is_world(info, v.right):
        return v
    return None


def _assignments(info: ModuleInfo, fn: Func | ast.Module
                 ) -> dict[str, list[ast.Assign | ast.AugAssign]]:
    """The assignments of a scope by target, once per scope (a step has several backwards)."""
    memo: dict[int, dict[str, list[ast.Assign | ast.AugAssign]]] = info._memo.setdefault(
        ("ddp044_assignments", 0), {})  # type: ignore[assignment]
    hit = memo.get(id(fn))
    if hit is None:
        hit = memo[id(fn)] = {}
        for st in block_statements(fn.body):
            if isinstance(st, ast.Assign | ast.AugAssign):
                for t in st.targets if isinstance(st, ast.Assign) else [st.target]:
                    if (d := dotted(t)) is not None:
                        hit.setdefault(d, []).append(st)
    return hit


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def fit(model, loader, optimizer, criterion):
    model = DDP(model)
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y) / dist.get_world_size()
        loss.backward()
        optimizer.step()
"""

RULE = ddp044
