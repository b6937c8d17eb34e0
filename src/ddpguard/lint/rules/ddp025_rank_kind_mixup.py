"""DDP025 the global rank used as a device index, or the local rank as the global rank.

Two spellings of one confusion, both right on one node and wrong on several:

- `torch.cuda.set_device(r)` (or `DDP(..., device_ids=[r])`) with `r` read from the global
  rank (`dist.get_rank()`, `RANK`, `SLURM_PROCID`): on the second node `r` is at least the
  number of GPUs per node, a device that does not exist (`invalid device ordinal`), or two
  processes of a node share a GPU.
- `init_process_group(rank=r)` with `r` read from the local rank (`LOCAL_RANK`,
  `SLURM_LOCALID`, the launcher's `--local_rank`): every node has a rank 0, so two processes
  claim each rank and the rendezvous fails or waits forever.

The same global rank as the index of a device built by hand is the first spelling too:
`torch.device(f"cuda:{r}")`, `torch.device("cuda", r)`, `x.cuda(r)`, `x.to(r)`, and
`torch.load`'s `map_location` (`lambda s, loc: s.cuda(r)`, `f"cuda:{r}"`, a dict whose value
is such a string); the first such site in a function, none in a function already reported for
`set_device` or `device_ids`.

And the count of one node as the size of the whole group: `init_process_group(world_size=
torch.cuda.device_count())` (or LOCAL_WORLD_SIZE) where the launcher gives the rank (no
`rank=`): on a second node the ranks are at or past that size (and with fewer processes than
GPUs the rendezvous waits for ranks never started). With `rank=` passed too, only where that
rank is read from the launcher (`args.local_rank`, LOCAL_RANK, RANK) and the program starts no
process of its own: the launcher's process count is the world, not the GPUs the node shows
(`torch.distributed.launch --nproc_per_node=2` on an 8-GPU machine waits for 6 ranks never
started). Not where the program spawns (`mp.spawn(fn, nprocs=torch.cuda.device_count())`:
there the GPU count may be the world).

And `mp.spawn(fn, nprocs=gpus * nodes)` (directly or through the name it was assigned to):
mp.spawn starts processes on its own node only, so every node starts the whole world; not a
product without a node count (`nodes`, `num_nodes`, `nnodes`, `n_nodes`).

And a number written as the sampler's shard count, `DistributedSampler(ds, num_replicas=2)`,
where the program does not fix its world to that number (no `mp.spawn(nprocs=2)`,
`world_size=2`, world-size option or name of that value in the files given): with more
processes the ranks past it raise in the sampler while the others wait in their first
collective; with fewer, shards are never read. Not `num_replicas=1` (every rank reads the
whole set, on purpose).

Only values whose source is certain are reported: a parameter merely named `rank` (the index
`mp.spawn` passes, which is both on one node) is not. A parameter is what the program passes
for it when every call of its function in the files given passes the same kind (`LOCAL_RANK`
read in the entry file, passed as `main(local_rank, ...)` and on to a set-up helper of another
module, `ddp_setup(rank, ...)`, that calls `init_process_group(rank=rank)`); not where the
function is also named other than as a call's callee (`mp.spawn(main, ...)`: callers out of
sight), nor where one call passes another kind or unpacks `*args`. An attribute a class keeps
(`self.opts.rank = int(os.environ["LOCAL_RANK"])` in `__init__`, then `init_process_group(
rank=self.opts.rank)` in another method) is what the class's methods assign it, when every
such assignment is of the same kind. A name assigned in several
arms of an `if` is reported when an arm whose test picks the launcher (`"SLURM_PROCID" in
os.environ`, `args.local_rank != -1`) assigns the wrong kind: each launcher runs on several
nodes; not under a test of the node count (`args.nnodes == 1`), nor for `rank % ngpus`. Fix:
`LOCAL_RANK` for the device, `RANK` (or `dist.get_rank()`) for the process group.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ..analysis.context import Func, ModuleInfo, kwarg
from ..analysis.param_flow import from_callers, is_parameter
from ..analysis.provenance import GLOBAL, LOCAL, dotted, env_level
from ..registry import Hit, rule

# The calls that return the process's rank in the default group, by kind.
_SOURCE_CALLS = {"get_rank": GLOBAL, "get_global_rank": GLOBAL, "get_local_rank": LOCAL,
                 "get_node_local_rank": LOCAL}


@rule('DDP025', 'rank-kind-mixup', 'warning',
      'the global rank picks the GPU, or the local rank is passed as the global rank',
      'LOCAL_RANK picks the device; RANK (dist.get_rank()) is the process-group rank')
def ddp025(info: ModuleInfo) -> Iterator[Hit]:
    """Reported only where the value's source is read in this file (a launcher variable or
    torch's rank call), so the kind is known, not guessed from a name."""
    reported: set[int] = set()
    for rec in info.calls_named("set_device", "init_process_group", "DistributedDataParallel"):
        if rec.last == "init_process_group":
            r = kwarg(rec.node, "rank")
            w = kwarg(rec.node, "world_size")
            by = "each rank comes from the launcher (no `rank=`)" if r is None else \
                _launched(info, r, rec.func)
            if w is not None and by and (node_count := _per_node(info, w, rec.func)):
                yield w, "DDP025", (
                    f"init_process_group(world_size={ast.unparse(w)}) passes this node's "
                    f"{node_count} as the size of the whole group, while {by}: on more than "
                    "one node (or with fewer processes than GPUs) some ranks are at or past "
                    "that size and the rendezvous fails or waits forever; leave world_size to "
                    "the launcher (WORLD_SIZE)")
            if r is not None and (src := _source(info, r, LOCAL, rec.func)):
                yield r, "DDP025", (
                    f"init_process_group(rank={ast.unparse(r)}) passes the local rank "
                    f"({src}) as the global rank: on more than one node, two processes claim "
                    "each rank and the rendezvous fails or waits forever")
            continue
        if rec.last == "set_device":
            if not (info.qualify(rec.node.func) or "").startswith("torch.cuda") \
                    or not rec.node.args:
                continue
            dev: ast.expr | None = rec.node.args[0]
        else:
            ids = kwarg(rec.node, "device_ids")
            dev = ids.elts[0] if isinstance(ids, ast.List) and len(ids.elts) == 1 else None
        if dev is not None and (src := _source(info, dev, GLOBAL, rec.func)):
            reported.add(id(rec.func))
            yield dev, "DDP025", (
                f"the device index `{ast.unparse(dev)}` is the global rank ({src}): on a "
                "second node it is at least the GPUs per node, a device that does not exist "
                "(or shared by two processes); use the local rank")
    yield from _built_devices(info, reported)
    yield from _spawned_world(info)
    yield from _fixed_replicas(info)


_NODES = re.compile(r"^(n|num_|n_|number_of_)?nodes$")


def _launched(info: ModuleInfo, r: ast.expr, func: Func | None) -> str:
    """`rank=` read from a launcher (`args.local_rank`, RANK) in a program that starts no
    process of its own (mp.spawn's count may be the GPU count: both agree): the launcher's
    --nproc_per_node, not the GPUs this node shows, is how many processes exist."""
    src = _source(info, r, LOCAL, func) or _source(info, r, GLOBAL, func)
    if not src or src.endswith("()") or any(
            (i.qualify(rec.node.func) or "").startswith(("torch.multiprocessing", "multiproc"))
            for i in getattr(info.file_set, "infos", None) or [info]
            for rec in i.calls_named("spawn", "start_processes", "Process")):
        return ""
    return f"the launcher starts the processes (`rank=` is its {src})"


def _spawned_world(info: ModuleInfo) -> Iterator[Hit]:
    """`mp.spawn(fn, nprocs=gpus * nodes)`: mp.spawn starts processes on the node it runs on
    only, so each node starts the whole world; on a second node the ranks it computes are
    duplicates or past the world size (and its GPU indices past its own GPUs)."""
    for rec in info.calls_named("spawn", "start_processes"):
        if not (info.qualify(rec.node.func) or "").startswith("torch.multiprocessing"):
            continue
        n = kwarg(rec.node, "nprocs")
        if n is None and len(rec.node.args) > 2:
            n = rec.node.args[2]
        if n is not None and (nodes := _node_product(info, n, rec.func)):
            yield n, "DDP025", (
                f"mp.spawn(nprocs={ast.unparse(n)}) starts a process per GPU of every node "
                f"(a product with `{nodes}`) on this one node: each node spawns the whole world, "
                "so on more than one node ranks repeat or pass the world size and the "
                "rendezvous fails or waits forever; spawn this node's GPU count")


_WORLD_KWARGS = ("world_size", "nprocs", "nproc_per_node", "num_processes")


def _fixed_replicas(info: ModuleInfo) -> Iterator[Hit]:
    """`DistributedSampler(ds, num_replicas=2)`: a number written into the sampler fixes the
    shard count whatever the size of the group; not where the program fixes its world to that
    same number (`mp.spawn(fn, nprocs=2)`, `init_process_group(world_size=2)`, a world-size
    name or option whose value is that number), nor `num_replicas=1` (every rank reads the
    whole set, on purpose)."""
    for rec in info.calls_named(*(n for n in info.call_lasts()
                                  if n.endswith("DistributedSampler"))):
        node = rec.node
        if not info.is_dist_sampler(node):
            continue
        n = kwarg(node, "num_replicas")
        if n is None and len(node.args) > 1:
            n = node.args[1]
        if not (isinstance(n, ast.Constant) and type(n.value) is int and n.value > 1):
            continue
        infos = getattr(info.file_set, "infos", None) or [info]
        if any(n.value in _fixed_worlds(i) for i in infos):
            continue
        yield n, "DDP025", (
            f"DistributedSampler(num_replicas={n.value}) splits the data in {n.value} shards "
            "whatever the size of the group, which the program does not fix: with more "
            f"processes the ranks from {n.value} up raise ValueError (invalid rank) while the "
            "others wait in their next collective; with fewer, part of the data is never read; "
            "pass dist.get_world_size() (or leave num_replicas out)")


def _fixed_worlds(info: ModuleInfo) -> set[int]:
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


def _node_product(info: ModuleInfo, node: ast.expr, func: Func | None, depth: int = 0) -> str:
    """The node count `node` multiplies by (`args.gpus * args.nodes`), directly or through
    the one name it was assigned to in `func` (or the module)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        for side in (node.left, node.right):
            d = dotted(side.args[0] if isinstance(side, ast.Call) and side.args else side)
            if d and _NODES.match(d.rsplit(".", 1)[-1].lower()):
                return d
            inner = _node_product(info, side, func, depth + 1) if depth < 3 else ""
            if inner:
                return inner
        return ""
    d = dotted(node)
    if d is None or depth > 3:
        return ""
    lo, hi = (func.lineno, func.end_lineno or func.lineno) if func else (0, 1 << 30)
    found = [_node_product(info, v, func, depth + 1) for line, v in info.assigns.get(d, [])
             if lo <= line <= hi]
    return found[0] if found and all(found) else ""


def _built_devices(info: ModuleInfo, reported: set[int]) -> Iterator[Hit]:
    """The global rank as the index of a device built by hand: `torch.device(f"cuda:{r}")`,
    `torch.device("cuda", r)`, `x.cuda(r)`, `x.to(r)`, and `torch.load`'s `map_location`
    (`lambda s, loc: s.cuda(r)`, `f"cuda:{r}"`, `{"cuda:0": f"cuda:{r}"}`). The first in a
    function, and none in a function already reported for `set_device` or `device_ids`."""
    for rec in info.calls_named("device", "cuda", "to", "load"):
        if id(rec.func) in reported:
            continue
        node = rec.node
        if rec.last == "load":
            where = kwarg(node, "map_location")
            devs = _mapped(where) if where is not None else []
        elif rec.last == "device":
            if not (info.qualify(node.func) or "").startswith("torch") \
                    or _unused(info, rec.stmt, node):
                continue
            devs = _indexed(node.args)
        else:
            devs = [node.args[0]] if len(node.args) == 1 and not node.keywords else []
            devs = [d for d in devs if not isinstance(d, ast.Constant)]
        for dev in devs:
            dev = _cuda_index(dev) or dev
            if (src := _source(info, dev, GLOBAL, rec.func)):
                reported.add(id(rec.func))
                yield dev, "DDP025", (
                    f"the CUDA device index `{ast.unparse(dev)}` is the global rank ({src}): "
                    "on a second node it is at least the GPUs per node, a device that does "
                    "not exist (or shared by two processes); use the local rank")
                break


def _unused(info: ModuleInfo, stmt: ast.stmt | None, call: ast.Call) -> bool:
    """`self.device = torch.device(f"cuda:{r}")` that nothing reads: building a device checks
    nothing, only moving to it fails."""
    if not (isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1):
        return False
    target = stmt.targets[0]
    name = dotted(target)
    if name is None:
        return False
    return not any(isinstance(n, ast.Attribute | ast.Name) and isinstance(n.ctx, ast.Load)
                   and dotted(n) == name for n in ast.walk(info.tree))


def _per_node(info: ModuleInfo, node: ast.expr, func: Func | None, depth: int = 0) -> str:
    """What names a count of this node only: `torch.cuda.device_count()`, LOCAL_WORLD_SIZE,
    or a name `func` assigns only such a value."""
    if isinstance(node, ast.Call):
        if info.callee_last(node) == "int" and node.args:
            return _per_node(info, node.args[0], func, depth)
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
    found = [_per_node(info, v, func, depth + 1) for line, v in info.assigns.get(d, [])
             if lo <= line <= hi]
    return found[0] if found and all(found) else ""


def _indexed(args: list[ast.expr]) -> list[ast.expr]:
    """The index of `torch.device("cuda", r)` or `torch.device(f"cuda:{r}")`."""
    if len(args) == 2 and isinstance(args[0], ast.Constant) and args[0].value == "cuda":
        return [args[1]]
    return [i for i in args[:1] if _cuda_index(i) is not None]


def _mapped(where: ast.expr) -> list[ast.expr]:
    """The device indices a `map_location` names: the index of a `"cuda:{r}"` string (alone
    or as a dict's value). A lambda's `.cuda(r)` is a call of its own, read as one."""
    vals = where.values if isinstance(where, ast.Dict) else [where]
    return [v for v in vals if v is not None and _cuda_index(v) is not None]


def _cuda_index(node: ast.expr) -> ast.expr | None:
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


def _source(info: ModuleInfo, node: ast.expr, kind: int, func: Func | None,
            depth: int = 0) -> str | None:
    """Where `node` reads the rank of `kind` from, when it is that and nothing else: the
    call or variable itself, or a name that `func` assigns only such a value (or a constant:
    `rank = 0` on the single-process path). A parameter `func` never assigns is whatever the
    caller passed (mp.spawn's index): no source."""
    if isinstance(node, ast.Call):
        last = info.callee_last(node)
        if last in ("int", "str") and node.args:
            return _source(info, node.args[0], kind, func, depth)
        if _SOURCE_CALLS.get(last) == kind and not node.args and not node.keywords:
            return f"{last}()"
        if last in ("get", "getenv") and node.args and isinstance(node.args[0], ast.Constant) \
                and env_level(node.args[0].value) == kind:
            return str(node.args[0].value)
        return None
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value) if env_level(node.slice.value) == kind else None
    d = dotted(node)
    if d is None or depth > 3:
        return None
    if kind == LOCAL and d.rsplit(".", 1)[-1] == "local_rank" and d.startswith(("args.", "opt")):
        return f"{d}, the launcher's --local_rank"
    lo, hi = (func.lineno, func.end_lineno or func.lineno) if func else (0, 1 << 30)
    found = [(line, _source(info, v, kind, func, depth + 1))
             for line, v in info.assigns.get(d, [])
             if lo <= line <= hi and not isinstance(v, ast.Constant)]
    if not found and func is not None and d.startswith("self.") and func in info.func_class:
        # an attribute the class keeps: what its methods assign it (`self.opts.rank =
        # int(os.environ["LOCAL_RANK"])` in `__init__`, read in another method)
        cls = info.classes.get(info.func_class[func])
        if cls is not None:
            lo, hi = cls.lineno, cls.end_lineno or cls.lineno
            found = [(line, _source(info, v, kind, None, depth + 1))
                     for line, v in info.assigns.get(d, [])
                     if lo <= line <= hi and not isinstance(v, ast.Constant)]
    if not found and func is not None and "." not in d and is_parameter(func, d):
        return from_callers(info, func, d,
                            lambda m, arg, f: _source(m, arg, kind, f, depth + 1))
    if found and all(src for _, src in found):
        return found[0][1]
    return next((f"{src}, in the launcher's arm at line {line}" for line, src in found
                 if src and _launcher_arm(info, func, line)), None)


def _launcher_arm(info: ModuleInfo, func: Func | None, line: int) -> bool:
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


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)  # the global rank: no such GPU on the second node
"""

RULE = ddp025
