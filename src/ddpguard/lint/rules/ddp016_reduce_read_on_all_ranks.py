"""DDP016 dist.reduce result read on every rank.

After `dist.reduce(t, dst=k)` only rank k holds the sum; reading `t` unguarded gives other ranks
garbage. An early `if rank != dst: return` guards the rest; a function that also treats the
result under a rank test (detectron2's `reduce_dict`) knows it. Pitfall in
[pitfalls.md](pitfalls.md). A reduced tensor handed to a function of the same files is read only
if that function reads it outside its own rank guard (YOLOX's `evaluate_prediction` returns at
once on other ranks); handed to a builtin (`float`, `print`, ...) it is read; handed to an
unknown function it proves nothing. Fix: `all_reduce`, or read it under `if rank == k`. Off by
default: on real code the other ranks mostly read the partial sum into metrics that only rank 0
logs (OLMo's optimizer metrics, YOLOX), which is harmless; 0 of 12 findings on tuning data were
worth acting on. `--extend-select DDP016`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.callgraph import is_collective, resolve
from ..analysis.context import (
    CallRec,
    ModuleInfo,
    dotted,
)
from ..analysis.provenance import NONE
from ..registry import Hit, rule


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


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.distributed as dist

dist.reduce(loss, dst=0)
print(f"mean loss {loss.item() / world_size}")  # only rank 0 holds the sum
"""

RULE = ddp016
