# Our fixture (issue 20): sharding that is even. `if i % world_size != rank: continue` splits
# an evaluation set across ranks (no collective inside the loop); a list padded to a multiple
# of the world size just above is sliced per rank. Expects nothing.
import torch
import torch.distributed as dist


def evaluate(samples, model):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    correct = torch.zeros(1)
    for i, (x, y) in enumerate(samples):
        if i % world_size != rank:
            continue
        correct += (model(x).argmax() == y).float()
    dist.all_reduce(correct)
    return correct


def shard(files):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    padded = files + files[: (-len(files)) % world_size]
    return padded[rank::world_size]
