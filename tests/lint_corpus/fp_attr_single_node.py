# Our fixture (issue 13): the local rank kept on `self`, tested in another method; a
# single-node torchrun script, so local rank 0 is rank 0. Expects nothing.
import os

import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, loader, optimizer, save_every):
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model = DDP(model.to(self.gpu_id), device_ids=[self.gpu_id])
        self.loader = loader
        self.optimizer = optimizer
        self.save_every = save_every

    def _save_snapshot(self, epoch):
        torch.save({"model": self.model.module.state_dict(), "epoch": epoch}, "snapshot.pt")

    def train(self, epochs):
        for epoch in range(epochs):
            self.loader.sampler.set_epoch(epoch)
            for x, y in self.loader:
                self.optimizer.zero_grad()
                torch.nn.functional.mse_loss(self.model(x), y).backward()
                self.optimizer.step()
            if self.gpu_id == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def main(model, loader, optimizer):
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    init_process_group(backend="nccl")
    Trainer(model, loader, optimizer, save_every=5).train(10)
    destroy_process_group()
