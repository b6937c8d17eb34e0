"""A counter one rank class advances inside a function that hands it back:

```python
def validate(rank, model, loader, best, stale):
    loss = evaluate(model, loader)
    if rank == 0:
        if loss < best:
            best, stale = loss, 0
        else:
            stale += 1
    return best, stale

stale = 0
for step in range(steps):
    train_step(model, batch)                    # DDP's all-reduce
    best, stale = validate(rank, model, loader, best, stale)
    if stale > patience:                        # rank 0 alone can pass it
        break
```

The parameter is bound only in the arms of one rank test and returned; the caller passes its
own counter and takes it back. On the other ranks it keeps its first value, so the caller's
counter is an armed counter (armed_flags.py) with that arm's test, and a comparison of it is
decided there. Only a plain name of the caller, first bound to one integer constant, passed
for the parameter and assigned back from the same element of the result.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from .context import Func, ModuleInfo
from .provenance import test_level


@dataclass(frozen=True)
class _Handed:
    func: Func
    index: int          # the element of the returned tuple (0 for a single value)
    width: int          # how many elements the return has (1 for a single value)
    param: str
    cond: ast.expr      # what holds where the parameter is bound


def armed_returns(info: ModuleInfo) -> dict[str, int]:
    """Notes each caller's counter in `info.armed_counters`, `info.rank_names` and
    `info.armed_flags`; returns those not in `info.rank_names` before (the walk runs again)."""
    handed = _handed(info)
    if not handed:
        return {}
    new: dict[str, int] = {}
    for name, hs in handed.items():
        for h, rec in ((h, rec) for h in hs for rec in info.calls_named(name)):
            st = rec.stmt
            if not (isinstance(st, ast.Assign) and st.value is rec.node
                    and len(st.targets) == 1):
                continue
            tgt = st.targets[0]
            elts = tgt.elts if isinstance(tgt, ast.Tuple) else [tgt]
            if len(elts) != h.width or not isinstance(elts[h.index], ast.Name):
                continue
            var = elts[h.index].id  # type: ignore[attr-defined]
            if not _passed_back(rec.node, h, var):
                continue
            first = _first_value(info, rec.func, h.func, var, st)
            if first is None:
                continue
            info.armed_counters[var] = (h.cond, first)
            level = test_level(info, h.cond)
            if var not in info.rank_names:
                new[var] = level
            info.rank_names.setdefault(var, level)
            info.armed_flags[var] = (
                f"`{var}` comes back from {name}() at line {st.lineno}, which changes it only "
                f"where `{ast.unparse(h.cond)}` holds (line {h.cond.lineno}); the other ranks "
                f"keep its first value, {first}")
    return new


def _handed(info: ModuleInfo) -> dict[str, list[_Handed]]:
    """The functions of this file that return a parameter they bind only in one rank test's
    arm (the same arm at every binding), by name (one definition of the name)."""
    arms: dict[int, list[tuple[int, int, ast.expr]]] = {}
    funcs: dict[int, Func] = {}
    for func, s in info.rank_ifs:
        if func is None or not s.body or func in info.func_class:
            continue
        last = s.body[-1]
        arms.setdefault(id(func), []).append(
            (s.body[0].lineno, last.end_lineno or last.lineno, s.test))
        funcs[id(func)] = func
    out: dict[str, list[_Handed]] = {}
    for key, func in funcs.items():
        if len(info.funcs.get(func.name, [])) != 1:
            continue
        ret = func.body[-1] if func.body else None
        if not isinstance(ret, ast.Return) or ret.value is None:
            continue
        elts = ret.value.elts if isinstance(ret.value, ast.Tuple) else [ret.value]
        params = [a.arg for a in [*func.args.posonlyargs, *func.args.args]]
        for i, e in enumerate(elts):
            if not isinstance(e, ast.Name) or e.id not in params:
                continue
            lines = _bindings(func, e.id)
            held = {ast.dump(a[2]): a[2] for line in lines for a in arms[key]
                    if a[0] <= line <= a[1]}
            inside = all(any(a[0] <= line <= a[1] for a in arms[key]) for line in lines)
            if lines and inside and len(held) == 1:
                out.setdefault(func.name, []).append(
                    _Handed(func, i, len(elts), e.id, next(iter(held.values()))))
    return out


def _bindings(func: Func, name: str) -> list[int]:
    """The lines where `func` binds `name`: plain, augmented or tuple assignments only (any
    other store, a loop target or a `with`, makes it no counter: returns [0])."""
    lines: list[int] = []
    for n in ast.walk(func):
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store):
            lines.append(n.lineno)
    plain = {n.lineno for n in ast.walk(func) if isinstance(n, ast.Assign | ast.AugAssign)}
    return lines if all(line in plain for line in lines) else [0]


def _passed_back(call: ast.Call, h: _Handed, var: str) -> bool:
    """The call passes the caller's `var` for the parameter."""
    for k in call.keywords:
        if k.arg == h.param:
            return isinstance(k.value, ast.Name) and k.value.id == var
    params = [a.arg for a in [*h.func.args.posonlyargs, *h.func.args.args]]
    i = params.index(h.param)
    if any(isinstance(a, ast.Starred) for a in call.args[:i + 1]) or i >= len(call.args):
        return False
    a = call.args[i]
    return isinstance(a, ast.Name) and a.id == var


def _first_value(info: ModuleInfo, func: Func | None, callee: Func, var: str,
                 call_st: ast.Assign) -> int | None:
    """The one integer constant the caller binds `var` to, other than the call's result;
    None where another function of the file binds the name too (the rank tables are the
    file's: the name must mean one thing)."""
    if func is None:
        return None
    lo, hi = func.lineno, func.end_lineno or func.lineno
    c_lo, c_hi = callee.lineno, callee.end_lineno or callee.lineno
    entries = info.assigns.get(var, [])
    if any(not (lo <= line <= hi or c_lo <= line <= c_hi) for line, _ in entries):
        return None
    values = [v for line, v in entries if lo <= line <= hi and line != call_st.lineno]
    if len(values) != 1 or not isinstance(values[0], ast.Constant) \
            or type(values[0].value) is not int:
        return None
    return values[0].value
