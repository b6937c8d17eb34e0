"""Programs for promises the guard makes that are easy to break silently, one per --case:

- desync_long: the ranks desync early in a long run that neither hangs nor crashes (two
  broadcasts of the same byte size, different dtypes); only the periodic comparison can see it
  before the job ends.
- uneven_local: a pass over loaders of different lengths with no collective inside (per-rank
  local work), then collectives again: healthy.
- sigstop: rank 1 is stopped by SIGSTOP while rank 0 waits.
- stall: rank 1 spins forever while rank 0 waits (judged after DDPGUARD_NO_LIFE seconds).
- stall_poll: rank 1 busy-waits on a flag read through a helper that nothing sets.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--case", required=True)
p.add_argument("--steps", type=int, default=40)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()


def sync_step(i):
    t = torch.full((8,), float(i))
    dist.all_reduce(t)
    return t


for i in range(3):
    sync_step(i)

if args.case == "desync_long":
    if rank == 0:
        dist.broadcast(torch.zeros(16, dtype=torch.float32), src=0)  # desync: float32
    else:
        dist.broadcast(torch.zeros(16, dtype=torch.int32), src=0)  # desync: int32
    for i in range(args.steps):
        sync_step(i)
        time.sleep(0.25)
        print(f"rank {rank} step {i}", flush=True)
elif args.case == "uneven_local":
    n = 32 if rank == 0 else 28  # per-rank shards of different sizes
    loader = DataLoader(TensorDataset(torch.randn(n, 4)), batch_size=4)
    total = 0.0
    for (xb,) in loader:  # local statistics only: no collective in this pass
        total += float(xb.abs().sum())
        time.sleep(0.2)
    dist.barrier()
    for i in range(3):
        sync_step(i)
elif args.case == "sigstop":
    if rank == 1:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGSTOP)  # frozen: stopped by a signal
    sync_step(99)
elif args.case == "stall":
    if rank == 1:
        n = 0
        while True:  # stall: spins forever
            n += 1
    sync_step(99)
elif args.case == "stall_poll":
    if rank == 1:
        def logged(tree=None):
            tree = {"epoch": {"logged": None}} if tree is None else tree
            return any(v if k == "logged" else isinstance(v, dict) and logged(v)
                       for k, v in tree.items())

        while not logged():  # stall: polls a flag nothing sets
            pass
    sync_step(99)
else:
    raise SystemExit(f"unknown case {args.case!r}")
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
