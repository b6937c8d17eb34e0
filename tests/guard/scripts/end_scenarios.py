"""Ends of a job that are not hangs: a collective that fails on the process group's own
timeout, a rank aborted inside gloo, a DataLoader worker killed. One --case per job on 2 gloo
ranks; --init forms the group with ddpguard.init() instead of init_process_group.

    ddpguard run --nproc-per-node 2 tests/guard/scripts/end_scenarios.py --case pg_timeout
"""

import argparse
import os
import signal
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

p = argparse.ArgumentParser()
p.add_argument("--case", required=True, choices=["pg_timeout", "thread_collective",
                                                  "worker_killed"])
p.add_argument("--timeout", type=float, default=3.0,
               help="the process group's timeout (s) from the first step on (pg_timeout)")
p.add_argument("--init", action="store_true", help="form the group with ddpguard.init()")
args = p.parse_args()

# Set-up gets a generous timeout: on a loaded machine one rank can take seconds longer to
# import and build the model, and a 3 s timeout would already fire there.
if args.init:
    import ddpguard

    ddpguard.init(backend="gloo", timeout=60, init_timeout=60)
else:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)


class Records(Dataset):
    """Rank 1's loader worker is killed (SIGKILL: the OOM killer's signal) at item 20."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        if args.case == "worker_killed" and rank == 1 and i >= 20:
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator().manual_seed(i)
        return torch.randn(4, generator=g), torch.ones(1)


class Gathered(torch.nn.Module):
    """A layer that gathers features from every rank (deep in the model)."""

    def forward(self, h):
        parts = [torch.empty_like(h) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, h.detach())
        return h + 0 * torch.stack(parts).mean(0)


model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), Gathered(), torch.nn.Linear(8, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = Records()
sampler = DistributedSampler(data, shuffle=False)
loader = DataLoader(data, batch_size=4, sampler=sampler,
                    num_workers=1 if args.case == "worker_killed" else 0)


def checkpoint(seconds):
    """A legitimate long step on rank 0: the checkpoint written in chunks."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.save(model.state_dict(), os.devnull)
        time.sleep(0.01)


def metrics_sync():
    """A metrics thread: its all_reduce is paired by gloo with whatever the other rank
    issues next (here DDP's gradient all-reduce)."""
    dist.all_reduce(torch.ones(3))


if args.case == "pg_timeout":
    # What init_process_group(timeout=...) sets, made short once every rank is training.
    dist.distributed_c10d._set_pg_timeout(timedelta(seconds=args.timeout))
for step, (xb, yb) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    if args.case == "thread_collective" and step == 3 and rank == 1:
        threading.Thread(target=metrics_sync, name="metrics").start()
        time.sleep(0.2)
    loss.backward()
    opt.step()
    opt.zero_grad()
    if args.case == "pg_timeout" and step == 3:
        if rank == 0:
            checkpoint(3 * args.timeout)
        dist.barrier()  # rank 1 times out here after args.timeout seconds
    if step == 12:
        break
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
