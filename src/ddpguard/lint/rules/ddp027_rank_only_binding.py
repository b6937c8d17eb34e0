"""DDP027 a name bound under a rank test and read by every rank.

```python
if dist.get_rank() == 0:
    save_path = make_run_dir(args)
...
ckpt = torch.load(os.path.join(save_path, "last.th"))   # every rank
model = DDP(model)
```

Only the ranks that took the branch have the name; the others raise NameError (or
UnboundLocalError) where every rank reads it, while the ranks that have it go on into the
next collective (here the DDP constructor's broadcast) and wait there for peers that are gone.
Reported where the name is read outside any rank test, when nothing bound it on the other
ranks before (in the branch's `else`, earlier in the function, as a parameter) and a
collective, a DDP wrap or a training step follows the read in the same function (or in the
next turn of a loop around it: a writer made on rank 0 and used by every rank at the end of each
step). The same for a global bound only under a rank test at the module's top level (`if
local_rank == 0: writer_val = SummaryWriter(...)`, bound nowhere else in the module, not in
the `else`) and read with no rank test around it by a function that does not bind the name
itself, when a collective follows the read in that function, or follows a call of the
function that no rank test guards (`evaluate(...)` then `dist.barrier()`, or the next turn
of a loop around the call). Not past a rank-tested `continue` of the read's own turn (`if
rank > 0: continue`). A read
guarded again by the rank (`pbar if is_main else loader`, `if rank == 0: writer.add(...)`) is
fine. The same for a count every rank sets to 0 but only the rank-tested arm advances by a
constant (`cont = 0; if rank == 0: for b in val_loader: ...; cont += 1`), then divides by on
every rank (`loss / cont`): the other ranks raise ZeroDivisionError while the ranks that counted
go on to the next collective (later in the function, or in the next turn of the loop around
it: the next epoch's backward). Not where a test of the count guards the division (`if cont:`,
`x / cont if cont else 0`), the other arm advances it too, or the divisor is not the bare
count (`max(cont, 1)`). And a loop bound every rank binds but only the rank-tested arm binds
again (`start_epoch` read from a checkpoint on rank 0 alone), when every rank's loop runs from
it and each turn syncs (analysis/rank_bounds.py). Fix: bind the name on every rank (compute it
everywhere, or broadcast it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.bindings import bindings as _bindings
from ..analysis.bindings import names_bound as _names_bound
from ..analysis.bindings import names_of as _names_of
from ..analysis.bindings import params as _params
from ..analysis.callgraph import file_callers
from ..analysis.context import (
    COLLECTIVE_EXACT,
    COLLECTIVE_PREFIXES,
    MPI_COLLECTIVES,
    CallRec,
    Func,
    ModuleInfo,
    is_collective,
)
from ..analysis.enclosing import block_statements, next_wait
from ..analysis.group_order import before_group
from ..analysis.rank_bounds import moved_bounds
from ..registry import At, Hit, rule

_SCOPE_STOP = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
# The names of the calls every rank may wait in (see _follows), to look up, not scan for.
_FOLLOW_EXACT = {"backward", "DistributedDataParallel", *COLLECTIVE_EXACT, *MPI_COLLECTIVES}


@rule('DDP027', 'rank-only-binding', 'warning',
      'a name bound only under a rank test and read by every rank before a collective',
      'bind it on every rank (compute it everywhere, or broadcast it)', preview=True)
def ddp027(info: ModuleInfo) -> Iterator[Hit]:
    if not info.split_funcs:
        return
    if info.distributed:
        yield from _bindings_and_counts(info)
    # A trainer module the group's own set-up imports runs in the group too, whatever it
    # imports itself (its resume and its epoch loop may not spell torch.distributed).
    if info.distributed or (info.file_set is not None
                            and info.file_set.in_group(info)):  # type: ignore[attr-defined]
        for b in moved_bounds(info):
            yield b.read, "DDP027", (
                f"`{b.name}` is set on every rank but set again only where "
                f"`{ast.unparse(b.test.test)}` holds (line {b.moved}), and every rank's loop "
                f"at line {b.loop.lineno} runs from it: the ranks run different numbers of "
                f"turns, and those with turns left wait in {b.sync} for peers that have "
                f"finished")


def _bindings_and_counts(info: ModuleInfo) -> Iterator[Hit]:
    # Only a scope with a rank test and, on every rank, a collective somewhere can hang
    # this way: one pass over the calls finds the last such call of each function.
    last: dict[int, int] = {}
    split = info.split_funcs
    names = [n for n in info.call_lasts() if n in _FOLLOW_EXACT or n.endswith("_DDP")
             or n.startswith(COLLECTIVE_PREFIXES)]
    for rec in info.calls_named(*names) if names else ():
        key = id(rec.func) if rec.func is not None else 0
        if key in split and not rec.guard and _follows(info, rec):
            last[key] = max(last.get(key, 0), rec.node.lineno)
    scopes: dict[int, tuple[Func | None, list[ast.If]]] = {}
    for func, test in info.rank_ifs:  # the walk's rank tests, in source order
        key = id(func) if func is not None else 0
        if test.lineno < last.get(key, 0):
            scopes.setdefault(key, (func, []))[1].append(test)
    for func, ifs in scopes.values():
        yield from _scope(info, func, ifs)
    yield from _counters(info)
    yield from _module_globals(info)


def _module_globals(info: ModuleInfo) -> Iterator[Hit]:
    """A global bound only under a rank test at the module's top level (`if local_rank == 0:
    writer_val = SummaryWriter(...)`) and read by a function that every rank calls, with no
    rank test around the read (HiCForecast's `evaluate()`): the other ranks raise NameError
    there, while the ranks that have it go on to what follows the call or the read."""
    top = [t for f, t in info.rank_ifs if f is None]
    if not top:
        return
    mod = block_statements(info.tree.body)
    bound = _bindings(mod)
    cands: dict[str, ast.If] = {}
    for st in top:
        end = st.end_lineno or st.lineno
        for name in _names_bound(st.body) - _names_bound(st.orelse):
            if all(st.lineno <= line <= end for line in bound.get(name, [])) \
                    and not before_group(info, None, st):
                cands.setdefault(name, st)
    if not cands:
        return
    for fns in info.funcs.values():
        for fn in fns:
            free = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id in cands
                    and isinstance(n.ctx, ast.Load)}
            # a function defined in an arm of a rank test exists on those ranks alone
            if not free or any(x.lineno <= fn.lineno <= (x.end_lineno or 0) for x in top):
                continue
            stmts = block_statements(fn.body)
            local = set(_bindings(stmts)) | _params(fn)
            for name in sorted(free - local):
                read = _first_open_read(info, stmts, name, fn.lineno)
                if read is None:
                    continue
                follow = _next_wait(info, fn, stmts, read) or _after_calls(info, fn)
                if follow:
                    st = cands[name]
                    yield At(read.lineno, read.col_offset), "DDP027", (
                        f"`{name}` is bound only where `{ast.unparse(st.test)}` holds (line "
                        f"{st.lineno}, at the module's top level) but {fn.name}(), which every "
                        f"rank calls, reads it at line {read.lineno}: the other ranks raise "
                        f"NameError there while the ranks that have it go on to {follow} and "
                        f"wait for them")


def _after_calls(info: ModuleInfo, fn: Func) -> str:
    """What every rank waits in after a call of `fn` that no rank test guards (in its caller,
    or in the next turn of a loop around the call); "" where `fn` is called only under rank
    tests (a function only rank 0 calls, so that a chain of calls from one is reported
    nowhere either) or nothing follows."""
    for rec in file_callers(info).get(id(fn), []):
        if rec.guard:
            continue
        stmts = block_statements(rec.func.body if rec.func is not None else info.tree.body)
        follow = _next_wait(info, rec.func, stmts, rec.node)
        if follow:
            return f"{follow} (after the call of {fn.name}() at line {rec.node.lineno})"
    return ""


def _counters(info: ModuleInfo) -> Iterator[Hit]:
    """A count set to 0 on every rank, advanced only under a rank test and divided by on
    every rank (`cont = 0; if rank == 0: for ...: cont += 1` ... `loss / cont`): the other
    ranks divide by zero while the rank that counted goes on to the next collective."""
    seen: dict[int, list[ast.stmt]] = {}
    for func, test in info.rank_ifs:
        counted = _advanced(test.body) - _names_bound(test.orelse)
        if not counted:
            continue   # most rank tests count nothing: the function's statements wait
        key = id(func) if func is not None else 0
        if key not in seen:
            seen[key] = block_statements(func.body if func is not None else info.tree.body)
        stmts = seen[key]
        for name in sorted(counted):
            div = _zero_division(info, stmts, test, name)
            if div is None:
                continue
            follow = _next_wait(info, func, stmts, div)
            if follow:
                yield At(div.lineno, div.col_offset), "DDP027", (
                    f"`{name}` starts at 0 on every rank but only advances where "
                    f"`{ast.unparse(test.test)}` holds (line {test.lineno}): the other ranks "
                    f"divide by zero at line {div.lineno} (ZeroDivisionError) while the ranks "
                    f"that counted go on to {follow} and wait for them")


def _advanced(body: list[ast.stmt]) -> set[str]:
    """The names `body` advances by a constant (`cont += 1`)."""
    return {st.target.id for st in block_statements(body) if isinstance(st, ast.AugAssign)
            and isinstance(st.op, ast.Add) and isinstance(st.target, ast.Name)
            and isinstance(st.value, ast.Constant) and type(st.value.value) in (int, float)}


def _zero_division(info: ModuleInfo, stmts: list[ast.stmt], test: ast.If,
                   name: str) -> ast.BinOp | None:
    """The first `x / name` past the rank test, on every rank, when every binding of `name`
    before it is `name = 0` outside the test or a constant step inside it, and no test of
    `name` (`if cont:`, `x / cont if cont else 0`) or `try` stands around the division."""
    end = test.end_lineno or test.lineno
    inits = 0
    for st in stmts:
        inside = test.lineno <= st.lineno <= end
        if st.lineno > end:
            hit = None if _guarded(info, st, stmts) or _tests(stmts, st, name) else next(
                (n for part in _own_expressions(st) for n in ast.walk(part)
                 if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div | ast.FloorDiv
                                                            | ast.Mod)
                 and isinstance(n.right, ast.Name) and n.right.id == name), None)
            if hit is not None and not any(isinstance(x, ast.IfExp) and _reads(x.test, name)
                                           for x in ast.walk(st)):
                return hit if inits else None
        if name not in set(_names_of(st)):
            continue
        if inside and isinstance(st, ast.AugAssign):
            continue
        if st.lineno > end or inside or not _zeroes(st, name):
            return None
        inits += 1
    return None


def _zeroes(st: ast.stmt, name: str) -> bool:
    """`name = 0`, or `total, name = 0.0, 0`."""
    if not (isinstance(st, ast.Assign) and len(st.targets) == 1):
        return False
    t, v = st.targets[0], st.value
    if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) and len(t.elts) == len(v.elts):
        pairs = list(zip(t.elts, v.elts, strict=True))
    else:
        pairs = [(t, v)]
    return any(isinstance(a, ast.Name) and a.id == name for a, _ in pairs) and all(
        isinstance(b, ast.Constant) and b.value == 0 and type(b.value) in (int, float)
        for a, b in pairs if isinstance(a, ast.Name) and a.id == name)


def _reads(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _tests(stmts: list[ast.stmt], st: ast.stmt, name: str) -> bool:
    """An `if`/`while` on `name` holds `st`."""
    return any(isinstance(o, ast.If | ast.While) and o is not st and _reads(o.test, name)
               and o.lineno <= st.lineno <= (o.end_lineno or 0) for o in stmts)


def _next_wait(info: ModuleInfo, func: Func | None, stmts: list[ast.stmt],
               div: ast.expr) -> str:
    """What every rank waits in after the division (or the read): later in the function, or
    in the next turn of a loop around it, outermost first."""
    return next_wait(info, func, div.lineno, (
        loop for loop in stmts if isinstance(loop, ast.For | ast.While)
        and loop.lineno <= div.lineno <= (loop.end_lineno or 0)))


def _scope(info: ModuleInfo, func: Func | None, ifs: list[ast.If]) -> Iterator[Hit]:
    stmts: list[ast.stmt] = []
    bound: dict[str, list[int]] = {}
    params = _params(func)
    for st in ifs:
        here = _names_bound(st.body) - _names_bound(st.orelse) - params
        if not here or before_group(info, func, st):
            continue
        if not stmts:
            stmts = block_statements(func.body if func is not None else info.tree.body)
            bound = _bindings(stmts)
        only_here = {n for n in here if not any(line < st.lineno for line in bound.get(n, []))}
        end = st.end_lineno or st.lineno
        for name in sorted(only_here):
            read = _first_open_read(info, stmts, name, end)
            if read is None or any(end < line < read.lineno for line in bound.get(name, [])):
                continue
            follow = _next_wait(info, func, stmts, read)
            if follow:
                yield At(read.lineno, read.col_offset), "DDP027", (
                    f"`{name}` is bound only where `{ast.unparse(st.test)}` holds (line "
                    f"{st.lineno}) but read by every rank at line {read.lineno}: the other "
                    f"ranks raise NameError there while the ranks that have it go on to "
                    f"{follow} and wait for them")


def _first_open_read(info: ModuleInfo, stmts: list[ast.stmt], name: str,
                     after: int) -> ast.Name | None:
    """The first read of `name` past line `after` that no rank test guards."""
    for st in stmts:
        if st.lineno <= after or _guarded(info, st, stmts):
            continue
        for part in _own_expressions(st):
            hit = _open_read(info, part, name)
            if hit is not None:
                return hit
    return None


def _guarded(info: ModuleInfo, st: ast.stmt, stmts: list[ast.stmt]) -> bool:
    """`st` sits in an arm of an `if` on the rank, or in a `try` that may swallow the error,
    or past a rank-tested exit of its own loop turn or function (`if rank > 0: continue`)."""
    if _past_rank_exit(info, st, stmts):
        return True
    for outer in stmts:
        if outer is st or not (outer.lineno <= st.lineno <= (outer.end_lineno or 0)):
            continue
        if isinstance(outer, ast.If) and info.rank_level(outer.test):
            return True
        if isinstance(outer, ast.Try) and outer.handlers and any(
                s is st or any(x is st for x in ast.walk(s)) for s in outer.body):
            return True
    return False


def _past_rank_exit(info: ModuleInfo, st: ast.stmt, stmts: list[ast.stmt]) -> bool:
    """An `if` on the rank that ends in `continue`/`break` in the loop that holds `st` comes
    before `st`: past it, only some ranks run this turn (which ones is not asked, so that
    this stays silent rather than guess). A rank-tested `return` the walk already reads as a
    rank test around what follows."""
    loops = [o for o in stmts if isinstance(o, ast.For | ast.AsyncFor | ast.While)
             and o.lineno < st.lineno <= (o.end_lineno or 0)]
    inner = max(loops, key=lambda o: o.lineno) if loops else None
    for o in stmts:
        if o.lineno >= st.lineno or not isinstance(o, ast.If) or not o.body \
                or (o.end_lineno or 0) >= st.lineno or not info.rank_level(o.test):
            continue
        last = o.body[-1]
        if isinstance(last, ast.Continue | ast.Break) and inner is not None \
                and inner.lineno < o.lineno and max(
                    (x for x in loops if x.lineno < o.lineno <= (x.end_lineno or 0)),
                    key=lambda x: x.lineno, default=None) is inner:
            return True
    return False


def _own_expressions(st: ast.stmt) -> list[ast.AST]:
    """The expressions of `st` itself, not of the statements nested in it."""
    if isinstance(st, ast.If | ast.While):
        return [st.test]
    if isinstance(st, ast.For | ast.AsyncFor):
        return [st.iter]
    if isinstance(st, ast.With | ast.AsyncWith):
        return [i.context_expr for i in st.items]
    if isinstance(st, (*_SCOPE_STOP, ast.Try)):
        return []
    return [st]


def _open_read(info: ModuleInfo, node: ast.AST, name: str) -> ast.Name | None:
    """A load of `name` in `node` outside the arms of a rank-tested `x if rank0 else y` or
    `is_main and ...`."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load):
            return n
        if isinstance(n, ast.IfExp) and info.rank_level(n.test):
            continue
        if isinstance(n, ast.BoolOp) and any(info.rank_level(v) for v in n.values):
            continue
        if isinstance(n, _SCOPE_STOP):
            continue
        if isinstance(n, _COMPS) and any(
                isinstance(t, ast.Name) and t.id == name
                for g in n.generators for t in ast.walk(g.target)):
            # `[f(i) for i in xs]` binds its own `i`: only the first iterable is read outside
            stack.append(n.generators[0].iter)
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(n))))
    return None


_COMPS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _follows(info: ModuleInfo, rec: CallRec) -> bool:
    last = rec.last
    return last == "backward" or is_collective(rec) or (
        (last == "DistributedDataParallel" or last.endswith("_DDP"))
        and info.is_ddp_call(rec.node))


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

if dist.get_rank() == 0:
    run_dir = make_run_dir()
state = torch.load(run_dir + "/last.pt")  # NameError on ranks > 0
model = DDP(net)
"""

RULE = ddp027
