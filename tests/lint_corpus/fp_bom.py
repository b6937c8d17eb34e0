# Our fixture (issue 20): a file that starts with a UTF-8 byte-order mark. Python compiles
# it, so it is linted like any other: no DDP000, and its pitfall is found.
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def loader(ds):
    return DataLoader(ds, sampler=DistributedSampler(ds), shuffle=True)  # expect: DDP002


def sync():
    dist.barrier()
