# Our fixture (issue 13): shards cut by hand give ranks different sample counts whenever the
# length does not divide by the world size.
import numpy as np
import torch.distributed as dist


def shard_files(files):
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    return files[rank::world_size]  # expect: DDP003


def shard_array(data):
    return np.array_split(data, dist.get_world_size())[dist.get_rank()]  # expect: DDP003


def every_other(items):
    return items[0::2]


def interleave(tokens, rank):
    return tokens[rank::3]  # a fixed stride, not the world size: no shard
