"""Where a rank, a device index or a world size comes from, by kind (global or local, one
node or all): the reading behind DDP025, kept apart from its messages."""

from __future__ import annotations

import ast
import re

from .context import Func, ModuleInfo, kwarg
from .param_flow import from_callers, is_parameter
from .provenance import GLOBAL, LOCAL, dotted, env_level

__all__ = ["cuda_index", "fixed_worlds", "indexed", "launcher_arm", "mapped", "named_cuda",
           "node_product", "per_node", "rank_source"]

# The calls that return the process's rank in the default group, by kind.
_SOURCE_CALLS = {"get_rank": GLOBAL, "get_global_rank": GLOBAL, "get_local_rank": LOCAL,
                 "get_node_local_rank": LOCAL}


_WORLD_KWARGS = ("world_size", "nprocs", "nproc_per_node", "num_processes")
_NODES = re.compile(r"^(n|num_|n_|number_of_)?nodes$")
# A node's own index among the nodes (`--nr` of the SimCLR-style launchers, `node_rank`).
_NODE_INDEX = re.compile(r"^(nr|node_rank|node_id|node_idx|node_index|machine_rank|rank_node)$")


def fixed_worlds(info: ModuleInfo) -> set[int]:
    """The numbers a module writes as a world size: `world_size=`/`nprocs=` arguments, the
    count `mp.spawn` is given, an option's default (`--world_size`, `default=2`) or a name of
    the world, process or GPU count assigned a number (`WORLD_SIZE = 2`)."""
    key = ("fixed_worlds", 0)
    hit = info._memo.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    out: set[int] = set()

    def number(v: ast.expr | None) -> None:
        if isinstance(v, ast.Constant) and type(v.value) is int:
            out.add(v.value)

    for rec in info.calls:
        node = rec.node
        for k in node.keywords:
            if k.arg in _WORLD_KWARGS:
                number(k.value)
        if rec.last in ("spawn", "start_processes") and len(node.args) > 2:
            number(node.args[2])
        if rec.last == "add_argument" and any(
                isinstance(a, ast.Constant) and isinstance(a.value, str)
                and _WORLDISH.search(a.value.lower()) for a in node.args):
            number(kwarg(node, "default"))
    for name, entries in info.assigns.items():
        if _WORLDISH.search(name.rsplit(".", 1)[-1].lower()):
            for _, v in entries:
                number(v)
    info._memo[key] = out
    return out


_WORLDISH = re.compile(r"world|nproc|gpus|num_processes")


def node_product(info: ModuleInfo, node: ast.expr, func: Func | None, depth: int = 0) -> str:
    """The node count `node` multiplies by (`args.gpus * args.nodes`), directly or through
    the one name it was assigned to in `func` (or the module)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        for side in (node.left, node.right):
            d = dotted(side.args[0] if isinstance(side, ast.Call) and side.args else side)
            if d and _NODES.match(d.rsplit(".", 1)[-1].lower()):
                return d
            inner = node_product(info, side, func, depth + 1) if depth < 3 else ""
            if inner:
                return inner
        return ""
    d = dotted(node)
    if d is None or depth > 3:
        return ""
    lo, hi = (func.lineno, func.end_lineno or func.lineno) if func else (0, 1 << 30)
    found = [node_product(info, v, func, depth + 1) for line, v in info.assigns.get(d, [])
             if lo <= line <= hi]
    return found[0] if found and all(found) else ""


def per_node(info: ModuleInfo, node: ast.expr, func: Func | None, depth: int = 0) -> str:
    """What names a count of this node only: `torch.cuda.device_count()`, LOCAL_WORLD_SIZE,
    or a name `func` assigns only such a value."""
    if isinstance(node, ast.Call):
        if info.callee_last(node) == "int" and node.args:
            return per_node(info, node.args[0], func, depth)
        if info.callee_last(node) == "device_count" and \
                (info.qualify(node.func) or "").startswith("torch.cuda"):
            return "GPU count (torch.cuda.device_count())"
        if info.callee_last(node) in ("get", "getenv") and node.args and \
                isinstance(node.args[0], ast.Constant) and \
                node.args[0].value == "LOCAL_WORLD_SIZE":
            return "process count (LOCAL_WORLD_SIZE)"
        return ""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and \
            node.slice.value == "LOCAL_WORLD_SIZE":
        return "process count (LOCAL_WORLD_SIZE)"
    d = dotted(node)
    if d is None or depth > 3 or func is None:
        return ""
    lo, hi = func.lineno, func.end_lineno or func.lineno
    found = [per_node(info, v, func, depth + 1) for line, v in info.assigns.get(d, [])
             if lo <= line <= hi]
    return found[0] if found and all(found) else ""


def indexed(args: list[ast.expr]) -> list[ast.expr]:
    """The index of `torch.device("cuda", r)` or `torch.device(f"cuda:{r}")`."""
    if len(args) == 2 and isinstance(args[0], ast.Constant) and args[0].value == "cuda":
        return [args[1]]
    return [i for i in args[:1] if cuda_index(i) is not None]


def mapped(where: ast.expr) -> list[ast.expr]:
    """The device indices a `map_location` names: the index of a `"cuda:{r}"` string (alone
    or as a dict's value). A lambda's `.cuda(r)` is a call of its own, read as one."""
    vals = where.values if isinstance(where, ast.Dict) else [where]
    return [v for v in vals if v is not None and cuda_index(v) is not None]


def named_cuda(info: ModuleInfo, node: ast.expr, func: Func | None) -> list[ast.expr]:
    """The device indices `node` may stand for: the index of a cuda string it is
    (`f"cuda:{r}"`), or of each cuda string that `func` assigns the name it is (`dev =
    f"cuda:{rank}"` in the arm that picks CUDA, then `torch.device(dev)`), or `node` itself
    (`x.to(rank)`). A name also assigned other values (`dev = args.device`) still stands for
    the cuda string on the path that assigned it."""
    if (index := cuda_index(node)) is not None:
        return [index]
    d = dotted(node)
    if func is None or d is None or "." in d:
        return [node] if not isinstance(node, ast.Constant) else []
    lo, hi = func.lineno, func.end_lineno or func.lineno
    named = [i for line, v in info.assigns.get(d, []) if lo <= line <= hi
             if (i := cuda_index(v)) is not None]
    return named or [node]


def cuda_index(node: ast.expr) -> ast.expr | None:
    """`r` of `f"cuda:{r}"`, `"cuda:{}".format(r)`, `"cuda:%d" % r`, `"cuda:" + str(r)`."""
    if isinstance(node, ast.JoinedStr) and len(node.values) == 2:
        head, val = node.values
        if isinstance(head, ast.Constant) and head.value == "cuda:" \
                and isinstance(val, ast.FormattedValue):
            return val.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "format" and len(node.args) == 1 \
            and isinstance(node.func.value, ast.Constant) \
            and node.func.value.value == "cuda:{}":
        return node.args[0]
    if isinstance(node, ast.BinOp) and isinstance(node.left, ast.Constant):
        if isinstance(node.op, ast.Mod) and node.left.value in ("cuda:%d", "cuda:%s"):
            return node.right
        if isinstance(node.op, ast.Add) and node.left.value == "cuda:":
            return node.right
    return None


def rank_source(info: ModuleInfo, node: ast.expr, kind: int, func: Func | None,
            depth: int = 0) -> str | None:
    """Where `node` reads the rank of `kind` from, when it is that and nothing else: the
    call or variable itself, or a name that `func` assigns only such a value (or a constant:
    `rank = 0` on the single-process path). A parameter `func` never assigns is whatever the
    caller passed (mp.spawn's index): no source."""
    if isinstance(node, ast.Call):
        last = info.callee_last(node)
        if last in ("int", "str") and node.args:
            return rank_source(info, node.args[0], kind, func, depth)
        if _SOURCE_CALLS.get(last) == kind and not node.args and not node.keywords:
            return f"{last}()"
        if last in ("get", "getenv") and node.args and isinstance(node.args[0], ast.Constant) \
                and env_level(node.args[0].value) == kind:
            return str(node.args[0].value)
        return None
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value) if env_level(node.slice.value) == kind else None
    if kind == GLOBAL and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        # `args.nr * args.gpus + gpu`: a node's index times its GPUs, plus the local one
        return next((f"`{ast.unparse(node)}`, the node's index times its GPUs plus the local "
                     "index" for side in (node.left, node.right)
                     if isinstance(side, ast.BinOp) and isinstance(side.op, ast.Mult)
                     and any(_NODE_INDEX.match((dotted(x) or "").rsplit(".", 1)[-1].lower())
                             for x in (side.left, side.right))), None)
    d = dotted(node)
    if d is None or depth > 3:
        return None
    lo, hi = (func.lineno, func.end_lineno or func.lineno) if func else (0, 1 << 30)
    # what the name holds where it is read: the function's assignments before that line
    # (`set_device(args.local_rank)` and only then `args.local_rank = dist.get_rank()`)
    at = getattr(node, "lineno", hi)
    if kind == LOCAL and d.rsplit(".", 1)[-1] == "local_rank" and d.startswith(("args.", "opt")):
        # Unless the function made it something else first (Squirrel's SLURM arm:
        # `args.local_rank = args.local_rank + int(os.environ["SLURM_PROCID"]) * ...`).
        if any(lo <= line < at and isinstance(v, ast.BinOp)
               for line, v in info.assigns.get(d, [])):
            return None
        return f"{d}, the launcher's --local_rank"
    found = [(line, rank_source(info, v, kind, func, depth + 1))
             for line, v in info.assigns.get(d, [])
             if lo <= line <= hi and not isinstance(v, ast.Constant)
             and (func is None or line <= at or not _straight(func, node, line))]
    if not found and func is not None and d.startswith("self.") and func in info.func_class:
        # an attribute the class keeps: what its methods assign it (`self.opts.rank =
        # int(os.environ["LOCAL_RANK"])` in `__init__`, read in another method)
        cls = info.classes.get(info.func_class[func])
        if cls is not None:
            lo, hi = cls.lineno, cls.end_lineno or cls.lineno
            found = [(line, rank_source(info, v, kind, _method_at(cls, line), depth + 1))
                     for line, v in info.assigns.get(d, [])
                     if lo <= line <= hi and not isinstance(v, ast.Constant)]
    if not found and func is not None and "." not in d and is_parameter(func, d):
        return from_callers(info, func, d,
                            lambda m, arg, f: rank_source(m, arg, kind, f, depth + 1))
    if found and all(src for _, src in found):
        return found[0][1]
    return next((f"{src}, in the launcher's arm at line {line}" for line, src in found
                 if src and launcher_arm(info, func, line)), None)


def _straight(func: Func, node: ast.expr, line: int) -> bool:
    """The assignment at `line` comes after `node` with no loop holding both (so it cannot
    reach it on a later turn)."""
    at = getattr(node, "lineno", 0)
    return not any(isinstance(n, ast.For | ast.While | ast.AsyncFor)
                   and n.lineno <= min(at, line) and max(at, line) <= (n.end_lineno or 0)
                   for n in ast.walk(func))


def _method_at(cls: ast.ClassDef, line: int) -> Func | None:
    """The method of `cls` holding `line` (its parameters are what its callers pass:
    `self.rank = rank` in `__init__`)."""
    return next((m for m in cls.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)
                 and m.lineno <= line <= (m.end_lineno or m.lineno)), None)


def launcher_arm(info: ModuleInfo, func: Func | None, line: int) -> bool:
    """The assignment at `line` sits in an arm of an `if` that picks the launcher
    (`"SLURM_PROCID" in os.environ`, `args.local_rank != -1`): that arm is the whole set-up
    of one way to launch, and each of torchrun, torch.distributed.launch and SLURM runs on
    several nodes, so its kind is wrong there whatever the other arms assign. Not under a
    test of the node count (`args.nnodes == 1`): there the local rank is the global one."""
    for node in ast.walk(func if func is not None else info.tree):
        if isinstance(node, ast.If) and any(
                isinstance(st, ast.Assign) and st.lineno == line
                for st in (*node.body, *node.orelse)):
            parts = list(ast.walk(node.test))
            if any(isinstance(n, ast.Name | ast.Attribute) and (
                    "node" in (dotted(n) or "").lower()) or isinstance(n, ast.Call) and
                    info.callee_last(n) == "device_count" for n in parts):
                return False
            return any(isinstance(n, ast.Constant) and env_level(n.value) for n in parts) \
                or any(isinstance(n, ast.Compare) and (dotted(n.left) or "").endswith("rank")
                       and any(isinstance(c, ast.UnaryOp | ast.Constant) and
                               ast.unparse(c) == "-1" for c in n.comparators) for n in parts)
    return False
