"""A rank's own failure, caught where a training loop's callee runs its step.

`except RuntimeError as e: if "out of memory" in str(e): return False` in a method the loop
calls (`succ = self.train_one_step(batch)`, the method perhaps a subclass's in another file)
ends that step on this rank alone: the backward or collective after the handler is skipped
while the other ranks wait in it. What the call returns is then this rank's own too, and so is
a counter advanced only when it holds (`if succ: step += 1`). DDP004 reads these; a handler
that shares the failure (a collective in it) or re-raises first is no rank's own exit.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from .callgraph import calls_by_func, resolve
from .context import CallRec, Func, Loop, ModuleInfo, dotted, is_collective, is_main_guard
from .param_flow import passed

# Errors that end an iteration for every rank alike, or a user's interrupt.
COMMON_ERRORS = {"StopIteration", "KeyboardInterrupt", "SystemExit", "GeneratorExit"}
EXITS = {"exit", "_exit", "abort"}
_LEAVES = (ast.Continue, ast.Break, ast.Return)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
BatchLoop = Callable[[ModuleInfo, ast.expr], bool]
Site = tuple[ModuleInfo, Func]


def own_nodes(stmts: list[ast.stmt], loops: bool = True) -> Iterator[ast.AST]:
    """The nodes of `stmts`, not those of a function or class they define (nor, without
    `loops`, of an inner loop: a `break` there leaves that loop)."""
    todo: list[ast.AST] = list(stmts)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, _SCOPES) and (loops or not isinstance(node, _LOOPS)):
            todo.extend(ast.iter_child_nodes(node))


def caught_here(h: ast.ExceptHandler) -> bool:
    """The handler catches an error one rank can meet alone (not the end of an iterator)."""
    caught = {(dotted(t) or "").rsplit(".", 1)[-1] for t in
              (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]) if t is not None}
    return not (caught and caught <= COMMON_ERRORS)


def clean_exit(info: ModuleInfo, node: ast.AST) -> bool:
    """`exit()`, `exit(0)`, `sys.exit()`, `os._exit(0)`, `quit()`: the process ends with status
    0, which neither torchrun nor mp.spawn reads as a failure, so no launcher ends the peers;
    `sys.exit(1)`, `sys.exit("msg")` and `abort()` are failures the launcher acts on."""
    if not (isinstance(node, ast.Call) and info.callee_last(node) in ("exit", "_exit", "quit")):
        return False
    if node.keywords or len(node.args) > 1:
        return False
    return not node.args or isinstance(node.args[0], ast.Constant) and \
        node.args[0].value in (0, None, False) and not isinstance(node.args[0].value, float)


def exits_cleanly(info: ModuleInfo, h: ast.ExceptHandler) -> ast.Call | None:
    """The status-0 exit at the handler's top level, ahead of any `raise` there."""
    for st in h.body:
        if isinstance(st, ast.Raise):
            return None
        if isinstance(st, ast.Expr) and clean_exit(info, st.value):
            return st.value  # type: ignore[return-value]
    return None


def reraises_first(info: ModuleInfo, h: ast.ExceptHandler) -> bool:
    """A `raise` or failing exit at the handler's top level that no path leaves before: `if
    oom: continue` ahead of a top-level `raise e` is this rank's own way out, not a re-raise;
    so is a status-0 exit (`exit(0)`), which ends this rank alone in good order."""
    for k, st in enumerate(h.body):
        if isinstance(st, ast.Raise) or (isinstance(st, ast.Expr) and isinstance(
                st.value, ast.Call) and info.callee_last(st.value) in EXITS):
            if isinstance(st, ast.Expr) and clean_exit(info, st.value):
                return False
            return not any(isinstance(n, _LEAVES) for n in own_nodes(h.body[:k]))
    return False


def failing_return(info: ModuleInfo, fn: Func) -> tuple[ast.Return, int] | None:
    """A `return` in an `except` of `fn` that ends its step on this rank alone, and the line
    of the sync (a backward, an optimizer step, a collective) it skips: in the guarded block
    or after the `try`. Not where the handler shares the failure (a collective in it)."""
    key = ("failing_return", id(fn))
    if key in info._memo:
        return info._memo[key]  # type: ignore[return-value]
    hit = None
    recs = calls_by_func(info).get(id(fn), []) if id(fn) in info.catching else []
    colls = {id(r.node) for r in recs if is_collective(r)}
    syncs = sorted((r.node for r in recs if id(r.node) in colls
                    or r.last in ("backward", "step")), key=lambda c: c.lineno)
    for t in (n for n in (_statements(fn.body) if syncs else ()) if isinstance(n, ast.Try)):
        first, end = t.body[0].lineno, t.body[-1].end_lineno or t.lineno
        # A collective in the guarded block is what failed (a monitored_barrier's timeout
        # read as "a rank ran out of data"), not a step this rank skipped.
        sync = next((n.lineno for n in syncs if n.lineno > (t.end_lineno or end) or
                     first <= n.lineno <= end and id(n) not in colls), None)
        if sync is None:
            continue
        for h in t.handlers:
            if not caught_here(h) or reraises_first(info, h) or any(
                    id(n) in colls for n in own_nodes(h.body)):
                continue
            ret = next((n for n in own_nodes(h.body) if isinstance(n, ast.Return)), None)
            if ret is not None and (hit is None or ret.lineno < hit[0].lineno):
                hit = (ret, sync)
    info._memo[key] = hit
    return hit


def _statements(stmts: list[ast.stmt]) -> Iterator[ast.AST]:
    """The statements of a function's body (and its handlers), not its expressions, not
    those of a function or class it defines."""
    todo: list[ast.AST] = list(stmts)
    while todo:
        s = todo.pop()
        yield s
        if not isinstance(s, _SCOPES):
            for f in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(getattr(s, f, ()))


def _infos(info: ModuleInfo) -> list[ModuleInfo]:
    fs = info.file_set
    return list(getattr(fs, "infos", None) or [info])


def _family(info: ModuleInfo, cls: str) -> set[str]:
    """A class and the classes it names as bases (their last names)."""
    node = info.classes.get(cls)
    return {cls} | {(dotted(b) or "").rsplit(".", 1)[-1] for b in (node.bases if node else [])}


def step_callees(info: ModuleInfo, rec: CallRec) -> list[Site]:
    """What a call in a loop may run: this file's function, another file's through the
    import, or for `self.step()` the method of a subclass (in any file of the project) that
    overrides the base class's stub."""
    out: list[Site] = [(info, f) for f in info.local_callees(rec)]
    f = rec.node.func
    cls = info.func_class.get(rec.func) if rec.func is not None else None
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and \
            f.value.id == "self" and cls is not None:
        for m in _infos(info):
            for fn in m.funcs.get(f.attr, []):
                c = m.func_class.get(fn)
                if c is not None and cls in _family(m, c) and (m, fn) not in out:
                    out.append((m, fn))
    elif not out and (r := resolve(info, rec)) is not None:
        out.append(r)
    return out


def training_calls(info: ModuleInfo, fn: Func, batch_loop: BatchLoop) -> list[tuple[
        ModuleInfo, CallRec]]:
    """The calls of `fn` from a loop over batches, in any file of the project."""
    out = []
    for m in _infos(info):
        if fn.name not in m.call_lasts():
            continue
        for rec in m.calls_named(fn.name):
            if rec.loops and any(batch_loop(m, lp.iter) for lp in rec.loops
                                 if isinstance(lp, ast.For | ast.AsyncFor)) and any(
                    s == (info, fn) for s in step_callees(m, rec)):
                out.append((m, rec))
    return out


def rank_local_tests(info: ModuleInfo, loop: Loop) -> Iterator[tuple[ast.If, str, Site]]:
    """The `if`s of a training loop that read a value its callee returns after this rank's
    own caught error (`succ = self.train_one_step(b)`), or a counter advanced only when that
    value holds (`if succ: step += 1`), and that leave or skip the step (`break`, `continue`,
    a collective, a backward): one rank alone takes them."""
    if not _project_fails(info):
        return
    local: dict[str, Site] = {}
    for rec in info.calls:
        st = rec.stmt
        if loop in rec.loops and isinstance(st, ast.Assign) and st.value is rec.node:
            site = next((s for s in step_callees(info, rec) if failing_return(*s)), None)
            if site is not None:
                for t in st.targets:
                    if (d := dotted(t)) is not None:
                        local[d] = site
    if not local:
        return
    ifs = sorted((n for n in own_nodes(loop.body) if isinstance(n, ast.If)),
                 key=lambda n: n.lineno)
    for s in ifs:  # counters first: they are read later in the body and next iteration
        read = _reads(s.test) & set(local)
        if read:
            for n in own_nodes(s.body):
                if isinstance(n, ast.AugAssign) and (d := dotted(n.target)) is not None:
                    local.setdefault(d, local[min(read)])
    colls = {id(r.node) for r in info.calls if loop in r.loops and is_collective(r)}
    end = 0
    for s in ifs:
        read = _reads(s.test) & set(local)
        if s.lineno > end and read and any(
                isinstance(n, ast.Break | ast.Continue) or id(n) in colls or (
                    isinstance(n, ast.Call) and info.callee_last(n) in ("backward", "step"))
                for n in own_nodes(s.body, loops=False)):
            end = s.end_lineno or s.lineno  # what it holds follows from it: said once
            yield s, min(read), local[min(read)]


def _project_fails(info: ModuleInfo) -> bool:
    """Some function of the project has a failing return (most have none: then no loop's
    calls need resolving)."""
    key = ("project_fails", 0)
    if key not in info._memo:
        info._memo[key] = any(failing_return(m, fn) for m in _infos(info)
                              for fns in m.funcs.values() for fn in fns if id(fn) in m.catching)
    return bool(info._memo[key])


def _reads(test: ast.expr) -> set[str]:
    out = set()
    for n in ast.walk(test):
        if isinstance(n, ast.Name | ast.Attribute) and (d := dotted(n)) is not None:
            out.add(d)
    return out


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
_BROAD = {"Exception", "BaseException"}
# A handler that hands the error to another process (OpenNMT's `error_queue.put((rank,
# traceback.format_exc()))`, read by the parent, which then ends every child) or signals one.
_HANDS_ON = {"put", "put_nowait", "send", "kill", "killpg"}


def _last_try(info: ModuleInfo, body: list[ast.stmt], recs: list[CallRec],
              reaches: Callable[[CallRec], bool]) -> tuple[ast.Try | None, bool]:
    """The `try` that ends `body`, or one followed only by teardown (RARE-UNet's
    `if is_distributed: dist.destroy_process_group()`): nothing after it syncs, raises, or
    exits with a failure (`sys.exit(final_status_code)` hands the failure on)."""
    for i in range(len(body) - 1, -1, -1):
        st = body[i]
        if isinstance(st, ast.Try):
            return st, False
        # a retry loop (pytracking's `for i in range(num_tries): try: ... except: ...`): a
        # rank whose run failed starts it again, or ends it, alone
        if isinstance(st, _LOOPS) and len(st.body) == 1 and isinstance(
                st.body[0], ast.Try) and not st.orelse:
            return st.body[0], True
        lo, hi = st.lineno, st.end_lineno or st.lineno
        if any(isinstance(n, ast.Raise) for n in ast.walk(st)) or any(
                lo <= r.node.lineno <= hi and (reaches(r) or r.last in EXITS
                                               and not clean_exit(info, r.node))
                for r in recs):
            return None, False
    return None, False


def swallowed_run(info: ModuleInfo, fn: Func, reaches: Callable[[CallRec], bool]
                  ) -> tuple[ast.ExceptHandler, str] | None:
    """A catch-all handler around the whole of a rank's run: the last statement of `fn` (or
    the last before teardown) is a `try` whose block reaches a sync (`reaches`: a collective,
    a backward, an optimizer step, through the project's code), and whose `except
    Exception:` (or bare `except:`) neither raises nor exits with a failure nor makes a
    collective. A rank that fails there returns
    normally and ends with status 0, which no launcher reads as a failure, while its peers
    wait for it in the next collective. With it, how the rank leaves: `ends f() normally`, or
    for a retry loop and a raise only when a flag is off, what else it does."""
    if id(fn) not in info.catching or not fn.body:
        return None
    return _swallowed(info, fn.body, calls_by_func(info).get(id(fn), []), reaches,
                      _set_flags(info, fn), f"{fn.name}()")


def _set_flags(info: ModuleInfo, fn: Func) -> set[str]:
    """The parameters of `fn` that hold a true constant on every call: the default
    (`fail_safe=True`) where no call of it in the project passes anything else."""
    a = fn.args
    pos = a.posonlyargs + a.args
    out = {p.arg for p, d in zip(pos[len(pos) - len(a.defaults):], a.defaults, strict=True)
           if isinstance(d, ast.Constant) and d.value is True}
    out |= {p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
            if isinstance(d, ast.Constant) and d.value is True}
    for m in _infos(info) if out else ():
        for rec in m.calls_named(fn.name) if fn.name in m.call_lasts() else ():
            for name in list(out):
                given = passed(fn, rec.node, name)  # the default where the call leaves it out
                if not (isinstance(given, ast.Constant) and given.value is True):
                    out.discard(name)
    return out


def _live(stmts: list[ast.stmt], flags: set[str]) -> Iterator[ast.AST]:
    """`own_nodes` of `stmts`, less the arm of `if flag:` / `if not flag:` that a flag set
    on every call never takes (`if fail_safe: ... else: raise`)."""
    todo: list[ast.AST] = list(stmts)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, _SCOPES):
            continue
        if isinstance(node, ast.If) and flags:
            t, neg = node.test, False
            if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
                t, neg = t.operand, True
            if isinstance(t, ast.Name) and t.id in flags:
                todo.extend(node.orelse if neg else node.body)
                continue
        todo.extend(ast.iter_child_nodes(node))


def swallowed_main(info: ModuleInfo, reaches: Callable[[CallRec], bool]
                   ) -> tuple[ast.ExceptHandler, str] | None:
    """The same catch-all ending the script's `if __name__ == "__main__":` block (HiCForecast's
    `try: train(model, args)` / `except Exception: ... exit()`): the whole of the rank's run."""
    if 0 not in info.catching:
        return None
    main = next((st for st in reversed(info.tree.body) if isinstance(st, ast.If)
                 and is_main_guard(st.test) and st.body), None) if info.has_main else None
    # Without a main block, the script's own statements (MMChat's whole run in one
    # module-level `try:` / `except BaseException: logger.error(...)`).
    if main is not None:
        body = main.body
    elif info.has_main:
        return None
    else:
        # what the script runs: its definitions run nothing
        body = [st for st in info.tree.body if not isinstance(st, _DEFINITIONS)]
        if not body or not any(isinstance(st, ast.Try) for st in body[-3:]):
            return None
    return _swallowed(info, body, calls_by_func(info).get(0, []), reaches,
                      where="the script's run")


def _swallowed(info: ModuleInfo, body: list[ast.stmt], recs: list[CallRec],
               reaches: Callable[[CallRec], bool], flags: frozenset[str] | set[str] = frozenset(),
               where: str = "") -> tuple[ast.ExceptHandler, str] | None:
    t, retry = _last_try(info, body, recs, reaches)
    if t is None:
        return None
    first, end = t.body[0].lineno, t.body[-1].end_lineno or t.lineno
    if not any(first <= r.node.lineno <= end and reaches(r) for r in recs):
        return None
    for h in t.handlers:
        caught = {(dotted(x) or "") for x in
                  (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])} \
            if h.type is not None else set(_BROAD)
        if not caught or not caught <= _BROAD:
            continue
        lo, hi = h.lineno, h.end_lineno or h.lineno
        if any(isinstance(n, ast.Raise) for n in _live(h.body, set(flags))) or any(
                lo <= r.node.lineno <= hi and (is_collective(r) or r.last in _HANDS_ON or
                                               r.last in EXITS and not clean_exit(info, r.node))
                for r in recs):
            continue
        how = (f"starts the retry loop of {where} again on the rank that met it, alone, or "
               f"ends {where} normally there" if retry else
               f"ends {where} normally on the rank that met it")
        flag = sorted(_reads_flags(h, flags)) if any(isinstance(n, ast.Raise)
                                                     for n in own_nodes(h.body)) else []
        if flag:
            how = (f"(with `{flag[0]}` true: its default, and no call passes another value) "
                   + how)
        return h, how
    return None


def _reads_flags(h: ast.ExceptHandler, flags: frozenset[str] | set[str]) -> set[str]:
    return {n.id for n in own_nodes(h.body) if isinstance(n, ast.Name) and n.id in flags}
