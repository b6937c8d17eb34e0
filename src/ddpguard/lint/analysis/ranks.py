"""Rank classes and how a rank test splits them.

The code's own tests create the classes: `rank == 0`, `local_rank > 0`, `rank == dst`,
`is_main_process()`, a flag such as `master_process = ddp_rank == 0`. Each class is stood for
by a representative process: rank 0 (global and local rank 0), a rank > 0 (global and local
rank > 0) and, where the code tests the local rank, local rank 0 of another node (global
rank > 0, local rank 0). A test evaluates to TRUE or FALSE for a class, or UNKNOWN: it does not
depend on the rank (the same on every rank: both arms are possible, for every class alike),
or it depends on more than the class tells (`i % world_size != rank`, `rank == 1`).
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from typing import Protocol

from .context import ModuleInfo
from .instances import find_method
from .provenance import (
    _GLOBAL_NAMES,
    _LOCAL_NAMES,
    GLOBAL,
    LOCAL,
    NONE,
    RankTable,
    dotted,
    is_predicate,
    value_level,
)
from .world_size import is_world as _is_world
from .world_size import one_gpu_per_process as _one_gpu_per_process
from .world_size import world_share

FALSE, TRUE, UNKNOWN = 0, 1, 2
POS = 1   # "some rank > 0": tests against constants <= 0 are decided, others are not
_DESIGNATED = {"dst", "src", "root", "main_rank", "master_rank", "dst_rank", "src_rank",
               "root_rank", "leader", "leader_rank"}
# Tests of the launch mode, not of the rank: in a distributed run they hold on every rank.
_LAUNCH_NAME = re.compile(r"(^|_)(distributed|ddp|multiprocessing_distributed|multi_gpu|"
                          r"is_dist|use_dist|dist_enabled|use_ddp|is_ddp|parallel|"
                          r"parallel_training)$", re.I)
# ... and names that say the run is NOT distributed: false in a distributed run.
_SINGLE_NAME = re.compile(r"(^|_)(single_spec|single_gpu|single_process|single_device|"
                          r"non_distributed|not_distributed|no_ddp|no_dist)$", re.I)
_LAUNCH_CALLS = {"is_initialized", "is_available", "is_dist_avail_and_initialized",
                 "is_distributed", "is_dist_available_and_initialized", "is_torchelastic_launched"}
_UNSET_RANK = re.compile(r"(^|[._])(local_)?rank$")
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
        ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}


@dataclass(frozen=True)
class RankClass:
    name: str
    glob: int   # 0 or POS
    local: int  # 0 or POS


RANK0 = RankClass("rank 0", 0, 0)
OTHERS = RankClass("ranks > 0", POS, POS)
NODE_LEADERS = RankClass("local rank 0 of the other nodes", POS, 0)


_Fn = ast.FunctionDef | ast.AsyncFunctionDef


class Table(RankTable, Protocol):
    tree: ast.Module
    assigns: dict[str, list[tuple[int, ast.expr]]]
    funcs: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]]
    _memo: dict[tuple[object, ...], object]


def _rank_value(info: Table, node: ast.AST, cls: RankClass) -> int | None:
    """0 or POS when `node` is the class's (global or local) rank itself, else None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) \
            and value_level(info, node.left) == GLOBAL:
        # `rank % ngpus_per_node` is the local rank; `rank % 2` splits the ranks > 0 too
        per_node = node.right if not isinstance(node.right, ast.Call) else node.right.func
        name = (dotted(per_node) or "").lower()
        if any(h in name for h in ("gpu", "per_node", "local", "device_count", "nproc")):
            return cls.local
        return None
    if isinstance(node, ast.Call) and info.callee_last(node) in ("int", "str") and node.args:
        return _rank_value(info, node.args[0], cls)
    if isinstance(node, ast.Call) and (_tests_rank(info, info.callee_last(node))
                                       or _tests_elsewhere(info, node)):
        return None  # `is_master(args)` is a test of the rank (true on rank 0), not the rank
    if not isinstance(node, ast.Name | ast.Attribute | ast.Call | ast.Subscript):
        return None
    d = dotted(node) if not isinstance(node, ast.Call | ast.Subscript) else None
    if d is not None:
        if d in getattr(info, "armed_flags", ()):
            return None   # a flag one class computes (armed_flags.py), not the rank
        last = d.rsplit(".", 1)[-1].lower()
        if is_predicate(last):
            return None
        if d not in info.rank_names and last not in _GLOBAL_NAMES and last not in _LOCAL_NAMES:
            return None
    level = value_level(info, node)
    if level == GLOBAL:
        return cls.glob
    if level == LOCAL:
        return cls.local
    return None


def _tests_rank(info: Table, name: str) -> bool:
    """A predicate by its name, or a function of this file that returns a comparison."""
    if is_predicate(name):
        return True
    fns = info.funcs.get(name, [])
    return len(fns) == 1 and bool(fns[0].body) and isinstance(fns[0].body[-1], ast.Return) \
        and isinstance(fns[0].body[-1].value, ast.Compare | ast.BoolOp | ast.UnaryOp)


def _tests_elsewhere(info: Table, node: ast.Call) -> bool:
    """A rank function another file defines (`stop = trainer.save(...)`, its method
    returning `self.bad >= 7`) that returns a comparison: a test, not the rank."""
    last = info.callee_last(node)
    if last not in info.rank_funcs or last in info.funcs:
        return False
    _, fns = _defined_elsewhere(info, node)
    return len(fns) == 1 and bool(fns[0].body) and isinstance(fns[0].body[-1], ast.Return) \
        and isinstance(fns[0].body[-1].value, ast.Compare | ast.BoolOp | ast.UnaryOp)


def _const(node: ast.AST) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) \
            and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, int):
        return -node.operand.value
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        vals = [_const(e) for e in node.elts]
        return tuple(vals) if all(isinstance(v, int) for v in vals) else None
    return None


def _designated(node: ast.AST) -> bool:
    """`dst`, `args.src`, `root`: the rank a collective names, in practice rank 0."""
    d = dotted(node)
    return d is not None and d.rsplit(".", 1)[-1].lower() in _DESIGNATED


def _compare(val: int, op: ast.cmpop, other: object) -> int:
    if isinstance(op, ast.In | ast.NotIn):
        if not isinstance(other, tuple):
            return UNKNOWN
        if val == 0:
            hit = 0 in other
        elif all(o <= 0 for o in other):
            hit = False
        else:
            return UNKNOWN
        return TRUE if hit == isinstance(op, ast.In) else FALSE
    if isinstance(other, str) and isinstance(op, ast.Eq | ast.NotEq):
        # `rank == "cpu"` (a single process's stand-in): no rank of a group is a string
        return FALSE if isinstance(op, ast.Eq) else TRUE
    fn = _CMP.get(type(op))
    if fn is None or not isinstance(other, int) or isinstance(other, bool):
        return UNKNOWN
    if val == 0:
        return TRUE if fn(0, other) else FALSE
    if isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE):
        # every rank > 0 is at least 1: `rank < 1` fails and `rank >= 1` holds on all of
        # them (corpus35g T150's `if self.rank < 1:`); `rank < 4` is decided at run time
        low, high = fn(1, other), isinstance(op, ast.Gt | ast.GtE)
        return (TRUE if low else FALSE) if low == high else UNKNOWN
    if other > 0:
        return UNKNOWN  # `rank == 1`: some ranks > 0 pass, some do not
    # every rank > 0 compares the same way against a constant <= 0
    return TRUE if fn(1, other) else FALSE


def evaluate(info: Table, node: ast.AST | None, cls: RankClass, depth: int = 0) -> int:
    """TRUE / FALSE / UNKNOWN for the test `node` on the ranks of `cls`."""
    if node is None or depth > 4:
        return UNKNOWN
    if isinstance(node, ast.BoolOp):
        vals = [evaluate(info, v, cls, depth) for v in node.values]
        stop = FALSE if isinstance(node.op, ast.And) else TRUE
        if stop in vals:
            return stop
        return UNKNOWN if UNKNOWN in vals else 1 - stop
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        v = evaluate(info, node.operand, cls, depth)
        return v if v == UNKNOWN else 1 - v
    if isinstance(node, ast.Compare):
        if len(node.ops) != 1:
            return UNKNOWN
        left, op, right = node.left, node.ops[0], node.comparators[0]
        if type(right) is ast.Constant and type(right.value) is bool and \
                isinstance(op, ast.Eq | ast.NotEq | ast.Is | ast.IsNot) and \
                dotted(left) in getattr(info, "armed_flags", ()):
            # `if stop == True:` of a flag one class computes
            v = evaluate(info, left, cls, depth + 1)
            if v == UNKNOWN:
                return v
            return int((v == TRUE) == right.value) if isinstance(op, ast.Eq | ast.Is) \
                else int((v == TRUE) != right.value)
        counted = _counted(info, left, op, right, cls, depth)
        if counted != UNKNOWN:
            return counted
        lv, rv = _rank_value(info, left, cls), _rank_value(info, right, cls)
        if lv is not None and rv is None:
            got = _against(lv, op, right)
            if got == UNKNOWN and lv == 0 and isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE) \
                    and world_share(info, right):
                # `rank_c >= size // replication`: rank 0 is below any share of the world
                # (assumed at least 1); which other ranks pass is decided at run time
                got = _compare(0, op, 1)
            return got
        if rv is not None and lv is None and isinstance(op, ast.Eq | ast.NotEq):
            return _against(rv, op, left)
        return launch(info, node)
    if isinstance(node, ast.Call):
        last = info.callee_last(node)
        if last == "hasattr" and _names_a_rank(node):
            # `not hasattr(args, "local_rank") or args.local_rank == 0`: every process of a
            # distributed run has its rank (the launcher's argument or the set-up's)
            return TRUE
        fns = info.funcs.get(last, [])  # this file's own definition wins over the name
        home: Table = info
        if not fns and last in info.rank_funcs:
            # a project's own predicate, read where it is defined (`comm.main_proc()`; the
            # walk learnt its name from crossfile.rank_function_seeds)
            home, fns = _defined_elsewhere(info, node)
        if len(fns) == 1 and fns[0].body and isinstance(fns[0].body[-1], ast.Return):
            ret = fns[0].body[-1].value
            if ret is not None and len(fns[0].body) <= 3:
                return evaluate(home, ret, cls, depth + 1)
        if is_predicate(last):
            return _predicate(last, cls)
        if last in _LAUNCH_CALLS:
            return TRUE
        return UNKNOWN
    d = dotted(node)
    if d is None:
        return launch(info, node)
    return _flag(info, d, node, cls, depth)


def _counted(info: Table, left: ast.expr, op: ast.cmpop, right: ast.expr, cls: RankClass,
             depth: int) -> int:
    """`self.bad >= 7` of a counter one class advances (armed_flags.py): on the ranks
    outside its arm it holds its first value, so the comparison is decided there."""
    counters = getattr(info, "armed_counters", None)
    if not counters:
        return UNKNOWN
    hit = counters.get(dotted(left) or "")
    if hit is None or evaluate(info, hit[0], cls, depth + 1) != FALSE:
        return UNKNOWN
    if type(right) is not ast.Constant:
        # `stale > patience`: a count that stayed at 0 does not pass a threshold (assumed
        # not negative), whatever its value
        return FALSE if hit[1] == 0 and type(op) is ast.Gt and \
            isinstance(right, ast.Name | ast.Attribute) else UNKNOWN
    fn = _CMP.get(type(op))
    value = right.value
    if fn is None or not isinstance(value, int | float) or isinstance(value, bool):
        return UNKNOWN
    return TRUE if fn(hit[1], value) else FALSE


def _names_a_rank(node: ast.Call) -> bool:
    return len(node.args) == 2 and "rank" in str(_const(node.args[1])).lower()


def _defined_elsewhere(info: Table, node: ast.Call) -> tuple[Table, list[_Fn]]:
    """The function another file on the command line defines for this call, through the
    import that names it (`from comm import main_proc`, `comm.main_proc()`), and its file."""
    file_set, qualify = getattr(info, "file_set", None), getattr(info, "qualify", None)
    qual = qualify(node.func) if file_set is not None and qualify is not None else None
    hit = file_set.find(qual, info) if qual and "." in qual else None  # type: ignore[union-attr]
    if hit is None and file_set is not None and isinstance(info, ModuleInfo):
        rec = info.call_rec(node)   # `trainer.save(...)` of another file's class
        hit = find_method(info, rec) if rec is not None else None
    return (hit[0], [hit[1]]) if hit is not None else (info, [])


def _against(val: int, op: ast.cmpop, other_node: ast.expr) -> int:
    other = _const(other_node)
    if other is None and _designated(other_node) and isinstance(op, ast.Eq | ast.NotEq):
        other = 0
    if other is None:
        return UNKNOWN
    return _compare(val, op, other)


def _predicate(name: str, cls: RankClass) -> int:
    zero = cls.local if "local" in name.lower() else cls.glob
    return TRUE if zero == 0 else FALSE


def _flag(info: Table, d: str, node: ast.AST, cls: RankClass, depth: int) -> int:
    """A name used as a test: a flag assigned from a rank test (`master_process = ddp_rank
    == 0`; constant fallbacks such as `master_process = True` for the single-process launch do
    not count), a predicate-named attribute (`accelerator.is_main_process`), or a rank value
    itself (`if rank:`)."""
    values = [v for _, v in info.assigns.get(d, [])]
    ranked = [v for v in values if v is not node and value_level(info, v) != NONE]
    if ranked:
        vals = {evaluate(info, v, cls, depth + 1) if not _is_value(info, v)
                else _truth(_rank_value(info, v, cls)) for v in ranked}
        return vals.pop() if len(vals) == 1 else UNKNOWN
    last = d.rsplit(".", 1)[-1]
    if is_predicate(last):
        return _predicate(last, cls)
    if "rank" not in last.lower() and d not in info.rank_names:
        # `if cfg.mode.gpu:` is a "use the GPU" switch, not local rank 0 being falsy: only a
        # name that says rank (or was assigned one) is tested for its truth as a rank
        return launch(info, node)
    val = _rank_value(info, node, cls)
    return _truth(val) if val is not None else launch(info, node)


def _is_value(info: Table, node: ast.AST) -> bool:
    return _rank_value(info, node, RANK0) is not None


def _truth(val: int | None) -> int:
    if val is None:
        return UNKNOWN
    return FALSE if val == 0 else TRUE


def launch(info: Table, node: ast.AST | None) -> int:
    """TRUE/FALSE for a test of the launch mode as a distributed run sees it (`if
    args.distributed:`, `if not dist.is_initialized():`, `if world_size > 1:`), and for a
    constant (`if False and ...`); UNKNOWN for anything else. The same on every rank: it
    splits no ranks, it only picks the arm."""
    if node is None:
        return UNKNOWN
    if isinstance(node, ast.Constant):  # `if False and os.path.exists(p):` is never taken
        return TRUE if node.value else FALSE
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        v = launch(info, node.operand)
        return v if v == UNKNOWN else 1 - v
    if isinstance(node, ast.BoolOp):
        vals = [launch(info, v) for v in node.values]
        stop = FALSE if isinstance(node.op, ast.And) else TRUE
        if stop in vals:
            return stop
        return UNKNOWN if UNKNOWN in vals else 1 - stop
    if isinstance(node, ast.Call):
        return TRUE if info.callee_last(node) in _LAUNCH_CALLS else UNKNOWN
    if isinstance(node, ast.Name) and _module_function(info, node.id):
        # `not evaluate` where `evaluate` is this file's function, not a parameter or a
        # variable anywhere: a function object is always true (a shadowing slip in the old
        # example trainers that disables the barrier under it)
        return TRUE
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and \
            isinstance(node.comparators[0], ast.Constant) and \
            isinstance(node.comparators[0].value, bool) and \
            isinstance(node.ops[0], ast.Eq | ast.Is | ast.NotEq | ast.IsNot):
        # `parallel == True`, `args.distributed is False`
        v = launch(info, node.left)
        flip = (node.comparators[0].value is False) != isinstance(node.ops[0], ast.NotEq
                                                                   | ast.IsNot)
        return v if v == UNKNOWN or not flip else 1 - v
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        c = _const(node.comparators[0])
        if isinstance(c, int) and not isinstance(c, bool) and _one_gpu_per_process(info,
                                                                                  node.left):
            # `args.n_gpu > 1` where the script sets `args.n_gpu = 1` for a distributed run
            # (the old example trainers): the DataParallel path, false under DDP
            fn = _CMP.get(type(node.ops[0]))
            if fn is not None:
                return TRUE if fn(1, c) else FALSE
        if c == -1 and not isinstance(c, bool) and _UNSET_RANK.search(
                dotted(node.left) or ""):
            # `if args.local_rank != -1:`: the launcher gives every process a rank of 0 or
            # more, and -1 is the option's "not launched" default
            fn = _CMP.get(type(node.ops[0]))
            if fn is not None and fn(0, -1) == fn(7, -1):
                return TRUE if fn(0, -1) else FALSE
        if isinstance(c, int) and not isinstance(c, bool) and _is_world(info, node.left):
            fn = _CMP.get(type(node.ops[0]))
            if fn is not None and c in (1, 2):
                # world size >= 2: `> 1`, `!= 1`, `>= 2` hold; `== 1`, `< 2`, `<= 1` do not
                return TRUE if fn(2, c) and fn(3, c) else FALSE if not (fn(2, c) or
                                                                          fn(3, c)) else UNKNOWN
        return UNKNOWN
    d = dotted(node)
    if d is None and isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
            and isinstance(node.slice.value, str):
        d = node.slice.value  # `config["single_spec"]`
    if d is not None and _LAUNCH_NAME.search(d.rsplit(".", 1)[-1]):
        return TRUE
    if d is not None and _SINGLE_NAME.search(d.rsplit(".", 1)[-1]):
        return FALSE
    return UNKNOWN


def _module_function(info: Table, name: str) -> bool:
    memo: dict[str, bool] = info._memo.setdefault(  # type: ignore[assignment]
        ("module_function", 0), {})
    hit = memo.get(name)
    if hit is None:
        fns = info.funcs.get(name, [])
        hit = memo[name] = bool(fns) and name not in info.assigns and all(
            not isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) or name not in
            {a.arg for a in [*f.args.posonlyargs, *f.args.args, *f.args.kwonlyargs]}
            for fs in info.funcs.values() for f in fs) and any(
            f in info.tree.body for f in fns)
    return hit


def splits(info: Table, node: ast.AST | None) -> bool:
    """The test can take different values on different rank classes."""
    if node is None:
        return False
    vals = {evaluate_test(info, node, c) for c in (RANK0, OTHERS, NODE_LEADERS)}
    return len(vals) > 1


def evaluate_test(info: Table, node: ast.AST, cls: RankClass) -> int:
    """`evaluate(info, node, cls)`, memoised per test and class: the tables it reads are
    complete once the walker is done, and a rank test is asked for every class twice (does
    it split, and which arm each class takes)."""
    memo: dict[tuple[int, int, int], int] | None = \
        info._memo.get(("evaluate", 0))  # type: ignore[assignment]
    if memo is None:
        memo = info._memo[("evaluate", 0)] = {}
    key = (id(node), cls.glob, cls.local)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = evaluate(info, node, cls)
    return hit
