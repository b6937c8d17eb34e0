"""The collective schedule of every function: the tree its body becomes.

A function's body becomes a small tree of what matters to the other ranks: collectives (op and
group), forwards through the DDP wrapper, early exits, file writes with their path expression,
calls into functions of this file or of the other files on the command line (with the literals
they pass to parameters the callee tests), rank and non-rank branches, loops, and context
managers built from generators (split at their `yield`). The tree is built once per function;
projection.py walks it for one rank class. Callees that cannot be resolved are unknown and
contribute nothing, never a collective.
"""

from __future__ import annotations

import ast
from typing import Any

from .callgraph import (
    WRITE_LASTS,
    calls_by_func,
    is_collective,
    is_generator,
    params_of,
    reaches,
    resolve,
)
from .context import CallRec, Func, ModuleInfo, dotted
from .instances import receiver_class
from .paths import per_rank_path, rank_dependent
from .provenance import GLOBAL, LOCAL, rank_only
from .ranks import FALSE, RANK0, UNKNOWN, _const, evaluate_test, splits
from .runtime_tests import fallback, in_a_rank, received
from .schedule_nodes import CallerParam, CallN, Ev, IfN, LoopN
from .statements import (
    STUB,
    _grad_off,
    _memoised,
    _narrowing,
    _stub,
    _tested_names,
)

_EXIT_CALLS = {"sys.exit", "exit", "quit", "os._exit"}
_EXIT_LASTS = {"exit", "quit", "_exit"}
_WRITES = {"torch.save": 1, "pickle.dump": 1, "numpy.save": 0, "numpy.savez": 0,
           "numpy.savez_compressed": 0, "np.save": 0, "np.savez": 0}
MAX_DEPTH = 8
_SKIP = {ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef}
# Statements whose only part in a schedule is the calls they hold.
_SIMPLE = {ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Import, ast.ImportFrom, ast.Pass,
           ast.Delete, ast.Global, ast.Nonlocal}
_TRY_STAR = getattr(ast, "TryStar", None)


class Builder:
    """Builds (and memoises on the ModuleInfo) the tree of one function or the module."""

    def __init__(self, info: ModuleInfo) -> None:
        self.info = info
        self.by_func = calls_by_func(info)
        self.by_stmt: dict[int, list[CallRec]] = {}
        self.ddp = info.ddp_names()
        self.func: Func | None = None
        self.params: set[str] = set()
        self.handles: dict[str, ast.expr] = {}
        self.no_grad = 0
        self.whiles: list[bool] = []   # the enclosing loops, innermost last: a `while`?

    def tree(self, func: Func | None) -> list[object]:
        key = ("tree", id(func) if func is not None else 0)
        hit = self.info._memo.get(key)
        if hit is None:
            self.func, self.handles = func, {}
            self.no_grad = int(func is not None and any(_grad_off(d) for d in func.decorator_list))
            self.params = params_of(func) if func is not None else set()
            self.by_stmt = {}
            for rec in self.by_func.get(key[1], ()):
                if rec.stmt is not None:
                    self.by_stmt.setdefault(id(rec.stmt), []).append(rec)
            for recs in self.by_stmt.values():
                if len(recs) > 1:
                    recs.sort(key=lambda r: (r.node.lineno, r.node.col_offset))
            body = func.body if func is not None else self.info.tree.body
            hit = self.info._memo[key] = self.block(body)
        return hit  # type: ignore[return-value]

    def block(self, stmts: list[ast.stmt]) -> list[object]:
        out: list[object] = []
        for s in stmts:
            self.stmt(s, out)
        return out

    def stmt(self, st: ast.stmt, out: list[object]) -> None:
        t = type(st)
        if t in _SKIP:  # definitions: their bodies are other functions' schedules
            return
        start = len(out)
        self.calls(st, out)
        if t in _SIMPLE:  # nothing but the calls it holds
            return
        s: Any = st  # narrowed by `t` below (isinstance asserts cost time on every statement)
        if t is ast.If:
            body, orelse = self.block(s.body), self.block(s.orelse)
            split = splits(self.info, s.test)
            if body or orelse or split:
                # A test that is the same on every rank may still be decided for a
                # distributed run: `args.local_rank == -1` (the single-process launch) is
                # false on every rank, as `args.distributed` is true.
                fixed = UNKNOWN if split else evaluate_test(self.info, s.test, RANK0)
                if fixed == UNKNOWN and not split:
                    fixed = in_a_rank(s.test)
                out.append(IfN(s.test, body, orelse, split, s.lineno, fixed,
                               not split and fallback(self.info, self.func, s.test),
                               not split and received(self.info, self.func, s.test)))
        elif t is ast.For or t is ast.AsyncFor or t is ast.While:
            self.whiles.append(t is ast.While)
            body = self.block(s.body)
            self.whiles.pop()
            if body:
                out.append(LoopN(body, s.lineno, None if t is ast.While else s.iter))
            out.extend(self.block(s.orelse))
        elif t is ast.With or t is ast.AsyncWith:
            for item in s.items:
                if isinstance(item.optional_vars, ast.Name):
                    self.handles[item.optional_vars.id] = item.context_expr
            off = any(_grad_off(item.context_expr) for item in s.items)
            self.no_grad += off
            body = self.block(s.body)
            self.no_grad -= off
            ctx = [n for n in out[start:] if isinstance(n, CallN)]
            if ctx and is_generator(*ctx[-1].target):
                ctx[-1].ctx_body = body
            else:
                out.extend(body)
        elif t is ast.Try or t is _TRY_STAR:
            out.extend(self.block(s.body))
            for h in s.handlers:
                # a handler runs where this rank's error did: an arm under a test no rank
                # shares (rank 0's `except KeyError: break` leaves the loop its peers go on in)
                handled = self.block(h.body)
                if _leaves(handled, ast.unparse(h.type) if h.type is not None else "except"):
                    out.append(IfN(_caught(h), handled, [], False, h.lineno, UNKNOWN))
            out.extend(self.block(s.orelse))
            out.extend(self.block(s.finalbody))
        elif t is ast.Return:
            out.append(Ev("exit", "return", s.lineno))
        elif t is ast.Raise:
            # `raise NotImplementedError` marks code left out (a stub), not a path that fails
            # on one rank: it ends the path, and no rule reports it as an exit.
            out.append(Ev("exit", STUB if _stub(s.exc) else "raise", s.lineno))
        elif t is ast.Continue or t is ast.Break:
            # A `continue` of a `while` loop may be a retry (read the input again), not a
            # step the other ranks take without this one; divergence.py tells them apart.
            out.append(Ev("exit", "continue" if t is ast.Continue else "break", s.lineno,
                          text="while" if self.whiles and self.whiles[-1] else ""))
        elif t is ast.Assert:
            if not splits(self.info, s.test) and \
                    evaluate_test(self.info, s.test, RANK0) == FALSE:
                # `assert not args.distributed, "no DDP"`: a distributed run stops here
                out.append(Ev("exit", "assert", s.lineno))
            elif not _narrowing(s.test):
                out.append(Ev("mayexit", "assert", s.lineno))
        elif t is ast.Expr and isinstance(s.value, ast.Yield | ast.YieldFrom):
            out.append(Ev("yield", "yield", s.lineno))

    def calls(self, s: ast.stmt, out: list[object]) -> None:
        recs = self.by_stmt.get(id(s), ())
        later = _deferred(recs) if len(recs) > 1 else None
        for rec in recs:
            if later and id(rec.node) in later:
                continue  # runs when the signal comes or the thread starts, not here
            node = self.event(rec)
            if node is not None:
                out.append(node)

    def event(self, rec: CallRec) -> object | None:
        info, line = self.info, rec.node.lineno
        if is_collective(rec):
            group = next((ast.unparse(k.value) for k in rec.node.keywords if k.arg == "group"
                          and not (isinstance(k.value, ast.Constant) and k.value.value is None)),
                         "")
            if not group and rec.last == "barrier" and rec.node.args and not (
                    isinstance(a0 := rec.node.args[0], ast.Constant) and a0.value is None):
                group = ast.unparse(a0)  # `dist.barrier(workers)`: its group, positional
            return Ev("coll", rec.last, line, group, path=info.path)
        f = rec.node.func
        target = dotted(f.value) if isinstance(f, ast.Attribute) and f.attr == "forward" \
            else dotted(f)
        if target is not None:
            if target in self.ddp and self.wrapped_before(target, line):
                return Ev("fwd", "forward", line, target, no_grad=self.no_grad > 0)
            if target in self.params and target not in ("self", "cls") and (
                    self.ddp or self.info.handed_params):
                return Ev("pcall", target, line, no_grad=self.no_grad > 0)
        last = rec.last
        if last in _EXIT_LASTS or last in WRITE_LASTS:
            qual = rec.qual or info.qualify(f) or ""
            if qual in _EXIT_CALLS:
                return Ev("exit", "exit", line)
            if qual in _WRITES or (last == "save" and qual.endswith("torch.save")):
                return self.write(rec, qual)
        if target is None or (not info.local_callees(rec) and (
                info.file_set is None or target.split(".", 1)[0] not in info.aliases
                and receiver_class(info, rec.node) is None)):
            return None
        target_fn = resolve(info, rec)
        if target_fn is None or _memoised(target_fn[1]) or \
                not reaches(target_fn[0], id(target_fn[1])):
            # A memoised callee (`@functools.cache`) may return without running its body on
            # one rank and run it on another: what it does is unknown here.
            return None
        call = CallN(line, target_fn, self.bind(rec, target_fn[1]),
                     consts=self.consts(rec, target_fn), per_rank=self.per_rank_args(rec,
                                                                             target_fn[1]),
                     no_grad=self.no_grad > 0,
                     via_self=isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                     and f.value.id == "self")
        level = rank_only(target_fn[1])
        if level:
            # `@main_process def save(...)`: the body runs on the leader alone
            return IfN(_LEADER_TEST[level], [call], [], True, line, UNKNOWN)
        return call

    def write(self, rec: CallRec, qual: str) -> Ev | None:
        pos = _WRITES.get(qual, 1)
        args = rec.node.args
        dest = args[pos] if len(args) > pos else next(
            (k.value for k in rec.node.keywords if k.arg in ("f", "file")), None)
        if dest is None:
            return None
        if isinstance(dest, ast.Name) and dest.id in self.handles:
            dest = self.handles[dest.id]
        if isinstance(dest, ast.Call):
            last = self.info.callee_last(dest)
            if last == "BytesIO":
                return None
            if last == "open" and dest.args:
                dest = dest.args[0]
        elif isinstance(dest, ast.Name) and any(
                isinstance(v, ast.Call) and self.info.callee_last(v) == "BytesIO"
                for _, v in self.info.assigns.get(dest.id, [])):
            return None
        op = qual.rsplit(".", 1)[-1] if qual else rec.last
        if not qual.endswith("torch.save"):
            obj = [*args[:pos], *args[pos + 1:], *(k.value for k in rec.node.keywords
                                                   if k.arg not in ("f", "file"))]
            if not any(rank_dependent(self.info, o) for o in obj):
                return None  # the same contents from every rank (`params.pkl`): a benign race
        return Ev("write", op, rec.node.lineno, ast.unparse(dest),
                  per_rank_path(self.info, dest), path=self.info.path,
                  names=frozenset(n.id for n in ast.walk(dest) if isinstance(n, ast.Name)))

    def bind(self, rec: CallRec, fn: Func) -> dict[str, tuple[str, str]]:
        names = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
        if names and names[0] in ("self", "cls") and isinstance(rec.node.func, ast.Attribute):
            names = names[1:]
        pairs = list(zip(names, rec.node.args, strict=False)) + [
            (k.arg, k.value) for k in rec.node.keywords if k.arg is not None]
        params = self.params
        out: dict[str, tuple[str, str]] = {}
        for name, arg in pairs:
            d = dotted(arg)
            if d is None:
                continue
            if d in self.ddp and self.wrapped_before(d, rec.node.lineno):
                out[name] = ("ddp", d)
            elif d in params:
                out[name] = ("param", d)
        return out


    def per_rank_args(self, rec: CallRec, fn: Func) -> frozenset[str]:
        names = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
        if names and names[0] in ("self", "cls") and isinstance(rec.node.func, ast.Attribute):
            names = names[1:]
        pairs = list(zip(names, rec.node.args, strict=False)) + [
            (k.arg, k.value) for k in rec.node.keywords if k.arg is not None]
        return frozenset(name for name, arg in pairs
                         if not isinstance(arg, ast.Constant) and per_rank_path(self.info, arg))

    def wrapped_before(self, name: str, line: int) -> bool:
        """`name` holds the DDP wrapper at `line` of the function being built. A plain local
        name holds it only in the function that wrapped it (or one nested in it), or
        everywhere when the module wrapped it: `model` wrapped in `train()` is not the `model`
        that `main()` reloads for evaluation. A parameter holds whatever the caller passed,
        unless this function wrapped it itself (`model = DDP(model)`). Attributes
        (`self.model`) cross methods."""
        root = name.split(".", 1)[0]
        if "." in name:
            if root in ("self", "cls"):
                handed = self.info.handed_ddp.get(name)
                if handed and not self.info.ddp_wraps(name):
                    # a caller handed the wrapper to this class's constructor (not to
                    # another class of the file that keeps its own model under that name)
                    return self.info.func_class.get(self.func, "") in handed  # type: ignore[arg-type]
                # wrapped in another method (`__init__`, `setup`) or earlier in this one
                return any(w.func is not self.func or w.node.lineno < line
                           for w in self.info.ddp_wraps(name)) or line > self.ddp[name]
            return line > self.ddp[name] and root not in self.params
        here = self.func
        for w in self.info.ddp_wraps(name):
            if w.node.lineno >= line:
                continue
            if w.func is here:
                return True
            if root in self.params:
                continue
            if w.func is None or (here is not None and
                                  w.func.lineno <= here.lineno <= (w.func.end_lineno or 0)):
                return True
        return False

    def consts(self, rec: CallRec, target: tuple[ModuleInfo, Func]) -> dict[str, object]:
        tested = _tested_names(*target)
        if not tested:
            return {}
        fn = target[1]
        names = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
        if names and names[0] in ("self", "cls") and isinstance(rec.node.func, ast.Attribute):
            names = names[1:]
        out: dict[str, object] = {}
        if any(isinstance(a, ast.Starred) for a in rec.node.args) or \
                any(k.arg is None for k in rec.node.keywords):
            return out  # `f(*args, **kw)`: which parameter gets what is not in the text
        # A parameter the call leaves out takes its literal default.
        defaults = list(zip(reversed(names), reversed(fn.args.defaults), strict=False)) + [
            (a.arg, d) for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True)
            if d is not None]
        given = {*names[:len(rec.node.args)], *(k.arg for k in rec.node.keywords)}
        for name, d in defaults:
            if name in tested and name not in given:
                if isinstance(d, ast.Constant):
                    out[name] = d.value
                elif (lit := _const(d)) is not None:  # `rank=-1`
                    out[name] = lit
        for name, arg in [*zip(names, rec.node.args, strict=False),
                          *((k.arg, k.value) for k in rec.node.keywords if k.arg is not None)]:
            if name not in tested:
                continue
            lit = _const(arg)  # `rank=-1` is a unary minus, not a Constant
            if isinstance(arg, ast.Constant):
                out[name] = arg.value
            elif lit is not None:
                out[name] = lit
            elif isinstance(arg, ast.Name) and arg.id in self.params:
                out[name] = CallerParam(arg.id)
            elif isinstance(arg, ast.UnaryOp) and isinstance(arg.op, ast.Not) and \
                    isinstance(arg.operand, ast.Name) and arg.operand.id in self.params:
                out[name] = CallerParam(arg.operand.id, negate=True)
        return out


# Calls that keep a callable to run later (a signal, the interpreter's exit, a thread or
# process of its own), not now: `signal.signal(SIGTERM, lambda s, f: save_and_exit())`.
_REGISTERS = {"signal", "register", "Thread", "Timer", "Process", "start_new_thread",
              "call_later", "call_soon"}


def _leaves(events: list[object], caught: str) -> bool:
    """The handler's events hold an exit (directly or under its own tests): only then does
    the arm it stands for part the ranks (a handler that logs and goes on does not). Each such
    exit is marked with what the handler catches, for the message."""
    left = False
    for e in events:
        if isinstance(e, Ev) and e.kind == "exit":
            e.caught = caught
            left = True
        elif isinstance(e, IfN):
            left = _leaves(e.body, caught) | _leaves(e.orelse, caught) or left
    return left


def _caught(h: ast.ExceptHandler) -> ast.expr:
    """A test standing for "this handler's error was raised here", unique to the handler."""
    what = ast.unparse(h.type) if h.type is not None else "an error"
    return ast.copy_location(ast.Name(id=f"<{what} caught at line {h.lineno}>",
                                      ctx=ast.Load()), h)


def _deferred(recs: list[CallRec]) -> set[int] | None:
    """The calls of one statement that sit in a lambda handed to a registering call: the
    lambda's body runs when the handler fires, on whichever rank gets the signal."""
    out: set[int] | None = None
    for rec in recs:
        if rec.last not in _REGISTERS:
            continue
        for arg in [*rec.node.args, *(k.value for k in rec.node.keywords)]:
            if isinstance(arg, ast.Lambda):
                if out is None:
                    out = set()
                out.update(id(n) for n in ast.walk(arg.body) if isinstance(n, ast.Call))
    return out


_LEADER_TEST = {GLOBAL: ast.Call(ast.Name("is_main_process", ast.Load()), [], []),
                LOCAL: ast.Call(ast.Name("is_local_main_process", ast.Load()), [], [])}


def builder(info: ModuleInfo) -> Builder:
    hit = info._memo.get(("builder", 0))
    if hit is None:
        hit = info._memo[("builder", 0)] = Builder(info)
    return hit  # type: ignore[return-value]


__all__ = ["Builder", "builder"]

