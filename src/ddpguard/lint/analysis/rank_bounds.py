"""A loop bound that some ranks alone move (DDP027's third form).

```python
start_epoch = 0
if dist.get_rank() == 0 and args.resume:
    start_epoch = torch.load(args.resume)["epoch"] + 1     # the resume, read on rank 0
for epoch in range(start_epoch, args.epochs):              # every rank
    train_one_epoch(model, loader, opt)                     # backward: DDP's all-reduce
```

Every rank binds the bound, but only the ranks that pass the test bind it again, so the ranks
run different numbers of turns of a loop whose every turn syncs: the ranks with turns left wait
in the all-reduce for peers that have finished. Read for plain names within one function, and
for `self.` attributes across the methods of one class (a `resume()` that moves
`self.start_epoch` on rank 0, a `train()` that loops from it). Silent when the bound is bound
again on every rank between the move and the loop (a broadcast's result), when a collective
is handed the bound, and for a loop under a rank test of its own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from .callgraph import calls_by_func
from .collective_reach import reaches_collective
from .context import Func, ModuleInfo, dotted, is_collective

_SYNC = frozenset({"backward"})
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@dataclass(frozen=True)
class MovedBound:
    name: str            # `start_epoch`, `self.start_epoch`
    test: ast.If         # the rank test whose arm moves it
    moved: int           # the line that moves it
    read: ast.expr       # the bound's read in the loop's header
    loop: ast.For | ast.While
    sync: str            # what every turn waits in, with its line


def moved_bounds(info: ModuleInfo) -> Iterator[MovedBound]:
    if not info.rank_ifs:
        return
    movable = _movable(info)
    if not movable:
        return  # no loop bound the module ever assigns: nothing to move (most files)
    for func, test in info.rank_ifs:
        moved = _moved(info, func, test)
        for name, line in sorted(moved.items()):
            if name not in movable:
                continue
            scopes = [func] if "." not in name else _class_methods(info, func)
            for scope in scopes:
                hit = _loop_on(info, scope, func, test, name, line)
                if hit is not None:
                    yield hit
                    break


def _movable(info: ModuleInfo) -> set[str]:
    """The names read in a loop's bounds (`range(...)`'s arguments, a `while` test), and the
    names those were assigned from (`epoch = self.start_epoch`), that the module assigns."""
    read = {d for rec in info.loops if isinstance(rec.node, ast.For | ast.While)
            for n in _bound_names(rec.node) if (d := dotted(n)) is not None}
    for name in list(read):
        for _, v in info.assigns.get(name, ()):
            if (d := dotted(v)) is not None:
                read.add(d)
    return {n for n in read if n in info.assigns}


def _moved(info: ModuleInfo, func: Func | None, test: ast.If) -> dict[str, int]:
    """The names and `self.` attributes the test's arm binds (not its `else`), each with its
    first line there; also the attributes a method of the same class binds when the arm calls
    it (`if self.verb: self.restore_checkpoint(path)`), at the line of the call."""
    out: dict[str, int] = {}
    other = {k for st in test.orelse for n in ast.walk(st) for k in _bound(n)}
    cls = info.func_class.get(func) if func is not None else None
    for st in test.body:
        for n in ast.walk(st):
            if isinstance(n, _SCOPES):
                continue
            for k in _bound(n):
                if k not in other and not _same_constant(info, func, test, n, k):
                    out.setdefault(k, n.lineno)  # type: ignore[attr-defined]
            if cls is not None and isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                    and isinstance(n.func.value, ast.Name) and n.func.value.id == "self":
                for m in info.funcs.get(n.func.attr, []):
                    if info.func_class.get(m) != cls or m is func:
                        continue
                    for k in {k for x in ast.walk(m) for k in _bound(x) if "." in k}:
                        if k not in other:
                            out.setdefault(k, n.lineno)
    return out


def _same_constant(info: ModuleInfo, func: Func | None, test: ast.If, n: ast.AST,
                   name: str) -> bool:
    """The arm binds the literal every rank was given before the test in the same scope
    (UWNR's `start_epoch = 0` on rank 0 after `start_epoch = 0` on every rank): no move."""
    if not (isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)):
        return False
    lo, hi = (func.lineno, test.lineno) if func is not None else (0, test.lineno)
    return any(lo <= line < hi and isinstance(v, ast.Constant) and v.value == n.value.value
               and type(v.value) is type(n.value.value)
               for line, v in info.assigns.get(name, ()))


def _bound(n: ast.AST) -> list[str]:
    if isinstance(n, ast.Assign):
        targets = n.targets
    elif isinstance(n, ast.AugAssign | ast.AnnAssign) and n.value is not None:
        targets = [n.target]
    else:
        return []
    out = []
    for t in targets:
        for x in (t.elts if isinstance(t, ast.Tuple) else [t]):
            d = dotted(x) if isinstance(x, ast.Name | ast.Attribute) else None
            if d is not None and (isinstance(x, ast.Name) or d.count(".") == 1
                                  and d.startswith("self.")):
                out.append(d)
    return out


def _class_methods(info: ModuleInfo, func: Func | None) -> list[Func]:
    cls = info.func_class.get(func) if func is not None else None
    if cls is None:
        return []
    return [f for f, c in info.func_class.items() if c == cls]


def _loop_on(info: ModuleInfo, scope: Func | None, func: Func | None, test: ast.If,
             name: str, line: int) -> MovedBound | None:
    body = scope.body if scope is not None else info.tree.body
    same = scope is func
    end = test.end_lineno or test.lineno
    if same and "." not in name and not _bound_before(body, name, test.lineno, scope):
        return None  # bound nowhere else: DDP027's NameError form
    # `epoch = self.start_epoch` then `while epoch < self.epochs:` reads the bound too
    aliases = [name, *(t.id for st in body for n in ast.walk(st)
                       if isinstance(n, ast.Assign) and dotted(n.value) == name
                       and (not same or n.lineno > end)
                       for t in n.targets if isinstance(t, ast.Name))]
    for loop in _loops(body):
        if same and loop.lineno <= end:
            continue
        read = next((r for a in aliases if (r := _bound_read(loop, a)) is not None), None)
        if read is None:
            continue  # (a loop under a rank test of its own has no unguarded sync: see below)
        if same and _rebound_between(info, body, name, end, loop.lineno):
            return None
        if not same and _rebound_between(info, body, name, 0, loop.lineno):
            continue
        if _handed_to_collective(info, name):
            return None
        sync = _turn_syncs(info, scope, loop)
        if sync:
            return MovedBound(name, test, line, read, loop, sync)
    return None


def _loops(body: list[ast.stmt]) -> Iterator[ast.For | ast.While]:
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        n = stack.pop()
        if isinstance(n, _SCOPES):
            continue
        if isinstance(n, ast.For | ast.While):
            yield n
        stack.extend(reversed(list(ast.iter_child_nodes(n))))


def _bound_names(loop: ast.For | ast.While) -> Iterator[ast.Name | ast.Attribute]:
    """The names a loop's bounds read: `range(...)`'s arguments of a `for`, a `while` test."""
    if isinstance(loop, ast.For):
        it = loop.iter
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
                and it.func.id == "range"):
            return
        where: list[ast.expr] = list(it.args)
    else:
        where = [loop.test]
    for part in where:
        for n in ast.walk(part):
            if isinstance(n, ast.Name | ast.Attribute) and isinstance(n.ctx, ast.Load):
                yield n


def _bound_read(loop: ast.For | ast.While, name: str) -> ast.expr | None:
    """`name` read in `range(...)` of a `for`, or in a `while` test."""
    return next((n for n in _bound_names(loop) if dotted(n) == name), None)


def _bound_before(body: list[ast.stmt], name: str, line: int, scope: Func | None) -> bool:
    if scope is not None and name in {a.arg for a in [*scope.args.posonlyargs,
                                                        *scope.args.args,
                                                        *scope.args.kwonlyargs]}:
        return True
    return any(name in _bound(n) and n.lineno < line  # type: ignore[attr-defined]
               for st in body for n in ast.walk(st))


def _rank_tested(info: ModuleInfo, body: list[ast.stmt], node: ast.stmt) -> bool:
    return any(info.rank_level(n.test) for n in _enclosing_ifs(body, node))


def _enclosing_ifs(body: list[ast.stmt], node: ast.stmt) -> Iterator[ast.If]:
    for st in body:
        for n in ast.walk(st):
            if isinstance(n, ast.If) and n is not node and \
                    n.lineno < node.lineno <= (n.end_lineno or 0) and \
                    any(node is x for s in n.body + n.orelse for x in ast.walk(s)):
                yield n


def _rebound_between(info: ModuleInfo, body: list[ast.stmt], name: str, start: int,
                     stop: int) -> bool:
    """`name` bound again, under no rank test, between the lines (a broadcast's result)."""
    for st in body:
        for n in ast.walk(st):
            if isinstance(n, _SCOPES):
                continue
            if start < getattr(n, "lineno", 0) < stop and name in _bound(n) \
                    and not _rank_tested(info, body, n):  # type: ignore[arg-type]
                return True
    return False


def _handed_to_collective(info: ModuleInfo, name: str) -> bool:
    for rec in info.calls:
        if rec.last.startswith(("broadcast", "all_reduce", "all_gather", "scatter")) and any(
                dotted(n) == name for a in [*rec.node.args, *(k.value for k in
                                                              rec.node.keywords)]
                for n in ast.walk(a) if isinstance(n, ast.Name | ast.Attribute)):
            return True
    return False


def _in_a_group(call: ast.Call) -> bool:
    """`broadcast(t, src=q, group=col_groups[c])`, `start_time(col_groups[c], rank)`: a call
    that names a process group of its own."""
    return any(k.arg == "group" for k in call.keywords) or any(
        "group" in (dotted(n) or "").lower() for a in [*call.args, *(k.value for k in
                                                                    call.keywords)]
        for n in ast.walk(a) if isinstance(n, ast.Name | ast.Attribute))


def _turn_syncs(info: ModuleInfo, scope: Func | None, loop: ast.For | ast.While) -> str:
    """What each turn of the loop waits in, through the project's code: a backward or a
    collective under no rank test ("" for none)."""
    end = loop.end_lineno or loop.lineno
    for rec in calls_by_func(info).get(id(scope) if scope is not None else 0, ()):
        if rec.guard or not loop.lineno < rec.node.lineno <= end:
            continue
        if _in_a_group(rec.node):
            continue  # ranks of one subgroup may share a count the others do not (a grid)
        if reaches_collective(info, rec, _SYNC):
            if rec.last == "backward":
                return f"the backward's all-reduce at line {rec.node.lineno}"
            if is_collective(rec):
                return f"{rec.last}() at line {rec.node.lineno}"
            return f"the all-reduce that {rec.last}() at line {rec.node.lineno} reaches"
    return ""
