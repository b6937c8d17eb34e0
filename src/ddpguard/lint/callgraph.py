"""Who calls what, and which functions matter: the layer under the schedules.

`resolve` finds the one function a call runs (this file, or another file on the command line
through crossfile.Project); `interesting` marks the functions that reach a collective, a DDP
forward, a parameter call or a file write (directly or through calls), and `relevant` those
where a rank test guards such a thing or an exit: only their schedules are ever built.
"""

from __future__ import annotations

import ast

from .context import COLLECTIVE_EXACT, COLLECTIVE_PREFIXES, CallRec, Func, ModuleInfo, dotted


def is_collective(rec: CallRec) -> bool:
    if not (rec.last in COLLECTIVE_EXACT or rec.last.startswith(COLLECTIVE_PREFIXES)):
        return False
    return (rec.qual or "").startswith("torch.distributed.")


def params_of(fn: Func) -> set[str]:
    a = fn.args
    out = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
    if a.vararg:
        out.add(a.vararg.arg)
    if a.kwarg:
        out.add(a.kwarg.arg)
    return out


def is_generator(info: ModuleInfo, fn: Func) -> bool:
    return id(fn) in info.generators  # recorded by the walker


def resolve(info: ModuleInfo, rec: CallRec) -> tuple[ModuleInfo, Func] | None:
    """The one function a call runs: in this file (a method of the caller's class first), or
    in another file on the command line through the import that names it."""
    fns = info.local_callees(rec)
    if len(fns) > 1 and rec.func is not None and rec.func in info.func_class:
        mine = [f for f in fns if info.func_class.get(f) == info.func_class[rec.func]]
        fns = mine or fns
    if len(fns) == 1:
        return info, fns[0]
    if fns:
        return None
    project = info.project
    if project is None:
        return None
    qual = info.qualify(rec.node.func)
    if qual is None or "." not in qual:
        return None
    return project.find(qual, info)  # type: ignore[attr-defined]


WRITE_LASTS = {"save", "dump", "savez", "savez_compressed"}


def interesting(info: ModuleInfo) -> set[int]:
    """ids of the functions (0: the module's top level) that reach a collective, a DDP
    forward, a parameter call (when the module has a DDP model) or a file write, directly or
    through calls: only their schedules can differ or write; the rest are never built."""
    hit = info._memo.get(("interesting", 0))
    if hit is not None:
        return hit  # type: ignore[return-value]
    info._memo[("interesting", 0)] = out = set()  # cut cycles between modules
    ddp = info.ddp_names()
    edges: dict[int, set[int]] = {}
    info._memo[("edges", 0)] = edges
    remote: dict[int, list[tuple[ModuleInfo, Func]]] = {}
    info._memo[("remote", 0)] = remote
    # Functions where a rank test guards something that matters (a collective, a forward, a
    # call of this file's functions or another file's), or guards an exit: only there can
    # the classes part (a call both classes make is left to the callee's own comparison).
    relevant: set[int] = set(info.exit_splits)
    info._memo[("relevant", 0)] = relevant
    params: dict[int, set[str]] = {}
    cross = info.project is not None and getattr(info.project, "multi", False)
    # Cheap pre-tests on the callee's last name before any dotted-name work.
    ddp_lasts = {n.rsplit(".", 1)[-1] for n in ddp} | {"forward"} if ddp else set()
    for rec in info.calls:
        key = id(rec.func) if rec.func is not None else 0
        last = rec.last
        event = is_collective(rec)
        if event or last in WRITE_LASTS:
            out.add(key)
            continue_ = True
        else:
            continue_ = False
        f = rec.node.func
        if not continue_ and ddp and (last in ddp_lasts or (
                rec.func is not None and isinstance(f, ast.Name))):
            d = dotted(f.value) if isinstance(f, ast.Attribute) and f.attr == "forward" \
                else dotted(f)
            if d is not None and rec.func is not None and key not in params:
                params[key] = params_of(rec.func) - {"self", "cls"}
            if d is not None and (d in ddp or d in params.get(key, ())):
                out.add(key)
                event = continue_ = True
        if not continue_ and last in info.funcs:
            callees = info.local_callees(rec)
            if callees:
                edges.setdefault(key, set()).update(id(fn) for fn in callees)
                event = continue_ = True
                if any(id(fn) in info.split_funcs and is_generator(info, fn) for fn in callees):
                    relevant.add(key)  # `with leader_first(rank):` around this code
        if not continue_ and cross and isinstance(f, ast.Name | ast.Attribute):
            head = f.id if isinstance(f, ast.Name) else (dotted(f) or ".").split(".")[0]
            target = resolve(info, rec) if head in info.aliases else None
            if target is not None and id(target[1]) in interesting(target[0]):
                out.add(key)
                remote.setdefault(key, []).append(target)
                event = True
        if event and rec.guard:
            relevant.add(key)
    changed = True
    while changed:
        changed = False
        for key, targets in edges.items():
            if key not in out and targets & out:
                out.add(key)
                changed = True
    return out


def has_split(info: ModuleInfo, func: Func | None) -> bool:
    """`func`'s own rank tests can make its classes part: it reaches something that matters
    and a rank test guards some of it (or an exit). Read from the walker's records: no
    schedule is built for the others."""
    key = id(func) if func is not None else 0
    keep = interesting(info)
    relevant: set[int] = info._memo[("relevant", 0)]  # type: ignore[assignment]
    return key in keep and key in relevant
