"""Does a call reach a collective, through the project's own code at any depth: this file's
functions and methods, another file's through its import, and the methods of an object built
from a class of another file (`meter = AverageMeterDDP()` then `meter.update(v)`, whose
`update` all-reduces). Memoised per function; a cycle counts as no collective."""

from __future__ import annotations

import ast

from .callgraph import calls_by_func, resolve
from .context import CallRec, Func, ModuleInfo, is_collective


def reaches_collective(info: ModuleInfo, rec: CallRec, also: frozenset[str] = frozenset(),
                       skip: frozenset[str] = frozenset()) -> bool:
    """`also`: names that count as well (`backward`, `step`: DDP's all-reduce, the step);
    `skip`: collectives that do not count (`barrier`, which combines no values)."""
    if is_collective(rec) and rec.last not in skip or rec.last in also:
        return True
    for m, fn in _callees(info, rec):
        key = ("reaches_collective", id(fn), also, skip)
        hit = m._memo.get(key)
        if hit is None:
            m._memo[key] = False  # a recursive call inside finds no collective by itself
            hit = m._memo[key] = any(reaches_collective(m, r, also, skip)
                                     for r in calls_by_func(m).get(id(fn), ()))
        if hit:
            return True
    return False


def _callees(info: ModuleInfo, rec: CallRec) -> list[tuple[ModuleInfo, Func]]:
    own = info.local_callees(rec)
    if own:
        return [(info, f) for f in own]
    f = rec.node.func
    if type(f) is ast.Name and f.id in info.classes:
        # `Processor(arg)`: building one runs its `__init__` (a DDP wrap inside)
        return [(info, fn) for fn in info.funcs.get("__init__", [])
                if info.func_class.get(fn) == f.id]
    got = resolve(info, rec)
    if got is not None:
        return [got]
    f = rec.node.func
    fs = info.file_set
    if type(f) is not ast.Attribute or type(f.value) is not ast.Name or fs is None \
            or not getattr(fs, "multi", False):
        return []
    out: list[tuple[ModuleInfo, Func]] = []
    for _, v in info.assigns.get(f.value.id, [])[:3]:
        qual = info.qualify(v.func) if isinstance(v, ast.Call) else None
        if not qual or "." not in qual:
            continue
        module, _, cls = qual.rpartition(".")
        for m in fs._modules(module, info):  # type: ignore[attr-defined]
            if cls in m.classes:
                out.extend((m, fn) for fn in m.funcs.get(f.attr, [])
                           if m.func_class.get(fn) == cls)
    return out
