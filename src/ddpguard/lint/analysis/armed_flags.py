"""Flags that one rank class computes: `stop = False` on every rank, then `if rank == 0:
stop = stopper.step(val_loss)`. A rank that never takes that arm keeps the constant, so a
later test of the flag (`if stop: break`) parts the classes as a rank test does: the flag is
read as `rank == 0 and stopper.step(val_loss)` (or, where the constant is true, `not rank == 0
or ...`). Only where the name is certain to hold nothing else: a plain name of one function
(not its parameter) or a `self` attribute of one class, bound only by plain assignments, every
one outside the rank test's arms a constant of one truth and every one inside no rank value
itself. A flag that is broadcast (`stop = flags[0]` after `broadcast_object_list(flags)`) is
assigned outside the arms and is no such flag."""

from __future__ import annotations

import ast
from typing import Any

from .context import Func, ModuleInfo, dotted
from .provenance import NONE, test_level, value_level

_Arm = tuple[int, int, bool, ast.expr]   # first line, last line, the `else` arm?, the test


def armed_flags(info: ModuleInfo) -> dict[str, int]:
    """Finds the flags (name -> level of the test), adds to each, in `info.assigns`, the
    value it holds as a rank test, and notes it in `info.rank_names` and `info.armed_flags`.
    Returns those not in `info.rank_names` before (the walk must run again to see their
    tests as rank tests)."""
    if not info.rank_ifs:
        return {}
    arms: dict[int, list[_Arm]] = {}   # id(function) -> its rank tests' arms
    stmts: dict[int, list[ast.stmt]] = {}
    funcs: dict[int, Func] = {}
    for func, s in info.rank_ifs:
        if func is None:
            continue
        for arm, negate in ((s.body, False), (s.orelse, True)):
            if arm:
                arms.setdefault(id(func), []).append(
                    (arm[0].lineno, arm[-1].end_lineno or arm[-1].lineno, negate, s.test))
                stmts.setdefault(id(func), []).extend(arm)
                funcs[id(func)] = func
    if not arms:
        return {}
    found: dict[str, list[tuple[ast.Assign | ast.AugAssign, list[_Arm], list[_Arm],
                                ast.AST]]] = {}
    seen: set[int] = set()
    for key, own in arms.items():
        func = funcs[key]
        for st in _assigns(stmts[key]):
            if id(st) in seen:
                continue
            seen.add(id(st))
            inside = [a for a in own if a[0] <= st.lineno <= a[1]]
            for tgt in st.targets if isinstance(st, ast.Assign) else [st.target]:
                name = dotted(tgt)
                scope = _scope(info, func, name) if name is not None else None
                if name is not None and scope is not None:
                    found.setdefault(name, []).append((st, inside, own, scope))
    new: dict[str, int] = {}
    view = _View(info, set(found))
    for name, sites in found.items():
        scope = sites[0][3]
        if any(site[3] is not scope for site in sites):
            continue
        truth = _initial(info, name, scope, [a for site in sites for a in site[2]], view)
        if truth is None or not any(type(site[0].value) is not ast.Constant
                                    or bool(site[0].value.value) != truth
                                    or type(site[0]) is ast.AugAssign for site in sites):
            continue
        counted = {id(site[0].target) for site in sites if type(site[0]) is ast.AugAssign}
        if not _tested(info, scope, name, bool(counted)) or \
                not _only_plain(scope, name, counted):
            continue
        for st, inside, _, _ in sites:
            conds = [_cond(a) for a in inside]
            cond = conds[0] if len(conds) == 1 else ast.BoolOp(ast.And(), conds)
            held: ast.expr = ast.BoolOp(ast.And(), [cond, st.value]) if not truth else \
                ast.BoolOp(ast.Or(), [ast.UnaryOp(ast.Not(), cond), st.value])
            ast.copy_location(held, st)
            info.assigns[name].append((st.lineno, held))
        level = test_level(info, sites[0][1][0][3])
        if name not in info.rank_names:
            new[name] = level
        info.rank_names.setdefault(name, level)
        first = sites[0]
        if counted:
            _note_counter(info, name, scope, sites)
        info.armed_flags[name] = (
            f"`{name}` is set only where `{ast.unparse(_cond(first[1][0]))}` (line "
            f"{first[0].lineno}); the other ranks keep its first value, "
            f"{_first_constant(info, name, scope, first[2])}")
    return new


def _scope(info: ModuleInfo, func: Func, name: str) -> ast.AST | None:
    """Where every binding of `name` must be: the function (a plain name, not its
    parameter), or the class of the method (`self.x`)."""
    if "." not in name:
        a = func.args
        params = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
        return None if name in params else func
    root, _, attr = name.partition(".")
    if root != "self" or "." in attr:
        return None
    cls = info.func_class.get(func)
    return info.classes.get(cls) if cls is not None else None


def _only_plain(scope: ast.AST, name: str, counted: set[int]) -> bool:
    """`name` is bound in `scope` only by plain assignments (no loop or `with` target,
    unpacking, walrus; no `+=` but the `counted` ones, in a rank test's arms)."""
    plain: set[int] = set(counted)
    stores: list[ast.AST] = []
    for n in ast.walk(scope):
        t = type(n)
        if t is ast.Assign:
            plain.update(id(x) for x in n.targets)  # type: ignore[attr-defined]
        elif t is ast.AnnAssign:
            plain.add(id(n.target))  # type: ignore[attr-defined]
        elif (t is ast.Name or t is ast.Attribute) and \
                type(n.ctx) is not ast.Load:  # type: ignore[attr-defined]
            stores.append(n)
        elif (t is ast.Global or t is ast.Nonlocal) and \
                name in n.names:  # type: ignore[attr-defined]
            return False
    return all(id(n) in plain for n in stores if dotted(n) == name)


def _note_counter(info: ModuleInfo, name: str, scope: ast.AST,
                  sites: list[tuple[ast.Assign | ast.AugAssign, list[_Arm], list[_Arm],
                                    ast.AST]]) -> None:
    """A counter every site of which is in the same rank arms, whose first value outside
    them is an integer: the ranks outside the arms hold that value, so a comparison of it
    with a constant is decided there (`self.bad >= 7` is false where `self.rank < 1` is)."""
    conds = {ast.dump(_cond(a)) for site in sites for a in site[1]}
    if len(conds) != 1 or any(len(site[1]) != 1 for site in sites):
        return
    lo, hi = scope.lineno, scope.end_lineno or scope.lineno  # type: ignore[attr-defined]
    arms = [a for site in sites for a in site[2]]
    firsts = {v.value for line, v in info.assigns.get(name, []) if lo <= line <= hi
              and type(v) is ast.Constant and not any(a[0] <= line <= a[1] for a in arms)}
    if len(firsts) == 1:
        first = firsts.pop()
        if type(first) is int:
            info.armed_counters[name] = (_cond(sites[0][1][0]), first)


def _cond(arm: _Arm) -> ast.expr:
    """What holds in the arm: the test, or its negation in the `else` arm."""
    return ast.UnaryOp(ast.Not(), arm[3]) if arm[2] else arm[3]


def _assigns(stmts: list[ast.stmt]) -> list[ast.Assign | ast.AugAssign]:
    """The plain and augmented assignments among `stmts` and the blocks they hold (not in
    nested definitions: another scope)."""
    out: list[ast.Assign | ast.AugAssign] = []
    todo = list(stmts)
    while todo:
        st = todo.pop()
        t = type(st)
        if t is ast.Assign or t is ast.AugAssign:
            out.append(st)  # type: ignore[arg-type]
        elif t in _BLOCKS:
            for field in ("body", "orelse", "finalbody"):
                todo.extend(getattr(st, field, ()))
            for h in getattr(st, "handlers", ()):
                todo.extend(h.body)
    return out


_BLOCKS = {ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try}


def _first_constant(info: ModuleInfo, name: str, scope: ast.AST, arms: list[_Arm]) -> str:
    lo, hi = scope.lineno, scope.end_lineno or scope.lineno  # type: ignore[attr-defined]
    return next((ast.unparse(v) for line, v in info.assigns.get(name, [])
                 if lo <= line <= hi and type(v) is ast.Constant
                 and not any(a[0] <= line <= a[1] for a in arms)), "")


def _tested(info: ModuleInfo, scope: ast.AST, name: str, counter: bool) -> bool:
    """`name` is a condition somewhere in `scope` (the class, for `self.x`): `if stop:`,
    `while not stop`, `if stop and ...:`, `if stop == True:`. A value one class computes but
    that is only compared (`best = min(best, v)`, `if v > best:`) is left alone. A counter
    one class advances (`self.bad += 1` under `if self.rank == 0:`) counts where it is
    compared with a constant and the comparison is tested or returned (`return self.bad >=
    patience`, corpus35g T150's shape)."""
    for n in ast.walk(scope):   # one walk for both readings
        t = type(n)
        if t in (ast.If, ast.While, ast.IfExp) and \
                name in truth_reads(n.test):  # type: ignore[attr-defined]
            return True
        if counter and t in (ast.If, ast.While, ast.Return) and _compares(n, name):
            return True
    return False


def _compares(stmt: ast.AST, name: str) -> bool:
    """`stmt`'s test (or returned value) is a comparison of `name` with a constant."""
    value = getattr(stmt, "value" if type(stmt) is ast.Return else "test", None)
    if type(value) is not ast.Compare or len(value.ops) != 1:
        return False
    sides = (value.left, value.comparators[0])
    return any(dotted(a) == name for a in sides) and any(
        type(b) is ast.Constant or (type(b) in (ast.Attribute, ast.Name) and dotted(b) != name)
        for b in sides)


def truth_reads(test: ast.expr) -> set[str]:
    """The names `test` reads for their truth: `stop`, `not stop`, each side of `and`/`or`,
    `stop == True`, `stop is False`."""
    n: Any = test
    t = type(n)
    if t is ast.Name or t is ast.Attribute:
        d = dotted(n)
        return {d} if d is not None else set()
    if t is ast.UnaryOp and type(n.op) is ast.Not:
        return truth_reads(n.operand)
    if t is ast.BoolOp:
        return {d for v in n.values for d in truth_reads(v)}
    if t is ast.Compare and len(n.ops) == 1 and \
            isinstance(n.ops[0], ast.Eq | ast.NotEq | ast.Is | ast.IsNot):
        right = n.comparators[0]
        if type(right) is ast.Constant and type(right.value) is bool:
            return truth_reads(n.left)
    return set()


def _initial(info: ModuleInfo, name: str, scope: ast.AST, arms: list[_Arm],
             view: _View) -> bool | None:
    """The truth of the constant every assignment of `name` outside the rank tests' arms
    gives it; None where one is no constant, the truths differ, there is none, or a value
    is a rank value already (a flag the walk reads otherwise)."""
    lo, hi = scope.lineno, scope.end_lineno or scope.lineno  # type: ignore[attr-defined]
    truths: set[bool] = set()
    for line, v in info.assigns.get(name, []):
        if not lo <= line <= hi:
            return None   # bound elsewhere in the file too: another binding, unknown here
        if value_level(view, v) != NONE:
            return None
        if any(a[0] <= line <= a[1] for a in arms):
            continue
        if type(v) is not ast.Constant:
            return None
        truths.add(bool(v.value))
    return truths.pop() if len(truths) == 1 else None


class _View:
    """The module's rank tables without the candidate flags (learnt on an earlier walk):
    `stop = val > best` is no rank value because `best` is another such flag."""

    def __init__(self, info: ModuleInfo, leave: set[str]) -> None:
        self.rank_names = {k: v for k, v in info.rank_names.items() if k not in leave} \
            if leave & info.rank_names.keys() else info.rank_names
        self.rank_funcs = info.rank_funcs
        self.callee_last = info.callee_last
