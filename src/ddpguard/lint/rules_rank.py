"""Rank rules DDP005-DDP007, DDP016-DDP018: code that runs on some ranks but not others."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from .context import LOCAL, NONE, CallRec, ModuleInfo, dotted

Hit = tuple[ast.AST, str, str]

_COLLECTIVE_PREFIXES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                        "gather", "scatter")
_COLLECTIVE_EXACT = {"barrier", "monitored_barrier", "reduce"}
_EVAL_HINTS = ("eval", "valid", "test", "predict", "infer")
_LOG_CALLS = {"print", "info", "warning", "log", "add_scalar", "add_scalars", "write",
              "log_metrics", "save", "save_checkpoint", "dump"}


def is_collective(rec: CallRec) -> bool:
    if not (rec.last in _COLLECTIVE_EXACT or rec.last.startswith(_COLLECTIVE_PREFIXES)):
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
    for rec in info.calls:
        if not info.effective_guard(rec):
            continue
        f = rec.node.func
        target = dotted(f.value) if isinstance(f, ast.Attribute) and f.attr == "forward" \
            else dotted(f)
        if target in ddp and rec.node.lineno > ddp[target]:
            yield rec.node, "DDP006", (f"forward of the DDP model `{target}` inside a rank "
                                       "branch: DDP's buffer broadcast waits for the other ranks")
            continue
        # `if rank == 0: evaluate(model, ...)` with the DDP wrapper as an argument.
        args = [dotted(a) for a in rec.node.args] + [dotted(k.value) for k in rec.node.keywords]
        passed = [a for a in args if a in ddp and rec.node.lineno > ddp[a]]
        if passed and (info.local_callees(rec) and _forwards_a_param(info.local_callees(rec))
                       or any(h in rec.last.lower() for h in _EVAL_HINTS)):
            yield rec.node, "DDP006", (f"{rec.last}() runs the DDP model `{passed[0]}` on the "
                                       "ranks of this branch only (seed 000's epoch-2 hang)")


def _forwards_a_param(fns: list[ast.FunctionDef | ast.AsyncFunctionDef]) -> bool:
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
    for rec in info.calls:
        if rec.qual == "torch.save" and not info.effective_guard(rec):
            yield rec.node, "DDP007", ("torch.save runs on every rank: all ranks write the same "
                                       "file at once (torn or clobbered checkpoints)")


def ddp016(info: ModuleInfo) -> Iterator[Hit]:
    for rec in info.calls:
        if rec.last != "reduce" or not is_collective(rec) or not rec.node.args:
            continue
        name = dotted(rec.node.args[0])
        if name is None:
            continue
        scope: list[ast.stmt] = list(rec.func.body) if rec.func is not None else info.tree.body
        for node, guard in _guarded_nodes(info, scope):
            end = rec.node.end_lineno or rec.node.lineno
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
        if rec.guard != LOCAL or rec.last not in _LOG_CALLS:
            continue
        if rec.last == "save" and rec.qual != "torch.save":
            continue
        yield rec.node, "DDP017", (f"{rec.last}() is guarded by the local rank in a multi-node "
                                   "script: local rank 0 of every node runs it")


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
