"""Rank rules DDP005-DDP007, DDP016-DDP018: code that runs on some ranks but not others."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from .context import (
    COLLECTIVE_EXACT,
    COLLECTIVE_PREFIXES,
    LOCAL,
    NONE,
    CallRec,
    Func,
    ModuleInfo,
    dotted,
    kwarg,
)

# (node, code, message[, severity]): see engine.RuleFn
Hit = tuple[ast.AST, str, str] | tuple[ast.AST, str, str, str]

_EVAL_HINTS = ("eval", "valid", "test", "predict", "infer")
_LOG_CALLS = {"print", "info", "warning", "log", "add_scalar", "add_scalars", "write",
              "log_metrics", "save", "save_checkpoint", "dump"}


def is_collective(rec: CallRec) -> bool:
    if not (rec.last in COLLECTIVE_EXACT or rec.last.startswith(COLLECTIVE_PREFIXES)):
        return False
    return (rec.qual or "").startswith("torch.distributed.")


def ddp005(info: ModuleInfo) -> Iterator[Hit]:
    for rec in info.calls:
        if is_collective(rec) and info.effective_guard(rec):
            yield rec.node, "DDP005", (f"{rec.last}() is called only on the ranks that take "
                                       "this rank branch; the others never join and it hangs")


def ddp006(info: ModuleInfo) -> Iterator[Hit]:
    ddp = info.ddp_names()
    if not ddp:
        return
    # Certain to hang only when the wrapper has buffers to broadcast: BatchNorm (or an
    # explicit register_buffer) in this module, and broadcast_buffers not switched off.
    sev = "error" if (info.batchnorm or info.buffers) and not any(
        isinstance(k.value, ast.Constant) and k.value.value is False
        for r in info.calls if r.last == "DistributedDataParallel" or r.last.endswith("_DDP")
        for k in r.node.keywords if k.arg == "broadcast_buffers") else "warning"
    why = ("DDP's buffer broadcast at the start of every forward waits for the other ranks "
           "(a hang whenever the model has buffers, e.g. BatchNorm)")
    for rec in info.calls:
        level = info.effective_guard(rec)
        if not level:
            continue
        f = rec.node.func
        target = dotted(f.value) if isinstance(f, ast.Attribute) and f.attr == "forward" \
            else dotted(f)
        if target in ddp:
            if rec.guard and rec.node.lineno > ddp[target]:
                yield (rec.node, "DDP006", f"forward of the DDP model `{target}` inside a "
                       f"rank branch: {why}", sev)
                continue
            site = _guarded_site(info, rec)
            if not rec.guard and site is not None and site.node.lineno > ddp[target] \
                    and rec.func is not None and _global_to(rec.func, target):
                yield (rec.node, "DDP006", f"forward of the DDP model `{target}` in "
                       f"{rec.func.name}(), which is called only inside a rank branch (line "
                       f"{site.node.lineno}): {why}", sev)
                continue
        if not rec.guard:
            continue
        # `if rank == 0: evaluate(model, ...)` with the DDP wrapper as an argument.
        args = [dotted(a) for a in rec.node.args] + [dotted(k.value) for k in rec.node.keywords]
        passed = [a for a in args if a in ddp and rec.node.lineno > ddp[a]]
        if passed and (info.local_callees(rec) and _forwards_a_param(info.local_callees(rec))
                       or any(h in rec.last.lower() for h in _EVAL_HINTS)):
            yield (rec.node, "DDP006", f"{rec.last}() runs the DDP model `{passed[0]}` on the "
                   f"ranks of this branch only: {why}", sev)


def _guarded_site(info: ModuleInfo, rec: CallRec) -> CallRec | None:
    """The rank-guarded call that makes `rec`'s function run on some ranks only."""
    for site in info.calls:
        if site.guard and rec.func in info.local_callees(site):
            return site
    return None


def _global_to(fn: Func, name: str) -> bool:
    """`name` inside `fn` is the module's (or the instance's) object, not a parameter."""
    if name.startswith("self."):
        return True
    params = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
    return name.split(".", 1)[0] not in params


def _forwards_a_param(fns: list[Func]) -> bool:
    for fn in fns:
        params = {a.arg for a in fn.args.args} - {"self"}
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in params:
                return True
    return False


def ddp007(info: ModuleInfo) -> Iterator[Hit]:
    if not info.distributed:
        return
    used: set[str] | None = None
    for rec in info.calls:
        if rec.qual != "torch.save" or info.effective_guard(rec) or _in_memory(info, rec.node):
            continue
        # A helper nobody here calls (`utils.save_checkpoint`) runs under its caller's guard,
        # which lives in another module: no claim about it can be true here.
        if rec.func is not None:
            used = _referenced_names(info) if used is None else used
            if rec.func.name not in used:
                continue
        yield rec.node, "DDP007", ("torch.save runs on every rank: all ranks write the same "
                                   "file at once (torn or clobbered checkpoints)")


def _referenced_names(info: ModuleInfo) -> set[str]:
    """Function names this module calls or passes on (`mp.spawn(main_worker, ...)`)."""
    out: set[str] = set()
    for rec in info.calls:
        f = rec.node.func
        out.add(f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name)
                else "")
        for a in [*rec.node.args, *(k.value for k in rec.node.keywords)]:
            name = dotted(a)
            if name is not None:
                out.add(name.rsplit(".", 1)[-1])
    return out


def _in_memory(info: ModuleInfo, call: ast.Call) -> bool:
    """`torch.save(obj, io.BytesIO())`: a buffer per process, nothing shared is written."""
    dest = call.args[1] if len(call.args) > 1 else kwarg(call, "f")
    if dest is None:
        return False
    return any(isinstance(v, ast.Call) and info.callee_last(v) == "BytesIO"
               for v in [dest, *info.values_of(dest)])


def ddp016(info: ModuleInfo) -> Iterator[Hit]:
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
        for node, guard in _guarded_nodes(info, scope):
            if guard or node.lineno <= end:
                continue
            if isinstance(node, ast.Name | ast.Attribute) and dotted(node) == name \
                    and isinstance(getattr(node, "ctx", None), ast.Load):
                yield node, "DDP016", (f"`{name}` is read on every rank after dist.reduce "
                                       f"(line {rec.node.lineno}); only the dst rank holds the sum")
                break


def _guarded_nodes(info: ModuleInfo, stmts: list[ast.stmt],
                   guard: int = NONE) -> Iterator[tuple[ast.expr, int]]:
    for s in stmts:
        if isinstance(s, ast.If):
            level = info.rank_level(s.test)
            yield from _expr_nodes(s.test, guard)
            yield from _guarded_nodes(info, s.body, guard or level)
            yield from _guarded_nodes(info, s.orelse, guard or level)
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


def ddp017(info: ModuleInfo) -> Iterator[Hit]:
    if not info.multi_node:
        return
    for rec in info.calls:
        if rec.guard != LOCAL:
            continue
        saved = _saves_in(info, info.local_callees(rec), 2)
        if saved is not None:
            yield rec.node, "DDP017", (
                f"{rec.last}() writes a checkpoint (torch.save, line {saved}) under a "
                "local-rank test in a multi-node script: local rank 0 of every node writes "
                "the same file")
        elif rec.last in _LOG_CALLS and (rec.last != "save" or rec.qual == "torch.save"):
            yield rec.node, "DDP017", (f"{rec.last}() is guarded by the local rank in a "
                                       "multi-node script: local rank 0 of every node runs it")


def _saves_in(info: ModuleInfo, fns: list[Func], depth: int) -> int | None:
    """Line of a torch.save that `fns` reach (through local calls, `depth` levels)."""
    for rec in info.calls:
        if rec.func in fns:
            if rec.qual == "torch.save" and not _in_memory(info, rec.node):
                return rec.node.lineno
            if depth and (line := _saves_in(info, info.local_callees(rec), depth - 1)):
                return line
    return None


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


RULES = {"DDP005": ddp005, "DDP006": ddp006, "DDP007": ddp007, "DDP016": ddp016,
         "DDP017": ddp017, "DDP018": ddp018}
