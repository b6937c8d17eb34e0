# Our fixture (issue 20, second round): the leader-goes-first idiom written as two plain `if`
# statements around set-up that may raise on every rank alike, then shards cut from a count
# that is a multiple of the world size (tensor_split always returns that many pieces, some
# empty). Every rank makes exactly one set-up barrier and the same number of loop barriers.
# Expects nothing.
import torch
import torch.distributed as dist


def load_stats(path, max_batch=64, expected=None):
    if dist.get_rank() != 0:
        dist.barrier()  # the others wait while rank 0 downloads
    with open(path) as f:
        items = sorted(f.read().split())
    if expected is not None and len(items) < expected:
        raise ValueError(f"found {len(items)} items, expected {expected}")
    if dist.get_rank() == 0:
        dist.barrier()  # rank 0 lets them go
    world = dist.get_world_size()
    num_batches = ((len(items) - 1) // (max_batch * world) + 1) * world
    batches = torch.arange(len(items)).tensor_split(num_batches)
    total = torch.zeros(1)
    for batch in batches[dist.get_rank()::world]:
        dist.barrier()
        total += batch.numel()
    dist.all_reduce(total)
    return total
