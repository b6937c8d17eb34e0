"""What the walk learns about functions and flags beyond single calls: the functions that
return a rank test (known before the walk, so a call of one is a rank test wherever it sits),
flags set to constants in a rank test's arms, and the functions every call site of which is
rank-guarded (they run under that guard)."""

from __future__ import annotations

import ast

from .context import (
    CallRec,
    Func,
    ModuleInfo,
    dotted,
)
from .provenance import GLOBAL, LOCAL, rank_only

# Bound once: these run for every statement of every module.
_Constant, _Return = ast.Constant, ast.Return
_FunctionDef, _AsyncFunctionDef = ast.FunctionDef, ast.AsyncFunctionDef


def _flags_set_in_arms(info: ModuleInfo, s: ast.If, level: int) -> None:
    """`if opt.rank == 0: opt.log = True else: opt.log = False` (HybrIK's env.py): the flag
    is that test, as if written `opt.log = opt.rank == 0`, in this file and, as a dotted
    name, in the others on the command line."""
    for arm, negate in ((s.body, False), (s.orelse, True)):
        for st in arm:
            if type(st) is ast.Assign and type(st.value) is _Constant and \
                    isinstance(st.value.value, bool):
                truth = st.value.value != negate
                value: ast.expr = s.test if truth else ast.UnaryOp(ast.Not(), s.test)
                ast.copy_location(value, st)
                for tgt in st.targets:
                    name = dotted(tgt)
                    if name is not None:
                        info.assigns.setdefault(name, []).append((st.lineno, value))
                        info.rank_names[name] = level


def _rank_functions_first(info: ModuleInfo, body: list[ast.stmt]) -> None:
    """Module functions (and methods) that return a rank test, known before the walk: `main()`
    at the top may test `is_leader()` defined below it."""
    for s in body:
        if type(s) is ast.ClassDef:
            _rank_functions_first(info, s.body)
        elif (type(s) is _FunctionDef or type(s) is _AsyncFunctionDef) and s.body:
            last = s.body[-1]
            if type(last) is _Return and last.value is not None:
                level = info.rank_level(last.value)
                if level:
                    info.rank_funcs.setdefault(s.name, level)


def _guard_functions(info: ModuleInfo) -> None:
    """A function every call site of which is rank-guarded runs under that guard."""
    sites: dict[Func, list[CallRec]] = {}
    funcs = info.funcs
    for rec in info.calls:
        # info.local_callees(rec), inlined for the common case
        # (instance_methods answers [] unless the attribute names a function of this file)
        for fn in funcs.get(rec.callee, ()) if rec.callee else \
                info.instance_methods(rec) if rec.callee == "" and rec.last in funcs \
                and info.classes else ():
            sites.setdefault(fn, []).append(rec)
    for fns in info.funcs.values():
        for fn in fns:
            level = rank_only(fn)
            if level:
                info.guarded_funcs[fn] = level
    for _ in range(3):
        changed = False
        for fn, recs in sites.items():
            if fn in info.guarded_funcs:
                continue
            levels = [info.effective_guard(r) for r in recs]
            if all(levels):
                # One local-rank site is enough for every node's local rank 0 to run it.
                info.guarded_funcs[fn] = LOCAL if LOCAL in levels else GLOBAL
                changed = True
        if not changed:
            break
