"""Samplers on real gloo ranks: every rank does the same number of DDP steps, and resume works."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import computed_once

from ddpguard.testing import run_ranks

pytestmark = pytest.mark.slow


def _train(world, kind: str) -> dict:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset

    from ddpguard.sampling import EvenSampler, TokenBatchSampler

    torch.manual_seed(0)
    n = 37
    lengths = np.random.default_rng(0).integers(1, 60, n)
    ds = TensorDataset(torch.randn(n, 4), torch.randn(n, 1))
    if kind == "even":
        sampler = EvenSampler(n, seed=1)  # world size and rank from the process group
        loader = DataLoader(ds, batch_size=4, sampler=sampler)
    else:
        sampler = TokenBatchSampler(lengths, 128, seed=1, window=8)
        loader = DataLoader(ds, batch_sampler=sampler)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = []
    seen: list[int] = []
    for _epoch in range(2):  # no set_epoch: the epoch advances by itself
        count = 0
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()  # a collective every step
            opt.step()
            count += 1
        steps.append(count)
    if kind == "even":
        seen = list(iter(EvenSampler(n, seed=1)))
    return {"steps": steps, "rank": world.rank, "seen": seen}


N_RESUME, USED = 50, 7


def _all(world) -> dict:
    """This module's runs on one 2-rank group (a group start costs seconds per rank)."""
    return {"even": _train(world, "even"), "tokens": _train(world, "tokens"),
            "resume": _resume(world, N_RESUME, USED)}


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory):
    return computed_once(tmp_path_factory, "sampling-dist",
                         lambda _: run_ranks(_all, world_size=2, timeout=120))


@pytest.mark.parametrize("kind", ["even", "tokens"])
def test_all_ranks_do_the_same_number_of_steps(kind, two_rank_runs):
    results = [r[kind] for r in two_rank_runs]
    assert results[0]["steps"] == results[1]["steps"]
    assert all(s > 0 for s in results[0]["steps"])
    if kind == "even":
        assert set(results[0]["seen"]) | set(results[1]["seen"]) == set(range(37))


def _resume(world, n: int, used: int) -> dict:
    import torch.distributed as dist

    from ddpguard.sampling import EvenSampler

    s = EvenSampler(n, seed=4)
    it = iter(s)
    before = [next(it) for _ in range(used)]
    next(it)  # prefetched, never trained on
    state = s.state_dict(consumed=used)
    states: list = [None] * world.world_size
    dist.all_gather_object(states, state)
    return {"before": before, "state": state, "same": all(st == state for st in states)}


def test_two_ranks_then_resume_on_four_loses_nothing(two_rank_runs):
    from ddpguard.sampling import EvenSampler

    n = N_RESUME
    results = [r["resume"] for r in two_rank_runs]
    assert all(r["same"] for r in results)  # the global position agrees on every rank
    state = results[0]["state"]
    after = []
    for rank in range(4):  # resumed on 4 ranks (pure; no processes needed for the check)
        s = EvenSampler(n, 4, rank, seed=4)
        s.load_state_dict(state)
        after += list(s)[: s.num_real]
    everything = results[0]["before"] + results[1]["before"] + after
    assert sorted(everything) == list(range(n))
