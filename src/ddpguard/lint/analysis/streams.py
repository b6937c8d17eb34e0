"""Streams split by rank inside an `IterableDataset`: no sampler pads them, so each rank
yields its own count, and the uneven-input fixes a program may use instead (DDP's `join`, a
count agreed with an all-reduce MIN)."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator

from .context import ModuleInfo, dotted

__all__ = ["uses_join", "agrees_on_a_count", "stream_shares"]


def uses_join(info: ModuleInfo) -> bool:
    """DDP's `model.join()` or torch's generic `Join` context: ranks may run out of inputs at
    different steps without a hang."""
    return "join" in info.spelled or any(v.endswith("join.Join") for v in info.aliases.values())


def agrees_on_a_count(info: ModuleInfo) -> bool:
    """An all-reduce with MIN (or MAX) somewhere: the usual way to stop every rank at the
    same step (the shortest stream's count, or a 'some rank is done' flag)."""
    return any(isinstance(n, ast.Attribute) and n.attr in ("MIN", "MAX")
               and (dotted(n.value) or "").endswith("ReduceOp")
               for n in ast.walk(info.tree))


def _iterable_classes(info: ModuleInfo) -> Iterator[ast.ClassDef]:
    """Classes derived from an IterableDataset (torch's, through any import spelling, or a
    class of this module that is one)."""
    seen: dict[str, bool] = {}
    for cls in info.classes.values():
        if _iterable(info, cls, seen, 0):
            yield cls


def _iterable(info: ModuleInfo, cls: ast.ClassDef, seen: dict[str, bool], depth: int) -> bool:
    if cls.name in seen:
        return seen[cls.name]
    seen[cls.name] = False  # a cycle of names (a class shadowing its base) ends here
    found = False
    for b in cls.bases:
        last = (dotted(b) or "").rsplit(".", 1)[-1]
        if last == "IterableDataset":
            found = True
        elif depth < 3 and last in info.classes and info.classes[last] is not cls:
            found = _iterable(info, info.classes[last], seen, depth + 1)
        if found:
            break
    seen[cls.name] = found
    return found


def _methods(cls: ast.ClassDef) -> Iterable[ast.FunctionDef]:
    return [s for s in cls.body if isinstance(s, ast.FunctionDef)]


def _yields(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Yield | ast.YieldFrom) for n in ast.walk(fn))


def stream_shares(info: ModuleInfo) -> Iterator[tuple[ast.AST, str, str]]:
    """(node, class, the share's code) for every place an IterableDataset's iteration keeps
    one rank's share of its stream: `i % n == rank` (or `!=` and skip), `islice(it, rank,
    None, n)`, `items[rank::n]`; in `__iter__` or another generator method of the class."""
    for cls in _iterable_classes(info):
        for fn in _methods(cls):
            if fn.name != "__iter__" and not _yields(fn):
                continue
            for n in ast.walk(fn):
                share = _share(info, n)
                if share is not None:
                    yield n, cls.name, share


def _share(info: ModuleInfo, n: ast.AST) -> str | None:
    if isinstance(n, ast.Compare) and len(n.ops) == 1 and \
            isinstance(n.ops[0], ast.Eq | ast.NotEq):
        left, right = n.left, n.comparators[0]
        for mod, other in ((left, right), (right, left)):
            if isinstance(mod, ast.BinOp) and isinstance(mod.op, ast.Mod) and \
                    _rank(info, other):
                return ast.unparse(n)
    if isinstance(n, ast.Call) and info.callee_last(n) == "islice" and len(n.args) >= 4 \
            and _rank(info, n.args[1]):
        return ast.unparse(n)
    if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Slice) and \
            n.slice.lower is not None and n.slice.step is not None and \
            _rank(info, n.slice.lower):
        return ast.unparse(n)
    return None


def _rank(info: ModuleInfo, node: ast.expr) -> bool:
    return bool(info.rank_level(node))
