# Our fixture (issue 20): an assert that only rank 0 evaluates, just before a broadcast. When
# it fires, rank 0 is gone and the other ranks wait in the broadcast. Reported by DDP022 (off by
# default: most such asserts on real code are invariants that cannot fire).
import torch
import torch.distributed as dist


def init_centroids(bank, k, dim):
    centroids = torch.empty(k, dim).cuda()
    if dist.get_rank() == 0:
        idx = torch.randperm(len(bank))[:k]
        assert len(idx) >= k, "reduce the number of centroids"  # expect: DDP022
        centroids = bank[idx]
    dist.broadcast(centroids, 0)
    return centroids
