# ruff: noqa  (test data for ddpguard lint: kept as the seeds wrote it)
"""Correct DDP script, function-based loop, `if __name__` guard, aliased sampler import."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data import DistributedSampler as DS


def is_main_process():
    return dist.get_rank() == 0


def train_one_epoch(model, loader, opt, epoch):
    loader.sampler.set_epoch(epoch)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def evaluate(model, loader):
    total = torch.zeros(2)
    with torch.no_grad():
        for x, y in loader:
            total += torch.tensor([torch.nn.functional.mse_loss(model(x), y).item(), 1.0])
    dist.all_reduce(total)
    return (total[0] / total[1]).item()


def main():
    dist.init_process_group("gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    ds = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    sampler = DS(ds, shuffle=True, drop_last=True)
    train_loader = DataLoader(ds, batch_size=8, sampler=sampler)
    val_loader = DataLoader(ds, batch_size=8, sampler=DS(ds, shuffle=False))
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for epoch in range(3):
            train_one_epoch(model, train_loader, opt, epoch)
            val = evaluate(model, val_loader)
            if is_main_process():
                print(f"epoch {epoch} val {val:.3f} (local rank {local_rank})")
                torch.save(model.module.state_dict(), "ckpt.pt")
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
