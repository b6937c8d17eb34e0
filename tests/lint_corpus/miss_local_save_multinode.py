# Our fixture (issue 13): multi-node-capable code whose checkpoint is written by local rank 0,
# i.e. once per node, through an attribute and through rank arithmetic.
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def save_checkpoint(state, filename="checkpoint.pth"):
    torch.save(state, filename)


class Trainer:
    def __init__(self, model):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = DDP(model.to(self.local_rank), device_ids=[self.local_rank])

    def _save(self, epoch):
        torch.save({"model": self.model.module.state_dict(), "epoch": epoch}, "snapshot.pt")

    def fit(self, epochs):
        for epoch in range(epochs):
            if self.local_rank == 0:
                self._save(epoch)  # expect: DDP017


def main_worker(gpu, ngpus_per_node, args):
    args.rank = args.rank * ngpus_per_node + gpu
    dist.init_process_group("nccl", world_size=args.world_size, rank=args.rank)
    for epoch in range(args.epochs):
        if args.rank % ngpus_per_node == 0:
            save_checkpoint({"epoch": epoch})  # expect: DDP017
        if args.rank == 0:
            save_checkpoint({"epoch": epoch}, "global.pth")
    dist.destroy_process_group()
