# Our fixture (issue 20): an evaluation sampler that repeats samples. DistributedSampler pads
# the validation set to a multiple of the world size; the gathered predictions then count
# the repeated samples twice in the accuracy.
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def evaluate(model, val_set):
    sampler = DistributedSampler(val_set, shuffle=False)  # expect: DDP020
    loader = DataLoader(val_set, batch_size=16, sampler=sampler)
    correct = torch.zeros(2)
    for x, y in loader:
        correct[0] += (model(x).argmax(1) == y).sum()
        correct[1] += len(y)
    dist.all_reduce(correct)
    return (correct[0] / correct[1]).item()
