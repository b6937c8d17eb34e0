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
is such a string), also through a name the function assigns such a string (`dev =
f"cuda:{r}"` in the arm that picks CUDA, then `torch.device(dev)`); the first such site in a
function, none in a function already reported for `set_device` or `device_ids`.

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
whole set, on purpose), nor with a literal `rank=` (a shard picked by hand, as a module's
self-test does, not the process's own).

Only values whose source is certain are reported: a parameter merely named `rank` (the index
`mp.spawn` passes, which is both on one node) is not. A parameter is what the program passes
for it when every call of its function in the files given passes the same kind (`LOCAL_RANK`
read in the entry file, passed as `main(local_rank, ...)` and on to a set-up helper of another
module, `ddp_setup(rank, ...)`, that calls `init_process_group(rank=rank)`); not where the
function is also named other than as a call's callee (a thread's target, a callback: callers
out of sight), nor where one call passes another kind or unpacks `*args`. `mp.spawn(main, ...)`
fills only `main`'s first parameter, with the process's index on its own node (both ranks
there), and a constant argument is the single-process path (`main(0, 1)`): neither tells
anything, and the other calls answer (`main(args.local_rank, ...)` on the launcher's path). An
attribute a class keeps (`self.opts.rank = int(os.environ["LOCAL_RANK"])` in `__init__`, then
`init_process_group(rank=self.opts.rank)` in another method) is what the class's methods assign
it, when every such assignment is of the same kind; a constructor's parameter is what the
class's calls pass (`Trainer(net, rank)` with `rank` read from SLURM_PROCID, then `self.rank =
rank`). `device_ids=` may be the one name the function assigns it (`device_ids = [rank] if
torch.cuda.is_available() else None`: the list of the GPU arm). A name assigned in several arms
of an `if` is reported when an arm whose test picks the launcher (`"SLURM_PROCID" in
os.environ`, `args.local_rank != -1`) assigns the wrong kind: each launcher runs on several
nodes; not under a test of the node count (`args.nnodes == 1`), nor for `rank % ngpus`. Fix:
`LOCAL_RANK` for the device, `RANK` (or `dist.get_rank()`) for the process group. """

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import Func, ModuleInfo, kwarg
from ..analysis.provenance import GLOBAL, LOCAL, dotted
from ..analysis.rank_kind import (
    fixed_worlds,
    indexed,
    mapped,
    named_cuda,
    node_product,
    per_node,
    rank_source,
)
from ..registry import Hit, rule


@rule('DDP025', 'rank-kind-mixup', 'warning',
      'the global rank picks the GPU, or the local rank is passed as the global rank',
      'LOCAL_RANK picks the device; RANK (dist.get_rank()) is the process-group rank; the '
      'world size (dist.get_world_size()) is the number of shards')
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
            if w is not None and by and (node_count := per_node(info, w, rec.func)):
                yield w, "DDP025", (
                    f"init_process_group(world_size={ast.unparse(w)}) passes this node's "
                    f"{node_count} as the size of the whole group, while {by}: on more than "
                    "one node (or with fewer processes than GPUs) some ranks are at or past "
                    "that size and the rendezvous fails or waits forever; leave world_size to "
                    "the launcher (WORLD_SIZE)")
            if r is not None and (src := rank_source(info, r, LOCAL, rec.func)):
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
            ids = _device_list(info, kwarg(rec.node, "device_ids"), rec.func)
            dev = ids.elts[0] if ids is not None and len(ids.elts) == 1 else None
        if dev is not None and (src := rank_source(info, dev, GLOBAL, rec.func)):
            reported.add(id(rec.func))
            yield dev, "DDP025", (
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
        if n is not None and (nodes := node_product(info, n, rec.func)):
            yield n, "DDP025", (
                f"mp.spawn(nprocs={ast.unparse(n)}) starts a process per GPU of every node "
                f"(a product with `{nodes}`) on this one node: each node spawns the whole world, "
                "so on more than one node ranks repeat or pass the world size and the "
                "rendezvous fails or waits forever; spawn this node's GPU count")


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
        r = kwarg(node, "rank") or (node.args[2] if len(node.args) > 2 else None)
        if isinstance(r, ast.Constant):
            continue  # a shard picked by hand (GROVER's self-test): not this process's split
        infos = getattr(info.file_set, "infos", None) or [info]
        if any(n.value in fixed_worlds(i) for i in infos):
            continue
        yield n, "DDP025", (
            f"DistributedSampler(num_replicas={n.value}) splits the data in {n.value} shards "
            "whatever the size of the group, which the program does not fix: with more "
            f"processes the ranks from {n.value} up raise ValueError (invalid rank) while the "
            "others wait in their next collective; with fewer, part of the data is never read; "
            "pass dist.get_world_size() (or leave num_replicas out)")


def _built_devices(info: ModuleInfo, reported: set[int]) -> Iterator[Hit]:
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


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(rank)  # the global rank: no such GPU on the second node
"""

RULE = ddp025
