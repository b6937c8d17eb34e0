# ruff: noqa  (test data for ddpguard lint: kept as the seeds wrote it)
"""Correct DDP script, class-based trainer with an early-return rank-0 save."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, net, dataset, epochs):
        self.rank = dist.get_rank()
        self.is_master = self.rank == 0
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
        self.model = DistributedDataParallel(net)
        self.sampler = DistributedSampler(dataset, drop_last=True)
        self.train_loader = DataLoader(dataset, batch_size=4, sampler=self.sampler)
        self.opt = torch.optim.AdamW(self.model.parameters())
        self.epochs = epochs

    def step(self, batch):
        x, y = batch
        self.opt.zero_grad()
        loss = nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def save(self, path):
        if not self.is_master:
            return
        state = {"model": self.model.module.state_dict(), "opt": self.opt.state_dict()}
        torch.save(state, path)

    def fit(self):
        for epoch in range(self.epochs):
            self.train_loader.sampler.set_epoch(epoch)
            losses = [self.step(b) for b in self.train_loader]
            mean = torch.stack(losses).mean()
            dist.all_reduce(mean)
            self.save(f"ckpt_{epoch}.pt")
            dist.barrier()
        if self.is_master:
            print("done")


def run(net, dataset):
    dist.init_process_group("gloo")
    try:
        Trainer(net, dataset, epochs=2).fit()
    finally:
        dist.destroy_process_group()
