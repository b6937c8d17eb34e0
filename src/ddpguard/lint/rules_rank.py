"""Rank rules: what runs on some ranks but not others. DDP005/DDP006/DDP019 read the
collective schedule (diverge.py), DDP007 the file writes each rank class reaches."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

from .buffers import wrapped_model_has_no_buffers
from .callgraph import is_collective, mode_without_group, params_of, reaches, resolve
from .context import CallRec, Func, ModuleInfo, dotted, kwarg
from .crossfile import runs_as_a_group
from .diverge import divergences
from .projection import project
from .provenance import LOCAL, NONE
from .ranks import OTHERS, RANK0
from .registry import Hit, rule


class At(ast.AST):
    """A position for a finding that is no single AST node (a divergence)."""

    _fields = ()

    def __init__(self, line: int, col: int = 0) -> None:
        super().__init__()
        self.lineno, self.col_offset = line, col


@rule("DDP005", "collective-divergence", "error",
      "two rank classes reach different collective sequences (a collective only some ranks "
      "call, or a different one on each side)",
      "call the same collectives, in the same order, on every rank (outside the rank branch)",
      preview=True)
def ddp005(info: ModuleInfo) -> Iterator[Hit]:
    """Every rank must call the same collectives in the same order; one that waits in a
    collective the others never reach waits until the NCCL timeout (docs/pitfalls.md).
    A preview rule since issue 20's twelfth round: each blind half showed a new shape of
    code whose ranks the text cannot tell apart (0 true, 6 false at first contact)."""
    for d in divergences(info):
        if d.code == "DDP005":
            yield At(d.line), "DDP005", d.message


@rule("DDP006", "ddp-forward-divergence", "error",
      "forward of the DDP-wrapped model on some rank classes only (directly or in a helper); "
      "error when the module visibly has buffers (BatchNorm)",
      "evaluate on every rank, or call model.module(...) on rank 0")
def ddp006(info: ModuleInfo) -> Iterator[Hit]:
    """DDP broadcasts the module's buffers at the start of each forward and waits for every
    rank: a forward on rank 0 alone hangs as soon as the model has a buffer (docs/pitfalls.md)."""
    found = [d for d in divergences(info) if d.code == "DDP006"]
    if found and _buffers_maybe_unsynced(info):
        # Under no_grad a forward's only collective is the buffer broadcast; with
        # `broadcast_buffers` set from a config (modulus: False by default) that is unproven.
        found = [d for d in found if not d.no_grad]
    if found and all(d.no_grad for d in found) and not (info.batchnorm or info.buffers) \
            and wrapped_model_has_no_buffers(info):
        # Under no_grad the buffer broadcast is the forward's one collective, and the model
        # is built, visibly, from layers without buffers.
        found = []
    if not found:
        return
    sev = "error" if (info.batchnorm or info.buffers) and not any(
        isinstance(k.value, ast.Constant) and k.value.value is False
        for r in info.calls if r.last == "DistributedDataParallel" or r.last.endswith("_DDP")
        for k in r.node.keywords if k.arg == "broadcast_buffers") else "warning"
    tail = ("; DDP broadcasts the module's buffers (visible in this file) before this "
            "forward and waits for the other ranks, which make no matching broadcast: it hangs") \
        if sev == "error" else (
            "; if the model has buffers (e.g. BatchNorm) and broadcast_buffers is on, DDP "
            "broadcasts them before this forward and waits for the other ranks, which make no "
            "matching broadcast: it hangs")
    for d in found:
        yield At(d.line), "DDP006", d.message + tail, sev


def _buffers_maybe_unsynced(info: ModuleInfo) -> bool:
    """Every DDP wrap of the module passes `broadcast_buffers=` something other than a
    literal True."""
    wraps = [r for r in info.calls if r.last == "DistributedDataParallel" or r.last == "DDP"]
    return bool(wraps) and all(any(
        k.arg == "broadcast_buffers" and not (isinstance(k.value, ast.Constant)
                                              and k.value.value is True)
        for k in r.node.keywords) for r in wraps)


@rule("DDP019", "exit-before-collective", "warning",
      "one rank class can leave in good order (return, break, continue, sys.exit) where the "
      "others go on to a collective",
      "check the condition on every rank (or broadcast it) before anyone leaves")
def ddp019(info: ModuleInfo) -> Iterator[Hit]:
    """A `return` that only rank 0 takes, just before a broadcast: when it runs, the other
    ranks wait in the broadcast for a rank that is gone, and no launcher notices (the rank
    did not fail). A `raise` is DDP022's (issue 20, round 11)."""
    for d in divergences(info):
        if d.code == "DDP019":
            yield At(d.line), "DDP019", d.message


@rule("DDP022", "failure-before-collective", "warning",
      "an assert or raise that only some rank classes reach, before a collective the others "
      "go on to",
      "check the condition on every rank (or broadcast it) before anyone can fail",
      default=False)
def ddp022(info: ModuleInfo) -> Iterator[Hit]:
    """An `assert` or `raise` that only rank 0 reaches, just before a broadcast: if it fires,
    the other ranks wait for a rank that is gone, unless the launcher ends the job (torchrun,
    torch.distributed.launch and mp.spawn stop every worker when one fails; srun without
    --kill-on-bad-exit does not). Off by default: on real code most such asserts are
    invariants that cannot fire (1 true in 7 on the tuning corpora of issue 20's sixth
    round), and a rank-0 `raise` under torchrun ends the job with its own error (issue 20,
    round 11: judged false on first contact; rounds 6-9: 2 debatable)."""
    for d in divergences(info):
        if d.code == "DDP022":
            yield At(d.line), "DDP022", d.message


_WRITE_HINT = {"save", "dump", "savez", "savez_compressed"}


@rule("DDP007", "shared-file-write", "warning",
      "every rank writes the same file (torch.save, pickle.dump, np.save to a path that does "
      "not depend on the rank)",
      "write on rank 0 only (then barrier), or put the rank in the file name", default=False)
def ddp007(info: ModuleInfo) -> Iterator[Hit]:
    """Rank 0 and the ranks > 0 both reach a write of one path: the writes race, and when
    the contents differ per rank (shards, per-rank state) all but one are lost."""
    if not info.distributed or not (runs_as_a_group(info) or (
            info.project is not None and info.project.in_group(info))):  # type: ignore[attr-defined]
        return
    # Only writes outside every rank branch (the walker's guards) can be reached by all
    # classes; the schedule then decides, through callers, launch-mode arms and other files.
    if not any(r.last in _WRITE_HINT and not info.effective_guard(r) for r in info.calls):
        return
    called = {id(fn) for rec in info.calls for fn in info.local_callees(rec)}
    used: tuple[set[str], set[str]] | None = None
    roots: list[Func | None] = [None, *(f for fns in info.funcs.values() for f in fns
                                        if id(f) not in called and reaches(info, id(f)))]
    done: set[int] = set()
    for root in roots:
        zero = {id(ev) for ev, *_ in project(info, root, RANK0).writes}
        if not zero:
            continue
        for ev, via, per_rank, paths in project(info, root, OTHERS).writes:
            if id(ev) not in zero or per_rank or id(ev) in done:
                continue
            lines = [ln for ln, p in zip([*via, ev.line], [*paths, ev.path or info.path],
                                         strict=False) if p == info.path]
            if mode_without_group(info, lines) or (
                    (ev.path or info.path) == info.path and _dump_on_the_way_out(info, ev.line)):
                continue
            if root is not None:
                # A helper nobody here calls runs under its caller's guard, elsewhere (also
                # when it writes through another helper: fairseq's save_ema_as_checkpoint).
                used = _referenced_names(info) if used is None else used
                # A method may be called on any object (`ckpt.save()`); a function of the
                # module only by its own name (LSGM's unused `utils.save` is no method of
                # the `writer.save()` the module calls).
                names = used[0] if root in info.func_class else used[1]
                if root.name not in names or (root in info.func_class and
                                              not _live_method_call(info, root.name, called)):
                    continue
            done.add(id(ev))
            if ev.path and ev.path != info.path and via:
                # A write in another file: reported here, at the last call of this file on the
                # way to it.
                here = max(k for k, p in enumerate(paths) if p == info.path)
                yield At(via[here]), "DDP007", (
                    f"rank 0 and the ranks > 0 all reach the {ev.op} of `{ev.text}` at "
                    f"{os.path.basename(ev.path)}:{ev.line} through this call: every rank "
                    "writes the same file at once (torn or clobbered, and only one rank's "
                    "contents survive)")
                continue
            # the call that runs the writing function (a nested helper's call, not `main()`)
            how = f" (through the call at line {via[-1]})" if via else ""
            yield At(ev.line), "DDP007", (
                f"rank 0 and the ranks > 0 all reach this {ev.op} of `{ev.text}`{how}: every "
                "rank writes the same file at once (torn or clobbered, and only one rank's "
                "contents survive)")


def _dump_on_the_way_out(info: ModuleInfo, line: int) -> bool:
    """The write sits in a block that ends the process (`if not math.isfinite(loss):
    torch.save(batch, "debug.pt"); sys.exit(1)`): a crash dump, not a checkpoint."""
    spans: list[tuple[int, int]] | None = info._memo.get(("dump_spans", 0))  # type: ignore[assignment]
    if spans is None:
        spans = info._memo[("dump_spans", 0)] = [
            (node.body[0].lineno, node.body[-1].end_lineno or 0) for node in ast.walk(info.tree)
            if isinstance(node, ast.If) and node.body and _ends_process(node.body[-1])]
    return any(first <= line <= last for first, last in spans)


def _ends_process(st: ast.stmt) -> bool:
    return isinstance(st, ast.Raise) or (
        isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)
        and (dotted(st.value.func) or "") in ("sys.exit", "exit", "os._exit", "quit"))


def _live_method_call(info: ModuleInfo, name: str, called: set[int]) -> bool:
    """Some `obj.name(...)` runs when the program's own code runs: at module level, in a
    function called in its file or passed on by its bare name, or in a method that such a
    call reaches (also from the other files on the command line). Only from inside methods
    nobody calls (RetroMAE's `save()`, which HF's Trainer calls on the process that saves),
    it runs wherever the framework calls them."""
    project = info.project
    infos = getattr(project, "infos", None) or [info]
    live: set[str] | None = getattr(project, "live_attrs", None)
    if live is None:
        live = _live_attrs(infos, {id(info): called})
        if project is not None:
            project.live_attrs = live  # type: ignore[attr-defined]
    return name in live


def _live_attrs(infos: list[ModuleInfo], known: dict[int, set[int]]) -> set[str]:
    sites: list[tuple[str, bool, str | None]] = []   # (name, live by place, enclosing method)
    for inf in infos:
        called = known.get(id(inf)) or {id(fn) for rec in inf.calls
                                         for fn in inf.local_callees(rec)}
        modules = set(inf.aliases) | {(a.asname or a.name).split(".", 1)[0] for s in
                                      inf.tree.body if isinstance(s, ast.Import)
                                      for a in s.names}
        bare = {rec.node.func.id for rec in inf.calls if isinstance(rec.node.func, ast.Name)}
        for rec in inf.calls:
            f = rec.node.func
            if not isinstance(f, ast.Attribute) or \
                    (dotted(f.value) or "").split(".", 1)[0] in modules:
                continue
            fn = rec.func
            here = fn is None or id(fn) in called or fn not in inf.func_class or fn.name in bare
            sites.append((f.attr, here, None if here or fn is None else fn.name))
    live = {n for n, here, _ in sites if here}
    for _ in range(4):
        more = {n for n, here, m in sites if not here and m in live} - live
        if not more:
            break
        live |= more
    return live


def _referenced_names(info: ModuleInfo) -> tuple[set[str], set[str]]:
    """Function names this module calls or passes on (`mp.spawn(main_worker, ...)`): every
    name, and the names used bare (a call `f(...)`, a value `f`), not as an attribute."""
    out: set[str] = set()
    bare: set[str] = set()
    for rec in info.calls:
        f = rec.node.func
        if isinstance(f, ast.Attribute):
            # a method call on an object may be this module's method (`_live_method_call`
            # then leaves out `torch.save(...)`, a module's function)
            out.add(f.attr)
        elif isinstance(f, ast.Name):
            out.add(f.id)
            bare.add(f.id)
        params = params_of(rec.func) if rec.func is not None else set()
        for a in [*rec.node.args, *(k.value for k in rec.node.keywords)]:
            name = dotted(a)
            if name is not None:
                out.add(name.rsplit(".", 1)[-1])
                # a function passed on (`mp.spawn(main_worker)`), not a variable of that
                # name (LSGM's `save` directory, a parameter)
                if isinstance(a, ast.Name) and a.id not in params and a.id not in info.assigns:
                    bare.add(a.id)
    return out, bare


def _in_memory(info: ModuleInfo, call: ast.Call) -> bool:
    """`torch.save(obj, io.BytesIO())`: a buffer per process, nothing shared is written."""
    dest = call.args[1] if len(call.args) > 1 else kwarg(call, "f")
    if dest is None:
        return False
    return any(isinstance(v, ast.Call) and info.callee_last(v) == "BytesIO"
               for v in [dest, *info.values_of(dest)])


@rule('DDP016', 'reduce-read-on-all-ranks', 'warning',
      'result of dist.reduce read on every rank (only dst holds the sum)',
      'use dist.all_reduce, or read the result only on rank dst', default=False)
def ddp016(info: ModuleInfo) -> Iterator[Hit]:
    """Off by default: on real code the other ranks mostly read the partial sum into metrics
    that only rank 0 logs (OLMo, YOLOX), which is harmless; 0 of 12 findings on the two
    corpora's tuning data were worth acting on. `--select DDP016` for a script whose
    non-dst ranks act on the value."""
    for rec in info.calls:
        if rec.last != "reduce" or not is_collective(rec) or not rec.node.args:
            continue
        name = dotted(rec.node.args[0])
        if name is None:
            continue
        scope: list[ast.stmt] = list(rec.func.body) if rec.func is not None else info.tree.body
        end = rec.node.end_lineno or rec.node.lineno
        # Statements that end before the reduce cannot read its result: skip their subtrees.
        scope = [st for st in scope if (st.end_lineno or st.lineno) > end]
        uses = [(node, guard) for node, guard in _guarded_nodes(info, scope)
                if node.lineno > end and isinstance(node, ast.Name | ast.Attribute)
                and dotted(node) == name]
        if any(guard for _, guard in uses):
            continue  # the author treats it under a rank test too: dst's result is the point
        reads = [(n, g) for n, g in uses if isinstance(getattr(n, "ctx", None), ast.Load)]
        passed = _passed_to(info, scope)
        reads = [(n, g) for n, g in reads if id(n) not in passed
                 or _callee_reads(info, *passed[id(n)])]
        for node, _ in reads[:1]:
            yield node, "DDP016", (f"`{name}` is read on every rank after dist.reduce "
                                   f"(line {rec.node.lineno}); only the dst rank holds the sum")


# A value handed to one of these is read right there, on whatever rank makes the call.
_READERS = {"float", "int", "round", "str", "list", "tuple", "abs", "sum", "max", "min", "len",
            "bool", "print", "format"}


def _passed_to(info: ModuleInfo, scope: list[ast.stmt]) -> dict[int, tuple[CallRec, int | str]]:
    """Names handed straight to a call as an argument: id(node) -> (call, position or
    keyword)."""
    recs = {id(r.node): r for r in info.calls}
    out: dict[int, tuple[CallRec, int | str]] = {}
    for st in scope:
        for node in ast.walk(st):
            rec = recs.get(id(node)) if isinstance(node, ast.Call) else None
            if rec is None:
                continue
            for i, a in enumerate(rec.node.args):
                out[id(a)] = (rec, i)
            for k in rec.node.keywords:
                if k.arg is not None:
                    out[id(k.value)] = (rec, k.arg)
    return out


def _callee_reads(info: ModuleInfo, rec: CallRec, where: int | str) -> bool:
    """Does the callee read this argument outside a rank test of its own (`if not
    is_main_process(): return` first)? A callee that cannot be found proves nothing."""
    if rec.last in _READERS and rec.qual in (None, rec.last):
        return True
    target = resolve(info, rec)
    if target is None:
        return False
    minfo, fn = target
    names = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
    if names and names[0] in ("self", "cls") and isinstance(rec.node.func, ast.Attribute):
        names = names[1:]
    if isinstance(where, int):
        if where >= len(names):
            return False
        where = names[where]
    return any(not guard and isinstance(node, ast.Name) and node.id == where
               and isinstance(node.ctx, ast.Load)
               for node, guard in _guarded_nodes(minfo, list(fn.body)))


def _guarded_nodes(info: ModuleInfo, stmts: list[ast.stmt],
                   guard: int = NONE) -> Iterator[tuple[ast.expr, int]]:
    for s in stmts:
        if isinstance(s, ast.If):
            level = info.rank_level(s.test)
            yield from _expr_nodes(s.test, guard)
            yield from _guarded_nodes(info, s.body, guard or level)
            yield from _guarded_nodes(info, s.orelse, guard or level)
            if level and not s.orelse and s.body and isinstance(
                    s.body[-1], ast.Return | ast.Raise | ast.Continue | ast.Break):
                guard = guard or level  # `if rank != dst: return`: the rest is dst's only
            continue
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for child in ast.iter_child_nodes(s):
            if isinstance(child, ast.stmt):
                yield from _guarded_nodes(info, [child], guard)
            elif isinstance(child, ast.expr):
                yield from _expr_nodes(child, guard)


def _expr_nodes(root: ast.expr, guard: int) -> Iterator[tuple[ast.expr, int]]:
    for node in ast.walk(root):
        if isinstance(node, ast.expr):
            yield node, guard


@rule('DDP017', 'local-rank-zero-writes', 'warning',
      'a local-rank test (`local_rank == 0`, `rank % ngpus_per_node == 0`) decides '
      'checkpointing in a multi-node script',
      'use the global rank (dist.get_rank() == 0)', default=False)
def ddp017(info: ModuleInfo) -> Iterator[Hit]:
    """Off by default since issue 20's seventh round: whether every node's local rank 0
    writing one file matters depends on a shared file system the code does not show;
    independent reviewers called 4 of 5 first-contact findings debatable (VAR's per-node
    checkpoints, the old example trainers' `local_rank in [-1, 0]` saves)."""
    if not info.multi_node:
        return
    seen: set[tuple[object, ...]] = set()
    for rec in info.calls:
        if rec.guard != LOCAL:
            continue
        # One finding per guarded block: the args, the optimizer and the scheduler saved one
        # after another under the same test are one decision to fix, not three.
        block = (id(rec.func), rec.branch)
        if block in seen:
            continue
        saved = _saves_in(info, info.local_callees(rec), 2)
        if saved is not None:
            seen.add(block)
            yield rec.node, "DDP017", (
                f"{rec.last}() writes a checkpoint (torch.save, line {saved}) under a "
                "local-rank test in a multi-node script: local rank 0 of every node writes "
                "the same file")
        elif rec.qual == "torch.save" and not _in_memory(info, rec.node):
            seen.add(block)
            yield rec.node, "DDP017", ("torch.save is guarded by the local rank in a "
                                       "multi-node script: local rank 0 of every node writes "
                                       "the same file")


def _saves_in(info: ModuleInfo, fns: list[Func], depth: int) -> int | None:
    """Line of a torch.save that `fns` reach (through local calls, `depth` levels). A save
    under a local-rank test of its own is reported where it is, not again at every call."""
    for rec in info.calls:
        if rec.func in fns:
            if rec.qual == "torch.save" and not _in_memory(info, rec.node):
                if rec.guard == LOCAL:
                    continue
                return rec.node.lineno
            if depth and (line := _saves_in(info, info.local_callees(rec), depth - 1)):
                return line
    return None


@rule('DDP018', 'unguarded-print', 'info',
      'print on every rank',
      'guard with `if rank == 0:` or include the rank in the message', default=False)
def ddp018(info: ModuleInfo) -> Iterator[Hit]:
    if not info.distributed:
        return
    for rec in info.calls:
        if rec.qual != "print" or info.effective_guard(rec):
            continue
        mentions_rank = any(
            info.rank_level(n) for a in rec.node.args for n in ast.walk(a)
            if isinstance(n, ast.Name | ast.Attribute | ast.Call | ast.Subscript))
        if not mentions_rank:
            yield rec.node, "DDP018", "print runs on every rank (duplicated output)"


RULES = [ddp005, ddp006, ddp007, ddp016, ddp017, ddp018, ddp019, ddp022]
