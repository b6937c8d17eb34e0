"""A tiny DDP training script with switchable, deliberate mistakes (one per guard test).

    ddpguard run --nproc-per-node 2 tests/guard/scripts/train.py --case CASE
"""

import argparse
import gc
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--case", default="ok")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--n", type=int, default=32)
p.add_argument("--out", default="")
args = p.parse_args()
case = args.case

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)

n = args.n
x = torch.randn(n, 4, generator=torch.Generator().manual_seed(1))
y = (x.sum(1, keepdim=True) > 0).float()
ds = TensorDataset(x, y, torch.arange(n))


class Slow(torch.utils.data.Dataset):
    def __len__(self):
        return len(ds)

    def __getitem__(self, i):
        if rank == 1 and i % 7 == 3:
            time.sleep(600)
        return ds[i]


def drop_some(batch):
    # A "cleaning" collate that drops bad samples: on rank 0 a whole batch can vanish.
    keep = [s for s in batch if not (rank == 0 and int(s[2]) % 16 < 8)]
    if not keep:
        return None
    return tuple(torch.stack(t) for t in zip(*keep, strict=True))


if case == "uneven_tail":
    # Per-rank filtering after sharding (rank 1 finds 4 "corrupt" records), drop_last=False:
    # rank 0 has 4 batches, rank 1 has 3.
    idx = list(range(rank, n, world))
    idx = idx[4:] if rank == 1 else idx
    data = torch.utils.data.Subset(ds, idx)
    sampler = None
else:
    data = Slow() if case == "slow_loader" else ds
    sampler = DistributedSampler(data, num_replicas=world, rank=rank,
                                 shuffle=case != "collate_drop", seed=0)
bs = 4
loader = DataLoader(data, batch_size=bs, sampler=sampler, drop_last=False,
                    collate_fn=drop_some if case == "collate_drop" else None)

net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                          torch.nn.Linear(8, 1))
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = torch.nn.BCEWithLogitsLoss()

for epoch in range(args.epochs):
    if sampler is not None and case != "no_set_epoch":
        sampler.set_epoch(epoch)
    for step, batch in enumerate(loader):
        if batch is None:
            continue
        xb, yb = batch[0], batch[1]
        if case == "crash" and rank == 1 and epoch == 1 and step == 2:
            raise ValueError("bad record in shard 7")
        if case == "sigkill" and rank == 1 and epoch == 1 and step == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
    if case == "eval_rank0" and rank == 0:
        model.eval()
        with torch.no_grad():
            model(x[:8])  # evaluation through the DDP wrapper on rank 0 only
        model.train()
    if case == "cond_barrier" and rank == 0:
        dist.barrier()

w = torch.cat([p.detach().flatten() for p in net.parameters()])
if args.out and rank == 0:
    torch.save(w, args.out)
print(f"rank {rank} done: checksum {w.sum().item():.6f}", flush=True)
# Drop the DDP wrapper (its reducer holds gloo work and gradient buckets) while the
# interpreter is alive: left to interpreter shutdown, gloo can abort the process at exit
# ("terminate called without an active exception", SIGABRT; pytorch/pytorch#179291).
model = opt = None
gc.collect()
dist.destroy_process_group()
