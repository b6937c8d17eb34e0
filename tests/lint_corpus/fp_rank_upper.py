# Our fixture (issue 13): upper-case rank constants and membership tests guard the writes.
# Lines that should be reported carry an expect marker; this file has none.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

LOCAL_RANK = int(os.getenv("LOCAL_RANK", "-1"))
RANK = int(os.getenv("RANK", "-1"))


def train(model, loader, optimizer, epochs, out):
    if LOCAL_RANK != -1:  # tells distributed from not; no rank split
        torch.cuda.set_device(LOCAL_RANK)
        dist.init_process_group("nccl")
        model = DDP(model.cuda(LOCAL_RANK), device_ids=[LOCAL_RANK])
    for epoch in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        if RANK in {-1, 0}:
            torch.save({"epoch": epoch, "model": model.module.state_dict()}, out)
    if RANK == -1 and torch.cuda.device_count() > 1:
        print("single process: consider torchrun")
    if dist.is_initialized():
        dist.destroy_process_group()
