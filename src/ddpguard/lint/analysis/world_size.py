"""Expressions that stand for the world size, or a whole share of it, in a rank test:
`rank >= world_size` holds on no rank, `rank < size // replication` on some."""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from .provenance import dotted

if TYPE_CHECKING:
    from .ranks import Table

__all__ = ["is_world", "one_gpu_per_process", "world_share"]

_WORLD = re.compile(r"(^|_)(world_size|num_gpus|ngpus|n_gpus|nprocs|num_processes|"
                    r"num_replicas|gpus)$", re.I)


def one_gpu_per_process(info: Table, node: ast.AST) -> bool:
    """`n_gpu` (singular), which the module sets to the literal 1 somewhere: HF's example
    trainers set it to 1 in the distributed arm and to the device count otherwise."""
    d = dotted(node)
    if d is None or d.rsplit(".", 1)[-1] != "n_gpu":
        return False
    return any(isinstance(v, ast.Constant) and v.value == 1 for _, v in info.assigns.get(d, ()))


def is_world(info: Table, node: ast.AST) -> bool:
    if isinstance(node, ast.Call):
        return info.callee_last(node) == "get_world_size"
    d = dotted(node)
    return d is not None and bool(_WORLD.search(d.rsplit(".", 1)[-1]))


def world_share(info: Table, node: ast.AST, depth: int = 0) -> bool:
    """A whole share of the world (`size // replication`, a grid side `proc_row_size(size)`
    held in a name), not the world size itself: `rank >= size` holds on no rank."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
        return _world(info, node.left)
    if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
        last = info.callee_last(node)
        # A function of this file that may fall off its end (CAGNET's cube root: `else:
        # print("CUBE ROOT ERROR")`) rejects the sizes that do not fit: no rank gets past it.
        fns = info.funcs.get(last, [])
        if any(not fn.body or not isinstance(fn.body[-1], ast.Return) for fn in fns):
            return False
        return last not in ("int", "len") and _world(info, node.args[0])
    d = dotted(node)
    if d is None or depth > 1:
        return False
    values = [v for _, v in info.assigns.get(d, [])]
    return bool(values) and all(world_share(info, v, depth + 1) for v in values)


def _world(info: Table, node: ast.AST) -> bool:
    d = dotted(node)
    return is_world(info, node) or (d is not None and d.rsplit(".", 1)[-1] == "size")
