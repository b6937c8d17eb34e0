"""evaluate() is exact with every sampler people use, or loud: 2 and 4 gloo ranks, odd lengths,
against a single-process float64 reference."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from helpers import computed_once
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler, Subset
from torch.utils.data import DistributedSampler as TorchSampler

from ddpguard.metrics import InexactEvaluationError, InexactEvaluationWarning, evaluate
from ddpguard.sampling import DistributedSampler, EvenSampler, TokenBatchSampler
from ddpguard.sampling.coverage import describe_loader
from ddpguard.testing import run_ranks
from ddpguard.world import World


class _Points(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i: features (sin i, cos 0.37 i), target (i mod 7) / 7; every loss differs."""

    def __init__(self, n: int) -> None:
        i = torch.arange(n, dtype=torch.float64)
        self.x = torch.stack([torch.sin(i), torch.cos(0.37 * i)], 1).float()
        self.y = ((torch.arange(n) % 7) / 7.0).float()
        self.lengths = (np.arange(n) * 37 % 50) + 1

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class _MyShard(Sampler[int]):
    """A hand-written per-rank sampler: evaluate cannot know whether it pads."""

    def __init__(self, n: int, world_size: int, rank: int) -> None:
        self.ids = list(range(rank, n, world_size))

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(2, 1)


def _loss(module: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return (module(x)[:, 0] - y) ** 2


def _reference(n: int) -> float:
    ds, lin = _Points(n), _model()
    w, b = lin.weight.detach().double(), lin.bias.detach().double()
    return float((((ds.x.double() @ w.T)[:, 0] + b - ds.y.double()) ** 2).mean())


def _batch_drop_lost(n: int, w: int, bs: int) -> int:
    # Each rank yields ceil(n / w) indices and keeps whole batches; its real ones are the
    # positions r, r + w, ... below n, so it loses those beyond the last whole batch.
    kept = -(-n // w) // bs * bs
    return sum(max(0, len(range(r, n, w)) - kept) for r in range(w))


def _loaders(world: World, n: int) -> dict[str, tuple[DataLoader, int]]:
    """name -> (loader, samples left out, or -W for 'every sample W times', or None)."""
    ds, w, r = _Points(n), world.world_size, world.rank
    lengths = ds.lengths
    return {
        # exact
        "torch shuffled": (DataLoader(ds, 16, sampler=TorchSampler(ds, shuffle=True, seed=1)),
                           0),
        "torch in order": (DataLoader(ds, 16, sampler=TorchSampler(ds, shuffle=False)), 0),
        "ddpguard DistributedSampler": (DataLoader(ds, 16, sampler=DistributedSampler(ds)), 0),
        "EvenSampler": (DataLoader(ds, 16, sampler=EvenSampler(n, w, r, tail="pad")), 0),
        "TokenBatchSampler": (DataLoader(ds, batch_sampler=TokenBatchSampler(lengths, 200)), 0),
        "batch_sampler over torch's": (DataLoader(ds, batch_sampler=BatchSampler(
            TorchSampler(ds, shuffle=True), 10, drop_last=False)), 0),
        "own shard per rank": (DataLoader(Subset(ds, range(r, n, w)), 16), 0),
        # loud
        "torch drop_last": (DataLoader(ds, 16, sampler=TorchSampler(ds, drop_last=True)),
                            n % w),
        "ddpguard drop_last": (DataLoader(ds, 16, sampler=DistributedSampler(
            ds, drop_last=True)), n % w),
        "EvenSampler drop": (DataLoader(ds, 16, sampler=EvenSampler(n, w, r, tail="drop")),
                             n % w),
        "DataLoader drop_last": (DataLoader(ds, 16, sampler=TorchSampler(ds), drop_last=True),
                                 _batch_drop_lost(n, w, 16)),
        "TokenBatchSampler skipping": (DataLoader(ds, batch_sampler=TokenBatchSampler(
            lengths, 200, max_length=40)), int((lengths > 40).sum())),
        "unsharded": (DataLoader(ds, 16), -w),
        "custom sampler": (DataLoader(ds, 16, sampler=_MyShard(n, w, r)), None),
        "sampler built for one process": (DataLoader(ds, 16, sampler=TorchSampler(
            ds, num_replicas=1, rank=0)), "mismatch"),
        # 3 samples on more ranks: TokenBatchSampler gives some ranks a marked repeat
        "TokenBatchSampler, 3 samples": (DataLoader(_Points(3), batch_sampler=TokenBatchSampler(
            _Points(3).lengths, 200, w, r)), 0),
    }


def _run_cases(world: World, n: int) -> dict[str, dict[str, Any]]:
    model = _model()
    out: dict[str, dict[str, Any]] = {}
    for name, (loader, lost) in _loaders(world, n).items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = evaluate(model, loader, _loss, world)
        msgs = [str(c.message) for c in caught if c.category is InexactEvaluationWarning]
        try:
            evaluate(model, loader, _loss, world, exact=True)
            error = ""
        except InexactEvaluationError as exc:
            error = str(exc)
        whole = getattr(loader.dataset, "dataset", loader.dataset)  # a Subset's parent
        out[name] = {"count": res.count, "loss": res.loss, "exact": res.exact, "lost": lost,
                     "n": len(whole), "warnings": msgs, "error": error}
    return out


def _four_rank_runs(world: World) -> dict[str, Any]:
    """This module's 4-rank runs on one group (a group start costs seconds per rank)."""
    return {"1003": _run_cases(world, 1003), "1001": _run_cases(world, 1001),
            "drop_last_1000": _drop_last_1000(world)}


@pytest.fixture(scope="module")
def four_rank_runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return computed_once(tmp_path_factory, "train-eval-exact-4",
                         lambda _: run_ranks(_four_rank_runs, 4, timeout=240))


@pytest.mark.slow
@pytest.mark.parametrize("world_size, n", [(2, 1003), (4, 1003), (4, 1001)])
def test_exact_or_loud_for_every_sampler(world_size: int, n: int,
                                         request: pytest.FixtureRequest) -> None:
    if world_size == 4:
        ranks = [r[str(n)] for r in request.getfixturevalue("four_rank_runs")]
    else:
        ranks = run_ranks(_run_cases, world_size, args=(n,), timeout=240)
    assert len(ranks) == world_size
    for name, r0 in ranks[0].items():
        ref = _reference(r0["n"])
        for rank, res in enumerate(ranks):
            got = res[name]
            assert got["count"] == r0["count"] and got["loss"] == r0["loss"], (name, rank)
            assert len(got["warnings"]) == (1 if rank == 0 and not r0["exact"] else 0), \
                (name, rank, got["warnings"])
        lost = r0["lost"]
        if lost == 0:  # exact: every sample once, no padded duplicate
            assert r0["exact"] and not r0["error"], (name, r0)
            assert r0["count"] == r0["n"], name
            assert r0["loss"] == pytest.approx(ref, rel=1e-6), name
            continue
        # loud: the warning (rank 0) and the error (every rank) say why, the result is marked
        assert not r0["exact"], name
        msg = r0["warnings"][0]
        assert all(res[name]["error"].startswith(f"rank {k}: evaluate(exact=True) refused")
                   for k, res in enumerate(ranks)), name
        if lost is None:
            assert r0["count"] == n and "_MyShard" in msg and "exact=True" in msg, msg
        elif lost == "mismatch":
            assert r0["count"] == world_size * n, name
            assert (f"built for rank 0 of num_replicas=1 but runs on rank 0 of {world_size}"
                    in msg), msg
        elif lost < 0:
            assert r0["count"] == world_size * n, name
            assert f"counted {world_size} times" in msg and "DistributedSampler" in msg, msg
        else:
            assert r0["count"] == n - lost, (name, r0["count"], lost)
            assert f"{lost} sample{'s' if lost > 1 else ''} never evaluated" in msg, msg
            assert "drop_last=False" in msg or "max_length" in msg or 'tail="pad"' in msg, msg


@pytest.mark.slow
def test_drop_last_without_a_remainder_is_exact(four_rank_runs: list[dict[str, Any]]) -> None:
    res = [r["drop_last_1000"] for r in four_rank_runs]
    assert res[0] == (1000, True, 0)


def _drop_last_1000(world: World) -> tuple[int, bool, int]:
    ds = _Points(1000)
    loader = DataLoader(ds, 10, sampler=TorchSampler(ds, drop_last=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = evaluate(_model(), loader, _loss, world)
    return res.count, res.exact, len(caught)


# ---- one process: the padding arithmetic against torch's actual indices --------------------

@pytest.mark.parametrize("n", [1, 2, 5, 17, 64, 1003])
@pytest.mark.parametrize("w", [1, 2, 3, 4, 8, 13])
@pytest.mark.parametrize("batch_size, drop_last", [(None, False), (4, False), (4, True)])
def test_real_prefixes_of_torch_sampler_cover_each_sample_once(n, w, batch_size, drop_last):
    seen: list[int] = []
    left_out = 0
    for r in range(w):
        s = TorchSampler(range(n), w, r, seed=3)  # type: ignore[arg-type]
        loader = DataLoader(range(n), batch_size=batch_size, sampler=s, drop_last=drop_last)
        cov = describe_loader(loader)
        assert not cov.unknown
        yielded = [int(i) for b in loader for i in (b if batch_size else [b])]
        assert cov.real is not None
        seen += yielded[: cov.real]
        left_out += cov.left_out_local
    assert len(seen) == len(set(seen))  # no padded duplicate survives
    assert len(seen) + left_out == n  # and what is missing is exactly what was reported


def test_single_process_with_a_sampler_built_for_two_ranks_is_loud() -> None:
    ds = _Points(11)
    loader = DataLoader(ds, 4, sampler=TorchSampler(ds, num_replicas=2, rank=1))
    with pytest.warns(InexactEvaluationWarning, match="rank 1 of num_replicas=2 but runs on "
                                                      "rank 0 of 1") as caught:
        res = evaluate(_model(), loader, _loss, World())
    assert len(caught) == 1 and not res.exact and res.count == 5


def test_single_process_unknown_sampler_is_quiet_but_drop_last_is_not() -> None:
    ds = _Points(10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = evaluate(_model(), DataLoader(ds, 4, sampler=_MyShard(10, 1, 0)), _loss, World())
        assert res.exact and res.count == 10 and not caught
        res = evaluate(_model(), DataLoader(ds, 4, drop_last=True), _loss, World())
    assert not res.exact and res.count == 8
    assert [str(c.message) for c in caught] == [
        "evaluate() is not exact: 2 samples never evaluated: the DataLoader's "
        "drop_last=True drops each rank's last partial batch of 4; pass drop_last=False to the "
        "evaluation DataLoader"]
    with pytest.raises(InexactEvaluationError, match="rank 0: .* 2 samples never"):
        evaluate(_model(), DataLoader(ds, 4, drop_last=True), _loss, World(), exact=True)
