"""Exact evaluation across ranks: padding dropped, sums and counts reduced, same on every rank."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from helpers import computed_once
from torch import nn

from ddpguard.metrics import all_reduce_mean, evaluate, reduce_dict, split_loss
from ddpguard.model import prepare_model
from ddpguard.testing import run_ranks
from ddpguard.world import World


class _Ids(torch.utils.data.Dataset[float]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> float:
        return float(i)


def _value_loss(module: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return module(batch[:, None].float())[:, 0]  # the identity: the sample's id is its "loss"


def _eval_1003(world: World) -> dict[str, float]:
    from ddpguard.data import make_loader
    from ddpguard.sampling import EvenSampler

    lin = nn.Linear(1, 1)
    with torch.no_grad():
        lin.weight.fill_(1.0)
        lin.bias.zero_()
    model = prepare_model(lin, world)
    sampler = EvenSampler(1003, world.world_size, world.rank, shuffle=True, seed=3, tail="pad")
    loader = make_loader(_Ids(1003), batch_size=16, sampler=sampler, num_workers=0)
    res = evaluate(model, loader, _value_loss, world)
    again = evaluate(model, loader, _value_loss, world)  # a second epoch of the eval loader
    return {"count": res.count, "total": res.total, "loss": res.loss, "again": again.count,
            "training": float(model.training)}


def _two_rank_runs(world: World) -> dict[str, object]:
    """This module's 2-rank runs on one group (a group start costs seconds per rank)."""
    return {"eval": _eval_1003(world), "reductions": _reductions(world)}


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return computed_once(tmp_path_factory, "train-metrics-2",
                         lambda _: run_ranks(_two_rank_runs, 2, timeout=120))


@pytest.mark.parametrize("world_size", [2, 4])
def test_evaluate_counts_exactly_1003(world_size: int, request: pytest.FixtureRequest) -> None:
    if world_size == 2:
        results = [r["eval"] for r in request.getfixturevalue("two_rank_runs")]
    else:
        results = run_ranks(_eval_1003, world_size, timeout=120)
    assert len(results) == world_size
    for r in results:
        assert r["count"] == 1003 and r["again"] == 1003
        assert r["total"] == sum(range(1003))  # every sample once, no padded duplicate
        assert r["loss"] == pytest.approx(501.0)
        assert r["training"] == 1.0  # evaluate restores train mode
    assert len({r["loss"] for r in results}) == 1


def _reductions(world: World) -> dict[str, object]:
    mean = all_reduce_mean(float(world.rank), world, weight=float(world.rank + 1))
    # Unequal sizes: rank 0 holds 2 elements, rank 1 holds 5.
    mine = torch.tensor([1.0, 2.0]) if world.rank == 0 else torch.tensor([3.0, 4, 5, 6, 7])
    elements = all_reduce_mean(mine, world)
    weighted = all_reduce_mean(mine, world, weight=2.0 if world.rank == 0 else 1.0)
    empty = all_reduce_mean(torch.tensor([]) if world.rank else torch.tensor([5.0]), world)
    d = reduce_dict({"b": world.rank, "a": 10.0 * world.rank}, world)
    s = reduce_dict({"n": 1}, world, op="sum")
    return {"mean": mean, "d": d, "s": s, "elements": elements, "weighted": weighted,
            "empty": empty}


def test_reduce_helpers(two_rank_runs: list[dict[str, Any]]) -> None:
    a, b = [r["reductions"] for r in two_rank_runs]
    assert a == b
    assert a["mean"] == pytest.approx(2 / 3)  # (0*1 + 1*2) / (1 + 2): weighted, not mean of means
    assert a["d"] == {"a": 5.0, "b": 0.5} and a["s"] == {"n": 2.0}
    assert a["elements"] == pytest.approx(28 / 7)  # all 7 elements; not (1.5 + 5) / 2
    assert a["weighted"] == pytest.approx((2 * 3 + 25) / (2 * 2 + 5))
    assert a["empty"] == 5.0  # a rank without elements does not pull the mean to 0


def test_single_process_and_loss_shapes() -> None:
    assert all_reduce_mean(torch.tensor([1.0, 2.0]), World()) == 1.5  # the mean, not the sum
    assert all_reduce_mean(torch.tensor([[1.0, 2.0], [3.0, 6.0]]), World()) == 3.0
    assert all_reduce_mean(4.0, World(), weight=3.0) == 4.0
    assert math.isnan(all_reduce_mean(torch.tensor([]), World()))
    with pytest.raises(ValueError, match="op must be"):
        reduce_dict({"a": 1}, World(), op="avg")
    v, w = split_loss(torch.tensor([1.0, 2.0]))
    assert w.tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="per-sample"):
        split_loss(torch.tensor(1.0))
    lin = nn.Linear(1, 1)
    with torch.no_grad():
        lin.weight.fill_(1.0)
        lin.bias.zero_()
    loader = torch.utils.data.DataLoader(_Ids(10), batch_size=4)
    res = evaluate(lin, loader, _value_loss, World(), num_real=7)  # explicit padding bound
    assert res.count == 7 and res.total == sum(range(7))


def test_readback_of_cpu_tensors_is_immediate_and_in_order() -> None:
    from ddpguard.readback import Readback

    rb = Readback()
    assert rb.push("a", torch.tensor([1.0, 2.0])) == [("a", [1.0, 2.0])]
    assert rb.push(("b", 3), torch.tensor([math.inf])) == [(("b", 3), [math.inf])]
    assert len(rb) == 0 and rb.wait_all() == []


def test_nan_check_on_the_cpu_raises_at_the_first_check() -> None:
    from ddpguard.metrics import LossWatch, NonFiniteLossError

    watch = LossWatch(World(), every=2)
    watch.update(torch.tensor(1.0), 0)
    with pytest.raises(NonFiniteLossError, match="at step 1 .first seen on rank 0"):
        watch.update(torch.tensor(float("nan")), 1)
