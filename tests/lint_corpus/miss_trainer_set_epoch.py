# Our fixture (issue 20, an older held-out case): a trainer class whose shuffling
# DistributedSampler never gets set_epoch; the epoch loop calls a method that iterates
# self.loader. Every epoch repeats the same order.
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


class Trainer:
    def __init__(self, model, train_set):
        self.model = model
        self.sampler = DistributedSampler(train_set, shuffle=True)
        self.loader = DataLoader(train_set, batch_size=8, sampler=self.sampler)

    def _run_epoch(self, epoch):
        for x, _y in self.loader:
            self.model(x).sum().backward()

    def train(self, epochs):
        for epoch in range(epochs):  # expect: DDP001
            self._run_epoch(epoch)
        dist.barrier()
