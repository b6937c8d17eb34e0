"""fit() against a hand-written DDP loop following the seeds' recipe (DistributedSampler,
set_epoch, DDP, zero_grad/backward/step), same model, data and 2 gloo ranks, same run.

    python bench/overhead.py [--epochs 3] [--repeats 3]

Prints a table, writes bench/results/overhead.json. Target: fit() steps/s >= 0.97 x hand loop.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from synthetic import Classification
from torch import nn

from ddpguard.testing import run_ranks
from ddpguard.world import World

N, DIM, BATCH = 8192, 256, 64


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10))


def _hand(world: World, epochs: int) -> tuple[int, float]:
    """The seeds' recipe (001/002), written out by hand. Timed like fit(): from a built network
    and dataset to a trained model, so set-up (DDP's parameter broadcast, sampler, loader) counts
    on both sides."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    ds, net = Classification(N, DIM), _net()
    torch.distributed.barrier()
    t0 = time.perf_counter()
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=0)
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
    torch.distributed.barrier()
    return steps, time.perf_counter() - t0


def _loss(module: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(module(x), y, reduction="none")


def _fit(world: World, epochs: int) -> tuple[int, float]:
    from ddpguard.train import FitConfig, fit

    cfg = FitConfig(epochs=epochs, batch_size=BATCH, num_workers=0, progress=False)
    ds, net = Classification(N, DIM), _net()
    torch.distributed.barrier()
    t0 = time.perf_counter()
    res = fit(net, ds, _loss, lambda p: torch.optim.SGD(p, lr=0.01), config=cfg,
              world=world)
    torch.distributed.barrier()
    return res.steps, time.perf_counter() - t0


def _both(world: World, epochs: int, repeats: int) -> dict[str, list[float]]:
    torch.set_num_threads(1)
    out: dict[str, list[float]] = {"hand": [], "fit": []}
    _hand(world, 1)  # warm-up: allocator, gloo buffers
    for _ in range(repeats):  # interleaved so drift on a shared machine hits both alike
        for name, fn in (("hand", _hand), ("fit", _fit)):
            steps, secs = fn(world, epochs)
            out[name].append(steps / secs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    res = run_ranks(_both, 2, args=(args.epochs, args.repeats), timeout=900)[0]
    hand, fitted = statistics.median(res["hand"]), statistics.median(res["fit"])
    ratio = fitted / hand
    print(f"{'loop':<28}{'steps/s (median)':>18}{'runs':>30}")
    for label, med, runs in (("hand-written DDP (seeds)", hand, res["hand"]),
                             ("ddpguard fit()", fitted, res["fit"])):
        print(f"{label:<28}{med:>18.1f}{str([round(v, 1) for v in runs]):>30}")
    print(f"ratio fit/hand: {ratio:.3f} (target >= 0.97)")
    out = Path(__file__).parent / "results" / "overhead.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({
        "hand_steps_per_s": res["hand"], "fit_steps_per_s": res["fit"],
        "hand_median": hand, "fit_median": fitted, "ratio": ratio,
        "world_size": 2, "backend": "gloo", "model": f"MLP {DIM}-512-512-10",
        "batch_per_rank": BATCH, "samples": N, "epochs": args.epochs,
        "torch": torch.__version__, "machine": platform.platform(),
    }, indent=1))


if __name__ == "__main__":
    main()
