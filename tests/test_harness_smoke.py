from ddpguard.testing import run_ranks


def _rank_info(world):
    import torch
    import torch.distributed as dist
    t = torch.tensor([float(world.rank)])
    dist.all_reduce(t)
    return (world.rank, world.world_size, t.item())


def test_two_ranks():
    assert run_ranks(_rank_info, 2, timeout=60) == [(0, 2, 1.0), (1, 2, 1.0)]
