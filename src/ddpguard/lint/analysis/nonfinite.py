"""A loop's test of a non-finite loss (`if torch.isnan(loss): break`) that is the rank's own.

The loss comes from this rank's batch: one rank may meet a NaN the others do not, unless the
tested value went through a collective (or a helper that reduces it) before the test. DDP004
reads it.
"""

from __future__ import annotations

import ast

from .context import CallRec, Loop, ModuleInfo, is_collective

_NONFINITE = {"isnan", "isinf", "isfinite"}


_SHARED = ("reduce", "gather", "sync", "broadcast")


def local_nonfinite(info: ModuleInfo, loop: Loop, skip: ast.If) -> str | None:
    """`if torch.isnan(loss): break` (or `not math.isfinite(loss.item())`: continue) on a
    loss this rank computed from its own batch: the test is the rank's own, unlike a value
    that went through a collective or a helper that reduces it first (`reduce_mean(loss)`)
    before the test; then every rank decides alike (MoRec's NaN break)."""
    tested = [n for c in ast.walk(skip.test) if isinstance(c, ast.Call)
              and info.callee_last(c) in _NONFINITE for a in _tested_values(c)
              for n in ast.walk(a) if isinstance(n, ast.Name) and "loss" in n.id.lower()]
    if not tested:
        return None
    before = [r for r in info.calls if loop in r.loops and r.node.lineno < skip.lineno]
    read = {n.id for n in ast.walk(skip.test) if isinstance(n, ast.Name)}
    chain = _derived_from(loop, skip, read)
    if any(_agrees(info, r) and _reaches(r, chain) for r in before):
        return None
    return tested[0].id


def _tested_values(call: ast.Call) -> list[ast.expr]:
    """What a non-finite test reads: its arguments (`torch.isnan(loss)`), or the tensor whose
    method it is (`loss.isnan()`, `torch.logical_or(loss.isnan(), loss.isinf())`)."""
    if call.args or not isinstance(call.func, ast.Attribute):
        return list(call.args)
    return [call.func.value]


def _agrees(info: ModuleInfo, rec: CallRec) -> bool:
    """A collective or a reducing helper (`reduce_mean(loss)`) makes every rank test the same
    value; not `dist.reduce(loss, dst=0)`, nor a helper of this file whose only collectives
    are such reduces (SMDE's `reduce_loss`): only the destination holds the sum, the other
    ranks still test their own loss."""
    if is_collective(rec):
        return rec.last != "reduce"
    if not any(w in rec.last.lower() for w in _SHARED):
        return False
    fns = {id(f) for f in info.funcs.get(rec.last, [])}
    inner = [r for r in info.calls if r.func is not None and id(r.func) in fns
             and is_collective(r)]
    return not inner or any(r.last != "reduce" for r in inner)


def _derived_from(loop: Loop, skip: ast.If, names: set[str]) -> set[str]:
    """The tested names and every name they were computed from in the loop before the test
    (`losses = loss_dict["total_loss"]` reads `loss_dict`)."""
    assigns = [s for s in ast.walk(loop) if isinstance(s, ast.Assign | ast.AugAssign)
               and s.lineno < skip.lineno]
    chain = set(names)
    for _ in range(4):
        grew = False
        for st in assigns:
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            if any(isinstance(n, ast.Name) and n.id in chain
                   for t in targets for n in ast.walk(t)):
                for n in ast.walk(st.value):
                    if isinstance(n, ast.Name) and n.id not in chain:
                        chain.add(n.id)
                        grew = True
        if not grew:
            break
    return chain


def _reaches(rec: CallRec, chain: set[str]) -> bool:
    """The collective or reducing helper feeds the tested value: its result is bound to one of
    the names the test reads, or (its result dropped) it works in place on one of them. A
    reduction kept apart for logging (YOLOF's `loss_dict_reduced = reduce_dict(loss_dict)`
    beside a test of the rank's own `losses`) leaves the test this rank's own."""
    st = rec.stmt
    if isinstance(st, ast.Assign) and st.value is rec.node:
        return any(isinstance(n, ast.Name) and n.id in chain
                   for t in st.targets for n in ast.walk(t))
    if isinstance(st, ast.Expr) and st.value is rec.node:
        return any(isinstance(n, ast.Name) and n.id in chain
                   for a in (*rec.node.args, *(k.value for k in rec.node.keywords))
                   for n in ast.walk(a))
    return True
