"""DDP045 `no_sync()` holds the backward but not the forward.

```python
for step, batch in enumerate(loader):
    loss = model(batch).mean() / accum          # forward: outside no_sync
    if (step + 1) % accum != 0:
        with model.no_sync():
            loss.backward()                      # all-reduces anyway
    else:
        loss.backward()
        optimizer.step()
```

DDP decides in its forward whether the backward that follows all-reduces: the forward reads the
flag `no_sync()` clears and arms the reducer. A forward run before the block has armed it
already, so the backward inside the block all-reduces every gradient bucket as if the block
were not there: the accumulation steps cost the communication they were meant to save (the
results are right; each micro-step all-reduces as a plain step would). PyTorch's documentation
of `no_sync` says the forward must be inside the context. Reported where the block holds a
backward (`loss.backward()`, `scaler.scale(loss).backward()`) and nothing else but arithmetic
on the loss (`loss = loss / accum`): the loss came from a forward outside it. Also for a
context chosen before the block (`ctx = model.no_sync() if not last else nullcontext()`, then
`with ctx:`; `stack.enter_context(model.no_sync())`, then `with stack:`). Only for a DDP
wrapper (FSDP's `no_sync` is read at the backward and works this way): a name the files wrap in
DDP, or any receiver in a module that wraps in DDP, imports DDP's class or is handed a DDP
wrapper by another file of the project, and never names FSDP. Fix: move the forward (and the
loss) into the `with model.no_sync():` block.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import CallRec, ModuleInfo, dotted
from ..registry import Hit, rule


@rule('DDP045', 'no-sync-without-forward', 'warning',
      '`no_sync()` holds only the backward: DDP armed its all-reduce in the forward before the '
      'block, so the accumulation steps all-reduce anyway',
      'run the forward (and the loss) inside the `with model.no_sync():` block')
def ddp045(info: ModuleInfo) -> Iterator[Hit]:
    recs = info.calls_named("no_sync")
    if not recs:
        return
    wraps = info.wraps_ddp or any(q.endswith(".DistributedDataParallel")
                                  for q in info.aliases.values()) or \
        info.file_set is not None and bool(
            info.file_set.ddp_handed_in(info))  # type: ignore[attr-defined]
    if not wraps and not info.ddp_names():
        return
    wrapped = info.ddp_names()
    fsdp = any("FullyShardedDataParallel" in q or q.endswith(".FSDP") or q == "FSDP"
               for q in info.aliases.values()) or "FSDP" in info.aliases
    said: set[int] = set()
    for rec in recs:
        f = rec.node.func
        if not isinstance(f, ast.Attribute):
            continue
        owner = dotted(f.value)
        if owner is None or owner not in wrapped and (fsdp or not wraps):
            continue
        for block in _blocks(info, rec):
            if id(block) in said or not _backward_only(block.body):
                continue
            said.add(id(block))
            line = next(st.lineno for st in block.body if isinstance(st, ast.Expr))
            yield block, "DDP045", (
                f"`{owner}.no_sync()` holds only the backward (line {line}): "
                "DDP decides in its forward whether the next backward all-reduces, and the "
                "forward that made this loss ran before the block, with syncing on, so this "
                "backward all-reduces every gradient anyway and the accumulation saves no "
                "communication; run the forward inside the block")


def _blocks(info: ModuleInfo, rec: CallRec) -> list[ast.With]:
    """The `with` blocks `rec` (a `W.no_sync()` call) is the context of: directly, or through
    a name it was assigned to in the same function (`ctx = W.no_sync() if ... else
    nullcontext()`, then `with ctx:`; `stack.enter_context(W.no_sync())`, then `with stack:`)."""
    st = rec.stmt
    if isinstance(st, ast.With):
        return [st] if any(item.context_expr is rec.node for item in st.items) else []
    if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and isinstance(
            st.value.func, ast.Attribute) and st.value.func.attr == "enter_context" \
            and isinstance(st.value.func.value, ast.Name) and rec.node in st.value.args:
        name = st.value.func.value.id  # `stack.enter_context(W.no_sync())`, then `with stack:`
    elif isinstance(st, ast.Assign) and len(st.targets) == 1 \
            and isinstance(st.targets[0], ast.Name):
        name = st.targets[0].id
    else:
        return []
    scope = rec.func.body if rec.func is not None else info.tree.body
    return [w for top in scope for w in ast.walk(top) if isinstance(w, ast.With)
            and w.lineno > st.lineno and any(isinstance(i.context_expr, ast.Name)
                                             and i.context_expr.id == name for i in w.items)]


def _backward_only(body: list[ast.stmt]) -> bool:
    """The block runs a backward and, besides it, only arithmetic on names (`loss = loss /
    accum`): no call that could run the forward."""
    backward = False
    for st in body:
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) \
                and isinstance(st.value.func, ast.Attribute) and st.value.func.attr == "backward":
            backward = True
            inner = st.value.func.value
            calls = [n for n in ast.walk(inner) if isinstance(n, ast.Call)]
            # `scaler.scale(loss).backward()`: the scaler's call, no forward
            if any(not (isinstance(c.func, ast.Attribute) and c.func.attr == "scale")
                   for c in calls):
                return False
            continue
        if isinstance(st, ast.Assign | ast.AugAssign) and st.value is not None and not any(
                isinstance(n, ast.Call) for n in ast.walk(st.value)):
            continue
        return False
    return backward


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def fit(net, loader, optimizer, accum):
    dist.init_process_group("nccl")
    model = DDP(net)
    for step, (x, y) in enumerate(loader):
        loss = (model(x) - y).pow(2).mean() / accum
        if (step + 1) % accum != 0:
            with model.no_sync():
                loss.backward()
        else:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
"""

RULE = ddp045
