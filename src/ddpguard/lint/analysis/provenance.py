"""Rank provenance: does an expression depend on the process's rank, and on which kind?

GLOBAL: a value or test derived from the global rank (`RANK`, `dist.get_rank()`,
`SLURM_PROCID`, `accelerator.process_index`, ...). LOCAL: derived from the rank within a node
(`LOCAL_RANK`, `SLURM_LOCALID`, `args.gpu`, and `rank % ngpus_per_node`). Values flow through
assignments (`ddp_rank = int(os.environ["RANK"])`, `master_process = ddp_rank == 0`,
`self.gpu_id = int(os.environ["LOCAL_RANK"])`), which the walker records in
`ModuleInfo.rank_names` keyed by dotted name, so `self.` attributes set in one method are seen in
the others. Pure functions of the node and that table.
"""

from __future__ import annotations

import ast
import functools
import re
from typing import Any, Protocol


class RankTable(Protocol):
    """What provenance reads of a module (ModuleInfo satisfies it): no import of context.py,
    so the layers stay provenance <- context <- walker <- schedule <- rules."""

    rank_names: dict[str, int]
    rank_funcs: dict[str, int]

    def callee_last(self, call: ast.Call) -> str: ...

NONE, GLOBAL, LOCAL = 0, 1, 2

# Names that hold a rank even when the assignment is out of sight (a parameter, another module).
_GLOBAL_NAMES = {"rank", "global_rank", "ddp_rank", "world_rank", "dist_rank", "node_rank",
                 "process_index", "process_rank", "proc_rank", "rank_id", "global_rank_id"}
_LOCAL_NAMES = {"local_rank", "ddp_local_rank", "local_process_index", "gpu", "gpu_id",
                "local_rank_id", "local_gpu_id"}
_PREDICATES = {"is_main_process", "is_master", "is_main", "is_rank_zero", "is_rank0",
               "is_global_zero", "is_world_process_zero", "is_primary", "is_global_primary",
               "is_master_process", "is_local_main", "is_local_main_process",
               "is_local_master", "is_local_process_zero", "is_local_primary",
               "master_process", "main_process", "is_root_process", "is_rank_0",
               "master"}  # (`env.master = dist.get_rank() == 0` in a dataclass, rq-vae)
# Not `is_chief`: TensorFlow's role name; torchrec-style code sets it from the task type
# (`TASK_TYPE == "chief"`), true on every trainer process (the-algorithm-ml). Where a linted
# file defines it from the rank, the definition says so.
# Predicates by their shape: `is_master_proc()`, `is_main_rank`, `is_primary_worker` ...
_PREDICATE_RE = re.compile(r"^is_\w*(master|main|primary|leader|root|rank_?0|rank_zero|"
                           r"first_(worker|rank|process|proc|gpu|device)|"
                           r"global_zero)", re.I)


@functools.lru_cache(maxsize=4096)
def is_predicate(name: str) -> bool:
    """A name that answers "am I the (local) leader?" (`is_main_process`, `is_master_proc`)."""
    low = name.lower()
    return low in _PREDICATES or bool(_PREDICATE_RE.match(low))


# Decorators that run a function on the leader alone: `@rank_zero_only` (Lightning),
# `@master_only` (mmcv), `@main_process` (LAVIS), `@accelerator.on_main_process`. Never a bare
# `main` (`@hydra.main` runs everywhere).
_RANK_ONLY_RE = re.compile(r"^(on_|only_)?(local_)?(rank_?zero|rank_?0|(main|master|primary|"
                           r"leader|chief)_(only|process|proc|process_only|rank_only))"
                           r"(_only)?$|rank_zero", re.I)


def rank_only(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """GLOBAL (LOCAL) when a decorator of `fn` runs it on rank 0 (local rank 0) alone."""
    for d in fn.decorator_list:
        name = dotted(d.func if isinstance(d, ast.Call) else d) or ""
        last = name.rsplit(".", 1)[-1]
        if _RANK_ONLY_RE.search(last):
            return LOCAL if "local" in last.lower() else GLOBAL
    return NONE


# (`hvd.rank()`, `hvd.local_rank()`, `xm.get_ordinal()`: other launchers' spellings)
_RANK_CALLS = {"get_rank": GLOBAL, "get_global_rank": GLOBAL, "get_local_rank": LOCAL,
               "get_node_local_rank": LOCAL, "rank": GLOBAL, "local_rank": LOCAL,
               "get_ordinal": GLOBAL, "get_local_ordinal": LOCAL,
               "Get_rank": GLOBAL}  # mpi4py: `comm.Get_rank()` (`comm.rank` reads by name)
_ENV = {"RANK": GLOBAL, "SLURM_PROCID": GLOBAL, "OMPI_COMM_WORLD_RANK": GLOBAL,
        "PMI_RANK": GLOBAL, "LOCAL_RANK": LOCAL, "SLURM_LOCALID": LOCAL,
        "OMPI_COMM_WORLD_LOCAL_RANK": LOCAL, "MPI_LOCALRANKID": LOCAL}
_PASS_THROUGH = {"int", "str", "bool"}
_Call, _Name, _Attribute = ast.Call, ast.Name, ast.Attribute


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    t = type(node)
    if t is _Name:  # the common case, without building a list
        return node.id  # type: ignore[attr-defined]
    parts = []
    while t is _Attribute:
        parts.append(node.attr)  # type: ignore[attr-defined]
        node = node.value  # type: ignore[attr-defined]
        t = type(node)
    if t is _Name:
        parts.append(node.id)  # type: ignore[attr-defined]
        return ".".join(reversed(parts))
    return None


def combine(*levels: int) -> int:
    """GLOBAL wins over LOCAL: `local_rank == 0 and rank == 0` is a global-rank test."""
    return GLOBAL if GLOBAL in levels else max(levels, default=NONE)


def name_level(name: str) -> int:
    """Level implied by the last component of a dotted name, case-insensitively (`RANK`)."""
    last = name.rsplit(".", 1)[-1].lower()
    if last in _LOCAL_NAMES or (is_predicate(last) and "local" in last):
        return LOCAL
    if last in _GLOBAL_NAMES or is_predicate(last):
        return GLOBAL
    return NONE


def env_level(key: object) -> int:
    return _ENV.get(key, NONE) if isinstance(key, str) else NONE


def key_name(key: str) -> str:
    """How a config key set from the rank is kept among the rank names: `['verb']`."""
    return f"['{key}']"


def key_level(key: object) -> int:
    """`os.environ["RANK"]`, and a config read by key: `config["local_rank"]`."""
    if not isinstance(key, str):
        return NONE
    return env_level(key) or (name_level(key) if key.islower() else NONE)


def value_level(info: RankTable, node: ast.AST) -> int:
    """Level of a value: the rank itself, or anything computed from it."""
    t = type(node)
    n: Any = node  # narrowed by `t` below (isinstance asserts cost time on every value)
    if t is _Name or t is _Attribute:
        d = dotted(node)
        if d is None:
            return value_level(info, n.value) if t is _Attribute else NONE
        hit = info.rank_names.get(d)
        return hit if hit is not None else name_level(d)
    if t is _Call:
        last = info.callee_last(n)
        if last in _RANK_CALLS:
            # `device_mesh["tp"].get_local_rank()`: the rank within a mesh dimension (a
            # subgroup), not the process's rank
            f = n.func
            if type(f) is _Attribute and (type(f.value) is ast.Subscript or "mesh" in (
                    dotted(f.value) or "").lower()):
                return NONE
            if last == "get_rank" and _in_a_group(n):
                # `dist.get_rank(group)`: the rank within that subgroup (makani's tree
                # reduction among the leaders of the reduction groups)
                return NONE
            return _RANK_CALLS[last]
        if is_predicate(last) or last in info.rank_funcs:
            return info.rank_funcs.get(last) or name_level(last)
        if last in _PASS_THROUGH and n.args:
            return value_level(info, n.args[0])
        if last in ("get", "getenv") and n.args and isinstance(n.args[0], ast.Constant):
            return key_level(n.args[0].value)
        return NONE
    if t is ast.Subscript:
        if isinstance(n.slice, ast.Constant):
            if type(n.slice.value) is str:
                hit = info.rank_names.get(key_name(n.slice.value))
                if hit is not None:
                    return hit
            return key_level(n.slice.value)
        return NONE
    if t is ast.BinOp:
        left = value_level(info, n.left)
        if isinstance(n.op, ast.Mod) and left == GLOBAL:
            return LOCAL  # `rank % ngpus_per_node` is the rank within the node
        return combine(left, value_level(info, n.right))
    if t is ast.IfExp:
        return combine(value_level(info, n.body), value_level(info, n.orelse))
    return test_level(info, node) if t in (ast.Compare, ast.BoolOp, ast.UnaryOp) else NONE


def _in_a_group(call: ast.Call) -> bool:
    args = [*call.args, *(k.value for k in call.keywords if k.arg == "group")]
    return any(not (isinstance(a, ast.Constant) and a.value is None) for a in args)


def test_level(info: RankTable, node: ast.AST | None) -> int:
    """GLOBAL/LOCAL when `node`, used as a condition, takes different values on different
    ranks; NONE for tests that only tell distributed from not (`local_rank != -1`,
    `args.gpu is not None`)."""
    t = type(node)
    if t is _Call or t is _Name or t is _Attribute:  # the common tests and assigned values
        return value_level(info, node)  # type: ignore[arg-type]
    if node is None:
        return NONE
    if isinstance(node, ast.BoolOp):
        return combine(*(test_level(info, v) for v in node.values))
    if isinstance(node, ast.UnaryOp):
        return test_level(info, node.operand)
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        levels = [value_level(info, s) for s in sides]
        consts = [s for s, lv in zip(sides, levels, strict=True) if not lv]
        if consts and all(_is_minus_one_or_none(c) for c in consts):
            return NONE
        return combine(*levels)
    return value_level(info, node)


def _is_minus_one_or_none(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and node.value is None:
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return isinstance(node.operand, ast.Constant) and node.operand.value == 1
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return bool(node.elts) and all(_is_minus_one_or_none(e) for e in node.elts)
    return False
