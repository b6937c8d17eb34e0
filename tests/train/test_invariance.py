"""World-size invariance of fit(global_batch_size=...) on real gloo ranks.

A tiny float64 linear model trained on the same global batch must end with the same weights on
1, 2 and 4 ranks, with any micro-batch, after a resume on another world size, and after an
out-of-memory fallback on one rank. Tolerance: atol=1e-10 (float64; only the order of the
gradient sums differs between runs).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import computed_once
from torch import nn

from ddpguard.batch_plan import BatchPlan
from ddpguard.model import accumulate
from ddpguard.sampling import EvenSampler
from ddpguard.testing import run_ranks
from ddpguard.train import FitConfig, fit
from ddpguard.world import World

ATOL = 1e-10
G = 16  # global batch
N = 72  # samples: 5 optimizer steps per epoch, the last one padded to a full global batch
STEPS = 10  # 2 epochs


class _Data(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(N, 4, generator=g, dtype=torch.float64)
        w = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
        self.y = self.x @ w + 0.1 * torch.randn(N, generator=g, dtype=torch.float64)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _mse(module: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return (module(x)[:, 0] - y) ** 2


def _train(world: World, overrides: dict[str, Any], oom_above: dict[int, int]) -> dict[str, Any]:
    """fit() with the given config; `oom_above[rank] = m` makes that rank's probe run out of
    memory for micro-batches larger than m (a simulated memory limit)."""
    tried: list[int] = []

    def probe(micro: int) -> None:
        tried.append(micro)
        if micro > oom_above.get(world.rank, micro):
            raise torch.OutOfMemoryError(f"simulated: micro-batch {micro} on rank {world.rank}")

    torch.manual_seed(0)
    model = nn.Linear(4, 1).double()
    cfg = FitConfig(**{"epochs": 2, "global_batch_size": G, "progress": False, **overrides})
    res = fit(model, _Data(), _mse, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
              config=cfg, world=world, oom_probe=probe if oom_above else None)
    return {"weights": torch.cat([p.detach().flatten() for p in model.parameters()]).tolist(),
            "steps": res.steps, "plan": res.batch_plan, "tried": tried}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return torch.allclose(torch.tensor(a["weights"]), torch.tensor(b["weights"]), atol=ATOL,
                          rtol=0)


def _runs(world: World, runs: list[tuple[str, dict[str, Any], dict[int, int]]]
          ) -> dict[str, dict[str, Any]]:
    """Several fit() runs one after the other on one group: {name: _train's result}."""
    return {name: _train(world, overrides, oom_above) for name, overrides, oom_above in runs}


MICRO4: dict[str, Any] = {"micro_batch_size": 4}


def _jobs(folder: Path) -> dict[int, list[dict[str, dict[str, Any]]]]:
    """Every run of this module, one job per world size (a group start costs seconds per rank):
    2 ranks first, as their partial run leaves the checkpoint the others resume from."""
    two, one = folder / "four", folder / "one"
    jobs = {}
    # 3 of 4 steps of epoch 0 on 2 ranks; the checkpoint sits mid-epoch at global position 48.
    jobs[2] = run_ranks(_runs, 2, args=([
        ("same", MICRO4, {}),
        ("oom", {}, {1: 2}),  # rank 1 fits at most 2 samples (test_oom_on_one_rank_...)
        ("part", {**MICRO4, "max_steps": 3, "checkpoint_dir": str(two)}, {})],), timeout=180)
    shutil.copytree(two, one)
    jobs[4] = run_ranks(_runs, 4, args=([
        ("same", MICRO4, {}),
        ("resume", {**MICRO4, "resume": True, "checkpoint_dir": str(two)}, {})],), timeout=180)
    jobs[1] = run_ranks(_runs, 1, args=([
        # One rank, the whole global batch in one micro-batch.
        ("reference", {}, {}),
        ("same", MICRO4, {}),
        ("resume", {**MICRO4, "resume": True, "checkpoint_dir": str(one)}, {})],), timeout=180)
    return jobs


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, dict[str, Any]]]]:
    return computed_once(tmp_path_factory, "train-invariance", _jobs)


@pytest.fixture(scope="module")
def reference(jobs: dict[int, list[dict[str, dict[str, Any]]]]) -> dict[str, Any]:
    """One rank, the whole global batch in one micro-batch: 2 epochs = 8 optimizer steps."""
    ref = jobs[1][0]["reference"]
    assert ref["steps"] == STEPS and ref["plan"]["micro_batch_size"] == G
    torch.manual_seed(0)
    start = torch.cat([p.detach().flatten() for p in nn.Linear(4, 1).double().parameters()])
    assert (torch.tensor(ref["weights"]) - start).abs().max() > 0.1  # it did train
    return ref


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_same_weights_on_1_2_4_ranks(world_size: int, reference: dict[str, Any],
                                     jobs: dict[int, list[dict[str, dict[str, Any]]]]) -> None:
    # micro-batch 4: 1 rank x 4 accumulation steps, 2 x 2, 4 x 1.
    results = [ranks["same"] for ranks in jobs[world_size]]
    assert len(results) == world_size
    for r in results:
        assert r["steps"] == STEPS
        assert r["plan"] == {"version": 1, "global_batch_size": G, "world_size": world_size,
                             "micro_batch_size": 4, "unit": "samples"}
        assert _same(r, reference), (r["weights"], reference["weights"])


def test_resume_on_other_world_sizes(reference: dict[str, Any],
                                     jobs: dict[int, list[dict[str, dict[str, Any]]]]) -> None:
    # 3 of 4 steps of epoch 0 on 2 ranks, then resumed from a copy of its checkpoint folder on
    # 4 ranks and on 1 rank.
    part = [ranks["part"] for ranks in jobs[2]]
    assert part[0]["steps"] == 3 and not _same(part[0], reference)
    for world_size in (4, 1):
        res = [ranks["resume"] for ranks in jobs[world_size]]
        assert res[0]["steps"] == STEPS
        assert all(_same(r, reference) for r in res), (world_size, res[0]["weights"])


def test_oom_on_one_rank_shrinks_every_rank_alike(
        reference: dict[str, Any], jobs: dict[int, list[dict[str, dict[str, Any]]]]) -> None:
    # Rank 1 cannot fit more than 2 samples; rank 0 could fit the whole per-rank batch of 8.
    a, b = [ranks["oom"] for ranks in jobs[2]]
    assert a["tried"] == b["tried"] == [8, 4, 2]  # shrunk together, agreed by all-reduce
    assert a["plan"] == b["plan"]
    assert a["plan"]["micro_batch_size"] == 2 and a["steps"] == STEPS  # 2 ranks x 4 x 2
    assert _same(a, reference) and _same(b, reference)


# ---- the pure parts, "at 64 ranks" in one process ------------------------------------------

def _step_positions(length: int, g: int, w: int, m: int, tail: str) -> list[list[int]]:
    """Sorted global positions each optimizer step consumes, gathered over all W ranks."""
    plan = BatchPlan(g, w, m)
    per_rank = [EvenSampler(length, w, r, global_batch_size=g, tail=tail) for r in range(w)]
    counts = {len(s) for s in per_rank}
    assert len(counts) == 1  # every rank the same number of indices
    per_step = plan.accumulation_steps * m
    (count,) = counts
    assert count % per_step == 0  # whole optimizer steps only
    return [sorted(int(p) for s in per_rank for p in s.positions(k * per_step,
                                                                 (k + 1) * per_step))
            for k in range(count // per_step)]


@pytest.mark.parametrize("tail", ["pad", "drop"])
@pytest.mark.parametrize("length", [64, 72, 100])
def test_every_step_takes_the_next_global_batch_on_any_world_size(length: int,
                                                                  tail: str) -> None:
    g = 64
    full = -(-length // g) if tail == "pad" else length // g
    want = [list(range(k * g, (k + 1) * g)) for k in range(full)]
    for w in (1, 2, 4, 8, 16, 32, 64):
        for m in (1, 2, g // w):
            if (g // w) % m == 0:
                assert _step_positions(length, g, w, m, tail) == want, (w, m)
    pads = [EvenSampler(length, 4, r, global_batch_size=g, tail="pad") for r in range(4)]
    assert len(pads[0]) == -(-length // g) * g // 4
    assert sum(s.num_real for s in pads) == length  # the rest is marked padding


def test_sampler_refuses_a_global_batch_ranks_cannot_share() -> None:
    with pytest.raises(ValueError, match=r"global_batch_size=10 is not a multiple of "
                                         r"num_replicas=4.*nearest valid sizes: 8, 12"):
        EvenSampler(100, 4, 0, global_batch_size=10)


def test_resume_on_another_world_size_and_refusal_inside_a_global_batch() -> None:
    two = EvenSampler(72, 2, 0, global_batch_size=16, seed=3)
    it = iter(two)
    for _ in range(16):  # 2 steps of 8 per rank
        next(it)
    state = two.state_dict()
    assert state["position"] == 32 and state["global_batch_size"] == 16
    four = EvenSampler(72, 4, 1, global_batch_size=16, seed=3)
    four.load_state_dict(state)
    assert len(four) == (80 - 32) // 4 and four.positions(0, 1).tolist() == [33]
    state["position"] = 40
    with pytest.raises(ValueError, match="inside a global batch of 16"):
        four.load_state_dict(state)


def test_accumulate_takes_every_from_the_plan() -> None:
    model = nn.Linear(2, 1)
    plan = BatchPlan(32, 1, 8)  # 4 accumulation steps
    syncs = []
    for i in range(8):
        with accumulate(model, i, plan=plan, epoch_length=8) as acc:
            syncs.append((acc.sync, acc.scale))
    assert syncs == [(False, 0.25)] * 3 + [(True, 0.25)] + [(False, 0.25)] * 3 + [(True, 0.25)]
    with pytest.raises(ValueError, match="every=2 but the plan says 4"), \
            accumulate(model, 0, every=2, plan=plan):
        pass
