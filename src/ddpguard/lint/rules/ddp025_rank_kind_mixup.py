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
nodes; not under a test of the node count (`args.nnodes == 1`), nor for `rank % ngpus`.

The device and group-rank forms are right on one node, where the two ranks are one number: they
are reported here only where the program shows it runs on more than one node, in the file or
one import away (a node's launcher variable, `NODE_RANK`, `SLURM_PROCID`,
`OMPI_COMM_WORLD_RANK`; a node-count or node-rank option; a product with a count per node,
`ngpus_per_node * args.world_size`; `MASTER_ADDR` set to another machine's address; the
Determined launcher), and the message names that evidence. Without it they are DDP046's
(preview): reviewers judged 27 of 27 such first findings debatable, every shipped launch being
one node. The size forms bite on one node too and need no evidence; a written
`num_replicas=N` is silent where the program sets `CUDA_VISIBLE_DEVICES` to a literal list of
exactly N devices, and `world_size=torch.cuda.device_count()` where the function set
`CUDA_VISIBLE_DEVICES` before it. Fix: `LOCAL_RANK` for the device, `RANK` (or
`dist.get_rank()`) for the process group. """

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.context import ModuleInfo
from ..analysis.node_evidence import several_nodes
from ..analysis.rank_mixups import WORLD, rank_mixups
from ..registry import Hit, rule


@rule('DDP025', 'rank-kind-mixup', 'warning',
      'the global rank picks the GPU, or the local rank is passed as the global rank',
      'LOCAL_RANK picks the device; RANK (dist.get_rank()) is the process-group rank; the '
      'world size (dist.get_world_size()) is the number of shards')
def ddp025(info: ModuleInfo) -> Iterator[Hit]:
    """A program that runs on several nodes and mixes the ranks up: one node's processes pick
    GPUs another node owns, or two processes claim one rank and the rendezvous waits."""
    for node, kind, message in rank_mixups(info):
        if kind == WORLD:
            yield node, "DDP025", message
        elif evidence := several_nodes(info):
            yield node, "DDP025", f"{message} (this program runs on more than one node: {evidence})"


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl", rank=int(os.environ["SLURM_PROCID"]))
rank = dist.get_rank()
torch.cuda.set_device(rank)  # the global rank: no such GPU on the second node
"""

RULE = ddp025
