"""The kinds of rank mixed up (DDP025's and DDP046's question): the global rank as a device
index, the local rank as the group's rank, a node's count as the group's size. What each form
is and what is left alone is DDP025's page (rules/ddp025_rank_kind_mixup.py)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from .context import Func, ModuleInfo, kwarg
from .provenance import GLOBAL, LOCAL, dotted
from .rank_kind import (
    fixed_worlds,
    indexed,
    mapped,
    named_cuda,
    node_product,
    per_node,
    rank_source,
)

# What a mix-up is: the device picked by the global rank, the group's rank read from the
# local rank (both right on one node, wrong on several), or the count of one node (or a
# number written down) taken as the group's size.
DEVICE, GROUP_RANK, WORLD = "device", "group-rank", "world"
Mixup = tuple[ast.AST, str, str]


def rank_mixups(info: ModuleInfo) -> list[Mixup]:
    """Each mix-up of this file: (node, kind, message). Reported only where the value's source
    is read in the files given (a launcher variable or torch's rank call), so the kind is
    known, not guessed from a name. DDP025 and DDP046 share it, so it runs once a file."""
    key = ("rank_mixups", 0)
    if key not in info._memo:
        info._memo[key] = list(_mixups(info))
    return info._memo[key]  # type: ignore[return-value]


def _mixups(info: ModuleInfo) -> Iterator[Mixup]:
    reported: set[int] = set()
    for rec in info.calls_named("set_device", "init_process_group", "DistributedDataParallel"):
        if rec.last == "init_process_group":
            r = kwarg(rec.node, "rank")
            w = kwarg(rec.node, "world_size")
            by = "each rank comes from the launcher (no `rank=`)" if r is None else \
                _launched(info, r, rec.func)
            if w is not None and by and (node_count := per_node(info, w, rec.func)) and not any(
                    func is rec.func and line < rec.node.lineno
                    for func, line, _ in _visible_devices(info)):
                yield w, WORLD, (
                    f"init_process_group(world_size={ast.unparse(w)}) passes this node's "
                    f"{node_count} as the size of the whole group, while {by}: on more than "
                    "one node (or with fewer processes than GPUs) some ranks are at or past "
                    "that size and the rendezvous fails or waits forever; leave world_size to "
                    "the launcher (WORLD_SIZE)")
            if r is not None and (src := rank_source(info, r, LOCAL, rec.func)):
                yield r, GROUP_RANK, (
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
            ids = _device_list(info, kwarg(rec.node, "device_ids"), rec.func)
            dev = ids.elts[0] if ids is not None and len(ids.elts) == 1 else None
        if dev is not None and (src := rank_source(info, dev, GLOBAL, rec.func)):
            reported.add(id(rec.func))
            yield dev, DEVICE, (
                f"the device index `{ast.unparse(dev)}` is the global rank ({src}): on a "
                "second node it is at least the GPUs per node, a device that does not exist "
                "(or shared by two processes); use the local rank")
    yield from _built_devices(info, reported)
    yield from _spawned_world(info)
    yield from _fixed_replicas(info)


def _device_list(info: ModuleInfo, ids: ast.expr | None, func: Func | None) -> ast.List | None:
    """`device_ids=[r]`, also through the one name the function assigns it (`device_ids =
    [rank] if torch.cuda.is_available() else None`: the arm that uses a GPU)."""
    if isinstance(ids, ast.Name) and func is not None:
        lo, hi = func.lineno, func.end_lineno or func.lineno
        values = [v for line, v in info.assigns.get(ids.id, []) if lo <= line <= hi]
        ids = values[0] if len(values) == 1 else None
    if isinstance(ids, ast.IfExp):
        arms = [a for a in (ids.body, ids.orelse) if isinstance(a, ast.List)]
        ids = arms[0] if len(arms) == 1 else None
    return ids if isinstance(ids, ast.List) else None


def _launched(info: ModuleInfo, r: ast.expr, func: Func | None) -> str:
    """`rank=` read from a launcher (`args.local_rank`, RANK) in a program that starts no
    process of its own (mp.spawn's count may be the GPU count: both agree): the launcher's
    --nproc_per_node, not the GPUs this node shows, is how many processes exist."""
    src = rank_source(info, r, LOCAL, func) or rank_source(info, r, GLOBAL, func)
    if not src or src.endswith("()") or any(
            (i.qualify(rec.node.func) or "").startswith(("torch.multiprocessing", "multiproc"))
            for i in getattr(info.file_set, "infos", None) or [info]
            for rec in i.calls_named("spawn", "start_processes", "Process")):
        return ""
    return f"the launcher starts the processes (`rank=` is its {src})"


def _spawned_world(info: ModuleInfo) -> Iterator[Mixup]:
    """`mp.spawn(fn, nprocs=gpus * nodes)`: mp.spawn starts processes on the node it runs on
    only, so each node starts the whole world; on a second node the ranks it computes are
    duplicates or past the world size (and its GPU indices past its own GPUs)."""
    for rec in info.calls_named("spawn", "start_processes"):
        if not (info.qualify(rec.node.func) or "").startswith("torch.multiprocessing"):
            continue
        n = kwarg(rec.node, "nprocs")
        if n is None and len(rec.node.args) > 2:
            n = rec.node.args[2]
        if n is not None and (nodes := node_product(info, n, rec.func)):
            yield n, WORLD, (
                f"mp.spawn(nprocs={ast.unparse(n)}) starts a process per GPU of every node "
                f"(a product with `{nodes}`) on this one node: each node spawns the whole world, "
                "so on more than one node ranks repeat or pass the world size and the "
                "rendezvous fails or waits forever; spawn this node's GPU count")


def _fixed_replicas(info: ModuleInfo) -> Iterator[Mixup]:
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
        r = kwarg(node, "rank") or (node.args[2] if len(node.args) > 2 else None)
        if isinstance(r, ast.Constant):
            continue  # a shard picked by hand (GROVER's self-test): not this process's split
        infos = getattr(info.file_set, "infos", None) or [info]
        if any(n.value in fixed_worlds(i) for i in infos) or any(
                isinstance(v, ast.Constant) and isinstance(v.value, str)
                and len([d for d in v.value.split(",") if d.strip()]) == n.value
                for i in infos for _, _, v in _visible_devices(i)):
            continue
        yield n, WORLD, (
            f"DistributedSampler(num_replicas={n.value}) splits the data in {n.value} shards "
            "whatever the size of the group, which the program does not fix: with more "
            f"processes the ranks from {n.value} up raise ValueError (invalid rank) while the "
            "others wait in their next collective; with fewer, part of the data is never read; "
            "pass dist.get_world_size() (or leave num_replicas out)")


def _visible_devices(info: ModuleInfo) -> list[tuple[Func | None, int, ast.expr]]:
    """`os.environ["CUDA_VISIBLE_DEVICES"] = v` in this file: (function, line, v). The program
    that sets it decides how many GPUs a node shows (`"0,1"` with `num_replicas=2`: UWNR's
    two-process launch), and a GPU count read after it is that number (SurMo)."""
    key = ("visible_devices", 0)
    if key not in info._memo:
        out: list[tuple[Func | None, int, ast.expr]] = []
        for func, node in _assignments(info):
            t = node.targets[0]
            if isinstance(t, ast.Subscript) and dotted(t.value) in ("os.environ", "environ") \
                    and isinstance(t.slice, ast.Constant) \
                    and t.slice.value == "CUDA_VISIBLE_DEVICES":
                out.append((func, node.lineno, node.value))
        info._memo[key] = out
    return info._memo[key]  # type: ignore[return-value]


def _assignments(info: ModuleInfo) -> Iterator[tuple[Func | None, ast.Assign]]:
    """Each one-target assignment of the file, with the function that holds it."""
    funcs = [f for fs in info.funcs.values() for f in fs]
    for node in ast.walk(info.tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            inner = [f for f in funcs if f.lineno <= node.lineno <= (f.end_lineno or 0)]
            yield max(inner, key=lambda f: f.lineno, default=None), node


def _built_devices(info: ModuleInfo, reported: set[int]) -> Iterator[Mixup]:
    """The global rank as the index of a device built by hand: `torch.device(f"cuda:{r}")`,
    `torch.device("cuda", r)`, `x.cuda(r)`, `x.to(r)`, and `torch.load`'s `map_location`
    (`lambda s, loc: s.cuda(r)`, `f"cuda:{r}"`, `{"cuda:0": f"cuda:{r}"}`), also through a
    name the function assigns such a string (`dev = f"cuda:{r}"`, then `torch.device(dev)`).
    The first in a function, and none in a function already reported for `set_device` or
    `device_ids`."""
    for rec in info.calls_named("device", "cuda", "to", "load"):
        if id(rec.func) in reported:
            continue
        node = rec.node
        if rec.last == "load":
            where = kwarg(node, "map_location")
            if isinstance(where, ast.Name) and rec.func is not None:
                # `map_location = {"cuda:0": "cuda:%d" % rank}`, then `torch.load(p,
                # map_location=map_location)` (motionflow): the one value the function gives it
                lo, hi = rec.func.lineno, rec.func.end_lineno or rec.func.lineno
                vals = [v for line, v in info.assigns.get(where.id, []) if lo <= line <= hi]
                where = vals[0] if len({ast.dump(v) for v in vals}) == 1 else where
            devs = mapped(where) if where is not None else []
        elif rec.last == "device":
            if not (info.qualify(node.func) or "").startswith("torch") \
                    or _unused(info, rec.stmt, node):
                continue
            devs = indexed(node.args) or node.args[:1]
        else:
            devs = [node.args[0]] if len(node.args) == 1 and not node.keywords else []
            devs = [d for d in devs if not isinstance(d, ast.Constant)]
        for dev in (i for d in devs for i in named_cuda(info, d, rec.func)):
            if (src := rank_source(info, dev, GLOBAL, rec.func)):
                reported.add(id(rec.func))
                yield dev, DEVICE, (
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


