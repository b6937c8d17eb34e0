# Our fixture (issue 20): the rank guard sits inside the callee. A helper called on every rank
# reduces, then returns early on the ranks that are not dst before it reads the sum; an
# evaluation helper runs the unwrapped model.module on rank 0. Expects nothing.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def mean_loss(loss, world_size):
    dist.reduce(loss, dst=0)
    if dist.get_rank() != 0:
        return None
    return loss.item() / world_size


def evaluate(model, batch):
    with torch.no_grad():
        return model.module(batch).mean()


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    model = DDP(torch.nn.Linear(4, 4).cuda(local_rank), device_ids=[local_rank])
    for _step in range(10):
        loss = model(torch.randn(2, 4, device=local_rank)).sum()
        loss.backward()
        mean_loss(loss.detach(), dist.get_world_size())
        if dist.get_rank() == 0:
            print(evaluate(model, torch.randn(2, 4, device=local_rank)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
