"""DDP003 uneven manual shard.

Data cut by hand: `items[rank::world_size]`, `np.array_split(x, world_size)[rank]` (also
`chunk`/`split`/`tensor_split`). Not reported where the list was padded to a multiple of the
world size just above, where it comes from `tensor_split(n)`/`array_split(x, n)` with `n` a
multiple of the world size (they always return `n` pieces, some empty; `chunk` may return
fewer), or where any file on the command line trains under DDP's `model.join()` (or torch's
`Join`), which handles uneven inputs. When the length does not divide by the world size the
ranks get different sample counts, run different numbers of steps, and the extra step's
all-reduce hangs. Not reported for torch's `DistributedSampler`: it pads (or, with
`drop_last=True`, trims) so every rank gets the same number of samples and the same last batch,
whatever `drop_last` (field reports blame `drop_last=False`; that is not what made their ranks
diverge). Also not reported where the list grows from itself before the cut (`indices +=
indices[:total - len(indices)]`, torch's own sampler arithmetic) or the share's length is
asserted right after. Fix: DistributedSampler, or pad/trim every shard to the same length. Off
by default: on real code it was right 0 times in 11 (the shards were even, or fed loops without
collectives and a size-aware gather). `--extend-select DDP003`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import (
    Func,
    ModuleInfo,
    dotted,
)
from ..analysis.streams import uses_join
from ..registry import Hit, rule


@rule('DDP003', 'uneven-manual-shard', 'warning',
      'data sharded by hand (`x[rank::world_size]`, `array_split(x, world)[rank]`): ranks '
      'can get different sample counts',
      'use DistributedSampler (it pads), or pad/trim every shard to the same length',
      default=False)
def ddp003(info: ModuleInfo) -> Iterator[Hit]:
    """Manual sharding. torch's DistributedSampler pads (or with drop_last trims) so every
    rank gets the same number of samples; `data[rank::world_size]` and
    `np.array_split(data, world_size)[rank]` do not when the length does not divide. Code
    that trains under DDP's `join` (in any file linted with it) handles uneven inputs.

    Off by default: on real code the shards it found were even
    (padded by the sampler's own arithmetic) or fed loops without collectives followed by a
    size-aware gather, 0 true in 11 findings over every corpus. `--extend-select DDP003`."""
    # Asked only of a module with a candidate slice (every file of the set is read).
    if not info.subscripts or any(map(uses_join, getattr(info.file_set, "infos", [info]))):
        return
    for node in info.subscripts:
        sl = node.slice
        if isinstance(sl, ast.Slice):
            if sl.lower is not None and sl.step is not None and info.rank_level(sl.lower) \
                    and _world_size(info, sl.step) and not _padded(info, node.value) \
                    and not _counts_the_remainder(info, node) \
                    and not _padded_in_place(info, node):
                yield node, "DDP003", _msg003(ast.unparse(node))
        elif isinstance(node.value, ast.Call) and info.rank_level(sl) and \
                info.callee_last(node.value) in _SPLITS and \
                any(_world_size(info, a) for a in node.value.args[1:]):
            yield node, "DDP003", _msg003(ast.unparse(node))


_SPLITS = {"array_split", "chunk", "split", "tensor_split"}


def _padded(info: ModuleInfo, seq: ast.expr) -> bool:
    """The list was padded to a multiple of the world size just above (`pad(...)`, `x +
    x[:pad]`, a name with `pad` in it): every rank's slice has the same length."""
    values = [seq, *(v for _, v in info.assigns.get(dotted(seq) or "", []))]
    if any(_split_into_world_multiple(info, v) for v in values):
        return True
    for v in values:
        for n in ast.walk(v):
            name = info.callee_last(n) if isinstance(n, ast.Call) else (
                dotted(n) or "" if isinstance(n, ast.Name | ast.Attribute) else "")
            if "pad" in name.lower():
                return True
    return False


def _innermost_func(info: ModuleInfo, node: ast.AST) -> Func | None:
    line = getattr(node, "lineno", 0)
    fns = [f for fs in info.funcs.values() for f in fs
           if f.lineno <= line <= (f.end_lineno or f.lineno)]
    return max(fns, key=lambda f: f.lineno) if fns else None


def _padded_in_place(info: ModuleInfo, node: ast.Subscript) -> bool:
    """The sequence grows from itself before it is cut (`indices += indices[:total -
    len(indices)]`, torch's own DistributedSampler arithmetic, copied into every RASampler),
    or the cut's length is asserted right after (`assert len(indices) == self.num_samples`):
    the author made every rank's share the same size."""
    seq = dotted(node.value)
    fn = _innermost_func(info, node)
    if seq is None or fn is None:
        return False
    for n in ast.walk(fn):
        if isinstance(n, ast.AugAssign) and dotted(n.target) == seq and \
                isinstance(n.op, ast.Add | ast.Mult) and _mentions(n.value, seq):
            return True
        if isinstance(n, ast.Assign) and any(dotted(t) == seq for t in n.targets) and \
                isinstance(n.value, ast.BinOp) and isinstance(n.value.op, ast.Add) and \
                _mentions(n.value.left, seq) and _mentions(n.value.right, seq):
            return True
        if isinstance(n, ast.Assert) and n.lineno > node.lineno and \
                isinstance(n.test, ast.Compare) and isinstance(n.test.ops[0], ast.Eq) and \
                any(isinstance(c, ast.Call) and info.callee_last(c) == "len" and c.args and
                    dotted(c.args[0]) == seq for c in ast.walk(n.test.left)):
            return True
    return False


def _mentions(expr: ast.expr, name: str) -> bool:
    return any(dotted(n) == name for n in ast.walk(expr)
               if isinstance(n, ast.Name | ast.Attribute))


def _counts_the_remainder(info: ModuleInfo, node: ast.AST) -> bool:
    """The function that cuts the shard also computes `len(x) // world_size` (nnU-Net's
    `last_barrier_at_idx`): its author sized what every rank has in common."""
    fn = _innermost_func(info, node)
    if fn is None:
        return False
    for n in ast.walk(fn):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.FloorDiv) and \
                _world_size(info, n.right) and any(
                    isinstance(c, ast.Call) and info.callee_last(c) == "len"
                    for c in ast.walk(n.left)):
            return True
    return False


def _split_into_world_multiple(info: ModuleInfo, v: ast.expr) -> bool:
    """`x.tensor_split(n)` / `np.array_split(x, n)` with n a multiple of the world size: they
    always return n pieces (some may be empty), so a stride of the world size is even."""
    if not isinstance(v, ast.Call) or info.callee_last(v) not in ("tensor_split",
                                                                   "array_split"):
        return False
    return any(_world_multiple(info, a) for a in v.args)


def _world_multiple(info: ModuleInfo, node: ast.expr, depth: int = 0) -> bool:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return _world_size(info, node.left) or _world_size(info, node.right)
    name = dotted(node)
    if name is None or depth > 2:
        return False
    vals = [v for _, v in info.assigns.get(name, [])]
    return bool(vals) and all(_world_multiple(info, v, depth + 1) for v in vals)


_WORLD_HINTS = ("world", "num_replicas", "nproc", "ngpus", "num_gpus", "num_processes")


def _world_size(info: ModuleInfo, node: ast.expr) -> bool:
    if isinstance(node, ast.Call):
        last = info.callee_last(node)
        if last in ("get_world_size", "int") and (last != "int" or node.args):
            return last == "get_world_size" or _world_size(info, node.args[0])
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return node.slice.value in ("WORLD_SIZE", "SLURM_NTASKS")
    name = (dotted(node) or "").rsplit(".", 1)[-1].lower()
    return any(h in name for h in _WORLD_HINTS)


def _msg003(expr: str) -> str:
    return (f"manual shard `{expr}`: when the length is not a multiple of the world size the "
            "ranks get different numbers of samples, so they run different numbers of steps "
            "and the extra step's all-reduce hangs")


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
shard = items[rank::world_size]  # len(items) % world_size ranks get one more
"""

RULE = ddp003
