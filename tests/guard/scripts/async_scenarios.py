"""The NCCL pattern on CPU: collectives issued with async_op=True and waited for later, the way
a GPU rank's host returns from NCCL at once and waits in Work.wait(), a synchronise or .item().

    ddpguard run --nproc-per-node 2 tests/guard/scripts/async_scenarios.py --case CASE --wait W

--wait is how the host waits: `wait` (Work.wait()), `poll` (a busy loop on is_completed(),
which spins a core like CUDA's default synchronisation), `future` (work.get_future().wait()).
Each case trains a few steps, then one classic bug.
"""

import argparse
import os
import signal
import sys

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--case", required=True)
p.add_argument("--wait", default="poll", choices=["wait", "poll", "future"])
p.add_argument("--steps", type=int, default=4)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
side = dist.new_group([0, 1])  # a second group of the same ranks (a pipeline's side channel)


def finish(work):
    if args.wait == "wait":
        work.wait()
    elif args.wait == "future":
        work.get_future().wait()
    else:
        while not work.is_completed():  # spins a core, like cudaDeviceSynchronize
            pass


def step(i):
    grads = torch.full((64,), float(rank + i))
    finish(dist.all_reduce(grads, async_op=True))
    return grads


for i in range(args.steps):
    step(i)
print(f"rank {rank} trained", flush=True)

if args.case == "healthy":
    # Rank 0 works for a while before its collective; rank 1 has issued its own and polls.
    if rank == 0:
        t = torch.randn(256, 256)
        for _ in range(int(os.environ.get("ASYNC_WORK", "300"))):
            t = torch.tanh(t @ t.T / 256)
    step(99)
elif args.case == "mismatch":
    if rank == 0:
        finish(dist.barrier(async_op=True))  # mismatch: rank 0 only
    else:
        step(100)
elif args.case == "cross":
    # Each rank waits on a group the other never reaches.
    if rank == 0:
        finish(dist.all_reduce(torch.ones(8), group=side, async_op=True))  # cross: side group
    else:
        step(100)
elif args.case == "new_group":
    if rank == 0:
        dist.new_group([0, 1])  # new_group on rank 0 only
    else:
        step(100)
elif args.case == "peer_gone":
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    step(100)
elif args.case == "early_exit":
    if rank == 1:
        dist.destroy_process_group()
        sys.exit(0)
    step(100)
else:
    raise SystemExit(f"unknown case {args.case!r}")
dist.barrier()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
