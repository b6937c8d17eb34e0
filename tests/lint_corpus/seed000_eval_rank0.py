# ruff: noqa  (test data for ddpguard lint: kept as the seeds wrote it)
# Seed 000's hang (epoch 1 fine, stuck at the start of epoch 2): its setup with validation run
# on rank 0 only, through the DDP wrapper, while the other ranks wait in a barrier
# (reconstructed from the post's description; the post's fix broadcast_buffers=False only
# hides it). Rank 0's first forward after training broadcasts the buffers; the barrier is
# another collective, so the two never match. (Without the barrier a no_grad forward's one
# broadcast would pair with the others' next training forward.)
import os

import torch
import torch.distributed as dist


def validate(model, loader):
    model.eval()
    with torch.no_grad():
        for x, y in loader:
            model(x)


def main(cfg, train_set, val_loader, net):
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_set)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=8, sampler=train_sampler,
                                               drop_last=True)
    model = torch.nn.parallel.DistributedDataParallel(net.cuda(), device_ids=[local_rank])
    for epoch in range(cfg.epochs):
        train_sampler.set_epoch(epoch)
        for x, y in train_loader:
            model(x).sum().backward()
        if dist.get_rank() == 0:
            validate(model, val_loader)
            with torch.no_grad():
                out = model(x)
        dist.barrier()
    dist.destroy_process_group()
