"""Who calls what, and which functions matter: the layer under the schedules.

`resolve` finds the one function a call runs (this file, or another file on the command line
through crossfile.FileSet); `reaches` tells whether a function reaches a collective, a DDP
forward, a parameter call or a file write (directly or through calls), and `candidates` those
where a rank test guards such a thing or an exit: only their schedules are ever built.
"""

from __future__ import annotations

import ast

from .context import CallRec, Func, ModuleInfo, dotted, is_collective
from .crossfile import EXTERNAL, sets_up_group
from .instances import find_method, receiver_class
from .ranks import FALSE, TRUE, launch, splits


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
    file_set = info.file_set
    if file_set is None:
        return None
    qual = info.qualify(rec.node.func)
    if qual is None or "." not in qual:
        return None
    return file_set.find(qual, info) or (  # type: ignore[attr-defined]
        find_method(info, rec) if rec.node.func.__class__ is ast.Attribute else None)


WRITE_LASTS = {"save", "dump", "savez", "savez_compressed"}


def reaches(info: ModuleInfo, key: int) -> bool:
    """The function with id `key` (0: the module's top level) reaches a collective, a DDP
    forward, a parameter call (when the module has a DDP model) or a file write, directly or
    through calls (this file's, or another file's on the command line). Computed on demand
    and memoised: functions nobody asks about are never looked at."""
    memo: dict[int, bool] | None = info._memo.get(("reaches", 0))  # type: ignore[assignment]
    if memo is None:
        memo = info._memo[("reaches", 0)] = {}
    assert memo is not None
    hit = memo.get(key)
    if hit is not None:
        return hit
    memo[key] = False  # in progress: cycles end here
    ddp = info.ddp_names()
    cross = info.file_set is not None and getattr(info.file_set, "multi", False)
    params: set[str] | None = None
    hit = False
    for rec in calls_by_func(info).get(key, ()):
        last = rec.last
        if is_collective(rec) or last in WRITE_LASTS:
            hit = True
            break
        f = rec.node.func
        if rec.func is not None and isinstance(f, ast.Name) and \
                f.id in info.handed_params.get(key, ()):
            hit = True  # a forward of the wrapper every caller passes
            break
        if ddp and (last in _ddp_lasts(info) or (rec.func is not None
                                                 and isinstance(f, ast.Name))):
            d = dotted(f.value) if isinstance(f, ast.Attribute) and f.attr == "forward" \
                else dotted(f)
            if d is not None and params is None:
                params = params_of(rec.func) - {"self", "cls"} if rec.func is not None \
                    else set()
            if d is not None and (d in ddp or d in (params or ())):
                hit = True
                break
        if last in info.funcs:
            callees = info.local_callees(rec)
            if callees:
                if any(reaches(info, id(fn)) for fn in callees):
                    hit = True
                    break
                continue
        if cross and isinstance(f, ast.Name | ast.Attribute):
            head = f.id if isinstance(f, ast.Name) else (dotted(f) or ".").split(".")[0]
            target = resolve(info, rec) if head in info.aliases or (
                head in info.assigns and receiver_class(info, rec.node) is not None) else None
            if target is not None and reaches(target[0], id(target[1])):
                hit = True
                break
    memo[key] = hit
    return hit


def file_callers(info: ModuleInfo) -> dict[int, list[CallRec]]:
    """The calls in this file of each of its functions (by id), made once a file: the other
    way round from calls_by_func."""
    key = ("file_callers", 0)
    hit = info._memo.get(key)
    if hit is None:
        out: dict[int, list[CallRec]] = {}
        for rec in info.calls:
            if rec.last in info.funcs:
                for f in info.local_callees(rec):
                    out.setdefault(id(f), []).append(rec)
        hit = info._memo[key] = out
    return hit  # type: ignore[return-value]


def calls_by_func(info: ModuleInfo) -> dict[int, list[CallRec]]:
    hit = info._memo.get(("calls_by_func", 0))
    if hit is None:
        out: dict[int, list[CallRec]] = {}
        for rec in info.calls:
            out.setdefault(id(rec.func) if rec.func is not None else 0, []).append(rec)
        hit = info._memo[("calls_by_func", 0)] = out
    return hit  # type: ignore[return-value]


def _ddp_lasts(info: ModuleInfo) -> set[str]:
    hit = info._memo.get(("ddp_lasts", 0))
    if hit is None:
        hit = info._memo[("ddp_lasts", 0)] = {
            n.rsplit(".", 1)[-1] for n in info.ddp_names()} | {"forward"}
    return hit  # type: ignore[return-value]


def candidates(info: ModuleInfo) -> set[int]:
    """Functions whose own rank tests guard a call or an exit (the walker's records), or that
    run code inside a rank-splitting generator context manager (`with leader_first(rank):`)."""
    hit = info._memo.get(("candidates", 0))
    if hit is not None:
        return hit  # type: ignore[return-value]
    out = set(info.exit_splits)
    ddp = info.ddp_names()
    ddp_lasts = _ddp_lasts(info) if ddp else set()
    cross = info.file_set is not None and getattr(info.file_set, "multi", False)
    for rec in info.guarded_calls:
        # only a guarded call that can matter: a collective, a forward of the wrapper or of a
        # parameter, a call of this file's functions or of another linted file's
        f = rec.node.func
        key = id(rec.func) if rec.func is not None else 0
        if key in out:
            continue
        # `if rank == 0: sys.exit(0)` splits the function as much as a `return` does
        if is_collective(rec) or rec.last in ddp_lasts or rec.last in info.funcs or (
                rec.last in _EXIT_LASTS and _head(f) in _EXIT_HEADS) or (
                cross and (head := _head(f)) in info.aliases
                and info.aliases[head].split(".")[0] not in EXTERNAL) or (
                ddp and rec.func is not None and isinstance(f, ast.Name)
                and f.id in params_of(rec.func)):
            out.add(key)
    gens = {fn.name for fns in info.funcs.values() for fn in fns
            if id(fn) in info.generators and id(fn) in info.split_funcs}
    if gens:
        for rec in info.calls:
            if rec.last in gens and any(id(fn) in info.generators
                                        for fn in info.local_callees(rec)):
                out.add(id(rec.func) if rec.func is not None else 0)
    info._memo[("candidates", 0)] = out
    return out


_EXIT_LASTS = {"exit", "quit", "_exit"}
_EXIT_HEADS = {"exit", "quit", "sys", "os"}


def _head(f: ast.expr) -> str:
    return f.id if isinstance(f, ast.Name) else (dotted(f) or ".").split(".")[0]


def has_split(info: ModuleInfo, func: Func | None) -> bool:
    """`func`'s own rank tests can make its classes part: a rank test guards a call or an
    exit there, and it reaches something that matters. Read from the walker's records and
    the call graph: no schedule is built for the others."""
    key = id(func) if func is not None else 0
    return key in candidates(info) and reaches(info, key)


def handed_away_under_rank_tests(info: ModuleInfo, fn: Func) -> bool:
    """A nested function that is handed to other code (`optimizer.step(closure)`) and only
    ever named under rank tests (in a distributed run: the arm of `if distributed:` that a
    single process takes does not count): which ranks run it, and what the others do
    meanwhile, is decided by that code and its callers, not by its own body (mace's L-BFGS
    closure, which rank 0's optimizer calls and the workers call after a signal)."""
    parent = info.parents.get(id(fn))
    if parent is None:
        return False
    refs: list[tuple[bool, bool]] = []   # (under a rank test, handed rather than called)
    _refs(info, parent.body, fn.name, False, refs)
    return bool(refs) and all(u for u, _ in refs) and any(h for _, h in refs)


def _refs(info: ModuleInfo, stmts: list[ast.stmt], name: str, under: bool,
          out: list[tuple[bool, bool]]) -> None:
    for s in stmts:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(s, ast.If):
            _names(s.test, name, under, out)
            v = launch(info, s.test)
            inner = under or splits(info, s.test)
            if v != FALSE:
                _refs(info, s.body, name, inner, out)
            if v != TRUE:
                _refs(info, s.orelse, name, inner, out)
            continue
        for _, value in ast.iter_fields(s):
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, ast.ExceptHandler):
                    _refs(info, v.body, name, under, out)
                elif isinstance(v, ast.stmt):
                    _refs(info, [v], name, under, out)
                elif isinstance(v, ast.AST):
                    _names(v, name, under, out)


def _names(node: ast.AST, name: str, under: bool, out: list[tuple[bool, bool]]) -> None:
    called = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load):
            out.append((under, id(n) not in called))


def message_loop(info: ModuleInfo, func: Func | None) -> bool:
    """A loop under a rank test that receives in a collective and leaves on what it received
    (`while True: broadcast(signal, src=0); if signal.item() == 0: break`): a worker that
    serves the leader's requests. How many collectives it makes is the sender's decision at
    run time; no static alignment of the two classes proves anything."""
    for loop in info.loops:
        if loop.func is not func or not loop.guard:
            continue
        got: set[str] = set()
        for rec in info.calls:
            if rec.func is func and loop.node in rec.loops and is_collective(rec) \
                    and rec.node.args:
                name = dotted(rec.node.args[0])
                if name:
                    got.add(name.split(".")[0])
        if not got:
            continue
        for node in ast.walk(loop.node):
            if isinstance(node, ast.If) and any(
                    isinstance(n, ast.Name) and n.id in got for n in ast.walk(node.test)) \
                    and any(isinstance(s, (ast.Break, ast.Return)) for s in node.body):
                return True
    return False


def _forming(info: ModuleInfo) -> set[int]:
    """Functions of this file that set up a process group, directly or through this file's
    other functions."""
    hit = info._memo.get(("forming", 0))
    if hit is None:
        out: set[int] = set()
        for rec in info.calls:
            if rec.func is not None and sets_up_group(rec.last):
                out.add(id(rec.func))
        for _ in range(4):
            more = {id(rec.func) for rec in info.calls if rec.func is not None
                    and id(rec.func) not in out
                    and any(id(fn) in out for fn in info.local_callees(rec))}
            if not more:
                break
            out |= more
        hit = info._memo[("forming", 0)] = out
    return hit  # type: ignore[return-value]


def mode_without_group(info: ModuleInfo, lines: list[int]) -> bool:
    """One of `lines` (the calls on the way to a write, in this file) sits in one arm of a
    test that splits no ranks (a CLI subcommand: `if command == "train": train() elif
    command == "change-bias": change_bias()`), another arm of which sets up the process
    group while this one does not: this mode runs as one process (deepmd's change-bias
    writes its model once)."""
    forming = _forming(info)
    if not forming or not lines:
        return False
    ifs = info._memo.get(("ifs", 0))
    if ifs is None:
        ifs = info._memo[("ifs", 0)] = [n for n in ast.walk(info.tree)
                                          if isinstance(n, ast.If) and n.orelse]
    for node in ifs:  # type: ignore[attr-defined]
        if info.rank_level(node.test):
            continue
        arms = (node.body, node.orelse)
        for line in lines:
            mine = [a for a in arms
                    if a[0].lineno <= line <= (a[-1].end_lineno or a[-1].lineno)]
            if len(mine) != 1:
                continue
            other = arms[1] if mine[0] is arms[0] else arms[0]
            if _sets_up(info, other, forming) and not _sets_up(info, mine[0], forming):
                return True
    return False


def _sets_up(info: ModuleInfo, stmts: list[ast.stmt], forming: set[int]) -> bool:
    first, last = stmts[0].lineno, stmts[-1].end_lineno or stmts[-1].lineno
    for rec in info.calls:
        if first <= rec.node.lineno <= last and (
                sets_up_group(rec.last)
                or any(id(fn) in forming for fn in info.local_callees(rec))):
            return True
    return False


def hands_work_away(info: ModuleInfo, func: Func | None) -> bool:
    """Under a rank test, `func` hands a function of this file that reaches collectives to
    other code instead of calling it (`threading.Thread(target=batching_loop).start()` on
    rank 0, the workers' loop in the other arm): when and how often it runs is that code's
    decision, so the two classes' schedules cannot be aligned from the text."""
    for rec in info.calls:
        if rec.func is not func or not rec.guard:
            continue
        for a in [*rec.node.args, *(k.value for k in rec.node.keywords)]:
            # `target=loop`, or a bound method (`wandb.agent(function=trainer.train)`)
            method = isinstance(a, ast.Attribute)
            name = a.id if isinstance(a, ast.Name) else \
                a.attr if isinstance(a, ast.Attribute) else None
            if name and any(reaches(info, id(fn)) for fn in info.funcs.get(name, ())
                            if (fn in info.func_class) == method):
                return True
    return False


# Calls that cut the autograd graph: what they return carries no gradient back.
GRAPH_CUTS = {"detach", "item", "cpu", "numpy", "tolist"}


def graph_reads(expr: ast.AST) -> set[str]:
    """Names and attribute chains an expression reads, except through `.detach()`, `.item()`
    and the like, which cut the autograd graph."""
    out: set[str] = set()
    todo = [expr]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                and n.func.attr in GRAPH_CUTS:
            continue
        if isinstance(n, ast.Attribute) and n.attr == "data":
            continue
        if isinstance(n, ast.Name | ast.Attribute):
            d = dotted(n)
            if d is not None:
                out.add(d)
        todo.extend(ast.iter_child_nodes(n))
    return out


def syncs_grads_by_hand(info: ModuleInfo) -> bool:
    """The module all-reduces gradients itself (`all_reduce(p.grad)`, `allreduce_grads(...)`,
    `average_gradients(...)`): a bare model's backward may be synced that way (DDP024), and a
    loss divided by the world size turns that sum into a mean (DDP044)."""
    key = ("syncs_grads_by_hand", 0)
    hit = info._memo.get(key)
    if hit is None:
        hit = info._memo[key] = any(
            "grad" in (low := rec.last.lower()) and any(
                w in low for w in ("reduce", "sync", "average"))
            or is_collective(rec) and any("grad" in u for a in rec.node.args
                                          for u in graph_reads(a))
            for rec in info.calls)
    return bool(hit)
