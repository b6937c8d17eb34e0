# Our fixture (issue 20, sixth round): a GAN whose generator steps every few discriminator
# steps (no accumulation: every backward is followed by its step); a trainer whose sampler gets
# set_epoch from a hook that the trainer of another file calls each epoch; a loader built
# afresh every epoch with the epoch as its seed. Expects nothing.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


def train_gan(G, D, loader, opt_g, opt_d, n_critic, rank, epochs):
    G, D = DDP(G, device_ids=[rank]), DDP(D, device_ids=[rank])
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for i, x in enumerate(loader):
            d_loss = D(G(torch.randn(len(x), 8)).detach()).mean() - D(x).mean()
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            if i % n_critic == 0:
                g_loss = -D(G(torch.randn(len(x), 8))).mean()
                opt_g.zero_grad()
                g_loss.backward()
                opt_g.step()


class SamplerEpochHook:
    def __init__(self, trainer):
        self.trainer = trainer

    def before_epoch(self, epoch):
        self.trainer.loader.sampler.set_epoch(epoch)


class Trainer:
    def __init__(self, dataset, model, hooks):
        self.loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
        self.model, self.hooks = model, hooks

    def train(self, epochs):
        for epoch in range(epochs):
            for hook in self.hooks:
                hook.before_epoch(epoch)
            for batch in self.loader:
                self.model(batch).sum().backward()


def reseeded(dataset, model, epochs):
    dist.init_process_group("nccl")
    for epoch in range(epochs):
        sampler = DistributedSampler(dataset, shuffle=True, seed=epoch)
        for batch in DataLoader(dataset, batch_size=8, sampler=sampler):
            model(batch).sum().backward()
