"""A parameter's value from its callers: the calls of a project function across the files
given, and what each passes for one parameter.

`init_process_group(rank=rank)` in `def ddp_setup(rank, world_size)` tells nothing by itself
(mp.spawn's index is both ranks on one node); when every call of `ddp_setup` in the program
passes the same kind of value (`ddp_setup(local_rank, ...)` in `main(local_rank, ...)`, itself
called as `main(LOCAL_RANK, ...)` with `LOCAL_RANK = int(os.getenv("LOCAL_RANK"))`), the
parameter is that value. Only where every caller is in sight: a function also named other than
as a call's callee (`mp.spawn(main, ...)`, `partial(main)`, a callback list) or a call that
unpacks `*args`/`**kwargs` has callers the linter cannot read.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable

from .context import CallRec, Func, ModuleInfo
from .ranks import FALSE, NODE_LEADERS, OTHERS, TRUE, evaluate_test

# What a caller passes, read in the caller's module and function: its source, or None.
Source = Callable[[ModuleInfo, ast.expr, Func | None], str | None]


def is_parameter(fn: Func, name: str) -> bool:
    a = fn.args
    return any(p.arg == name for p in (*a.posonlyargs, *a.args, *a.kwonlyargs))


def passed(fn: Func, call: ast.Call, name: str) -> ast.expr | None:
    """What `call` passes for `fn`'s parameter `name`: the positional or keyword argument,
    or the parameter's default when the call leaves it out; None for `*args`/`**kwargs`."""
    if any(isinstance(a, ast.Starred) for a in call.args) or \
            any(k.arg is None for k in call.keywords):
        return None
    for k in call.keywords:
        if k.arg == name:
            return k.value
    a = fn.args
    positional = [p.arg for p in (*a.posonlyargs, *a.args)]
    if positional[:1] in (["self"], ["cls"]) and (
            fn.name == "__init__" or isinstance(call.func, ast.Attribute)):
        # `Trainer(net, rank)` fills `__init__(self, net, rank)`; `runner.fit(loader)` fills
        # `fit(self, data_loader)`
        positional = positional[1:]
    if name in positional:
        i = positional.index(name)
        if i < len(call.args):
            return call.args[i]
        defaults = a.defaults
        j = i - (len(positional) - len(defaults))
        return defaults[j] if j >= 0 else None
    kw = [p.arg for p in a.kwonlyargs]
    if name in kw:
        return a.kw_defaults[kw.index(name)]
    return None


def from_callers(info: ModuleInfo, func: Func, param: str, source: Source) -> str | None:
    """A parameter is what its callers pass: `source` of the argument when every call of
    `func` in the files given has one for it (`ddp_setup(local_rank, ...)` from `main(LOCAL_RANK,
    ...)`), naming where it was passed; None when a caller is out of sight or one has none."""
    args = func.args
    first = [*args.posonlyargs, *args.args][:1]
    sites = callers(info, func, spawned=bool(first) and first[0].arg == param)
    if not sites:
        return None
    # A constant is the single-process path (`main(0, 1)`), as it is where a name is assigned.
    # A call under a rank test passes the rank that passed it (`if rank == 0: evaluate(...,
    # rank)`: rank 0, on every node a device that exists): no reading of the kind either.
    read = [(caller, rec, arg) for caller, rec in sites
            if not isinstance(arg := passed(func, rec.node, param), ast.Constant)
            and not _one_rank(caller, rec)]
    srcs = [source(caller, arg, rec.func) if arg is not None else None
            for caller, rec, arg in read]
    if not read or not all(srcs):
        return None
    caller, rec, _ = read[0]
    then = "then" if ", passed as" in (srcs[0] or "") else "passed"
    return (f"{srcs[0]}, {then} as `{param}` to {_constructor(info, func) or func.name}() at "
            f"{os.path.basename(caller.path)}:{rec.node.lineno}")


def _one_rank(info: ModuleInfo, rec: CallRec) -> bool:
    """`rec` runs in an arm that no rank > 0 takes (`if rank == 0 and ...:`, `if
    is_main_process():`), as the rank classes read it; not under a test that only tells
    distributed from not (`LOCAL_RANK >= 0`)."""
    if not rec.guard:
        return False
    ifs = {id(t): t for _, t in info.rank_ifs}
    for key, arm in rec.branch:
        t = ifs.get(key)
        closed = FALSE if arm == 0 else TRUE   # the value that keeps a class out of this arm
        if t is not None and all(evaluate_test(info, t.test, c) == closed
                                 for c in (OTHERS, NODE_LEADERS)):
            return True
    return False


def callers(info: ModuleInfo, fn: Func,
            spawned: bool = False) -> list[tuple[ModuleInfo, CallRec]] | None:
    """Every call of the module-level function `fn` (defined in `info`) in the files given,
    with the module it sits in; None where a caller may be out of sight: `fn` is a method or
    a nested function, its name is read other than as a call's callee somewhere (handed to
    `mp.spawn`, a callback), or nothing calls it. `spawned`: the question is about the first
    parameter, which torch.multiprocessing's `spawn(fn, ...)` fills with the process's index
    on its own node (both ranks there): such a hand-off tells nothing and hides nothing, and
    the calls in sight answer (`train(args.local_rank, ...)` on the launcher's path)."""
    ctor = _constructor(info, fn)
    if (fn in info.func_class and not ctor) or id(fn) in info.parents:
        return None
    key = ("callers", id(fn), spawned)
    hit = info._memo.get(key)
    if hit is not None or key in info._memo:
        return hit  # type: ignore[return-value]
    file_set = info.file_set
    infos: list[ModuleInfo] = getattr(file_set, "infos", None) or [info]
    out: list[tuple[ModuleInfo, CallRec]] | None = []
    # Another file names `fn` only after importing it (`from utils import main`) or calling
    # it through its module: the others need no look (an index built once per program).
    # A class's `__init__` runs where the class is called (`Trainer(net, rank)`).
    name = ctor or fn.name
    scanned = [info, *(o for o in _namers(infos).get(name, ()) if o is not info)]
    for other in scanned:
        recs = other.calls_named(name)
        out.extend((other, rec) for rec in recs   # type: ignore[union-attr]
                   if (_builds(other, rec, info, ctor) if ctor
                       else _resolves(other, rec, info, fn)))
    if not out or any(name in _handed_on(other, spawned) for other in scanned):
        out = None
    info._memo[key] = out
    return out


def _constructor(info: ModuleInfo, fn: Func) -> str:
    """The class whose `__init__` `fn` is (one class of that name in its file), or ""."""
    cls = info.func_class.get(fn) if fn.name == "__init__" else None
    if cls is None or id(fn) in info.parents or info.classes.get(cls) is None:
        return ""
    return cls if fn in info.classes[cls].body else ""


def _builds(caller: ModuleInfo, rec: CallRec, info: ModuleInfo, cls: str) -> bool:
    """`rec` calls the class `cls` defined in `info`: by its plain name in that file, or
    through an import of it from that file."""
    f = rec.node.func
    if caller is info:
        return isinstance(f, ast.Name) and f.id == cls and f.id not in info.aliases
    qual = caller.qualify(f)
    modules = getattr(caller.file_set, "_modules", None)
    if qual is None or "." not in qual or modules is None:
        return False
    module, _, last = qual.rpartition(".")
    return last == cls and info in modules(module, caller)


def _resolves(caller: ModuleInfo, rec: CallRec, info: ModuleInfo, fn: Func) -> bool:
    """`rec` calls `fn`: a plain name of the same file (defined there once), or a name the
    caller imports from `fn`'s module."""
    f = rec.node.func
    if caller is info:
        return isinstance(f, ast.Name) and f.id not in info.aliases and \
            len(info.funcs.get(fn.name, [])) == 1
    qual = caller.qualify(f)
    find = getattr(caller.file_set, "find", None)
    if qual is None or "." not in qual or find is None:
        return False
    found = find(qual, caller)
    return found is not None and found[0] is info and found[1] is fn


def _namers(infos: list[ModuleInfo]) -> dict[str, list[ModuleInfo]]:
    """Name -> the modules that call something of that name or import it."""
    key = ("namers", 0)
    hit = infos[0]._memo.get(key)
    if hit is None:
        index: dict[str, list[ModuleInfo]] = {}
        for other in infos:
            for name in {*other.call_lasts(), *other.aliases}:
                index.setdefault(name, []).append(other)
        hit = infos[0]._memo[key] = index
    return hit  # type: ignore[return-value]


def _handed_on(info: ModuleInfo, spawned: bool = False) -> set[str]:
    """The names `info` hands on rather than calls: an argument of a call (`mp.spawn(main,
    ...)`, `partial(main)`, `Process(target=main)`) or a value assigned (`hooks = [main]`),
    alone or in a list, tuple or dict; with `spawned`, not the function torch.multiprocessing's
    `spawn`/`start_processes` is given. Read once per module from the calls and assignments the
    walk recorded (a walk of every tree per question costs more than the lint)."""
    key = ("handed_on", spawned)
    hit = info._memo.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    out: set[str] = set()

    def add(v: ast.expr) -> None:
        for n in (v.elts if isinstance(v, ast.List | ast.Tuple | ast.Set) else
                  [x for x in v.values if x is not None] if isinstance(v, ast.Dict) else [v]):
            if isinstance(n, ast.Name):
                out.add(n.id)
            elif isinstance(n, ast.Attribute):
                out.add(n.attr)

    for rec in info.calls:
        args = rec.node.args
        if spawned and args and rec.last in ("spawn", "start_processes") and \
                (info.qualify(rec.node.func) or "").startswith("torch.multiprocessing"):
            args = args[1:]
        for a in (*args, *(k.value for k in rec.node.keywords)):
            add(a)
    for vals in info.assigns.values():
        for _, v in vals:
            add(v)
    info._memo[key] = out
    return out
