"""Broken DDP programs whose report title must come from the ranks' aligned collective
sequences (docs/guard.md, "What the report says"), one per --case, on 2 gloo ranks.

    ddpguard run --nproc-per-node 2 tests/guard/scripts/align_scenarios.py --case CASE

skip_backward   rank 1 skips the backward of one batch (a local check `continue`s past it)
left_early      rank 1 leaves its loop on its own clock and waits in the final barrier
object_rank0    rank 0 broadcasts an object on its own, mid-epoch
flock           rank 0 holds a file lock and waits in a barrier; rank 1 waits for the lock
"""

import argparse
import fcntl
import gc
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--case", required=True)
case = p.parse_args().case

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
x = torch.randn(256, 4, generator=torch.Generator().manual_seed(1))
y = (x.sum(1, keepdim=True) > 0).float()
ds = TensorDataset(x, y)
sampler = DistributedSampler(ds, shuffle=True, seed=0)
loader = DataLoader(ds, batch_size=4, sampler=sampler, drop_last=True)
# BatchNorm: DDP broadcasts its buffers at every forward.
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                          torch.nn.Linear(8, 1))
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = torch.nn.BCEWithLogitsLoss()

if case == "flock":
    path = os.path.join(tempfile.gettempdir(), f"ddpguard-align-{os.environ['MASTER_PORT']}.lock")
    fh = open(path, "w")  # noqa: SIM115
    if rank == 0:
        fcntl.flock(fh, fcntl.LOCK_EX)  # rank 0 builds the shared cache under the lock ...
        dist.barrier()  # ... and waits for the others to arrive, still holding it
        fcntl.flock(fh, fcntl.LOCK_UN)
    else:
        time.sleep(0.5)
        fcntl.flock(fh, fcntl.LOCK_EX)  # rank 1 waits for the lock rank 0 holds
        fcntl.flock(fh, fcntl.LOCK_UN)
        dist.barrier()

start = time.monotonic()
for epoch in range(3):
    sampler.set_epoch(epoch)
    for i, (xb, yb) in enumerate(loader):
        if case == "left_early" and rank == 1 and i == 6:
            break  # its own time budget ran out (time.monotonic() - start > budget)
        if case == "object_rank0" and rank == 0 and i == 5:
            meta = [{"epoch": epoch, "lr": 0.1}]
            dist.broadcast_object_list(meta, src=0)  # only rank 0 gets here
        opt.zero_grad()
        out = model(xb)
        loss = loss_fn(out, yb)
        if case == "skip_backward" and rank == 1 and i == 10:
            continue  # a local check: skip this batch (loss looked bad on this rank)
        loss.backward()
        opt.step()
    if case == "left_early":
        dist.barrier()  # wait for the others before saving
        break

print(f"rank {rank} done", flush=True)
model = None
gc.collect()
dist.destroy_process_group()
