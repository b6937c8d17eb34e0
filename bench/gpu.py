"""fit() against a hand-written single-GPU loop on one CUDA device, same model, data, loader
settings and precision, interleaved in the same process. Needs a CUDA GPU (it says so and exits
elsewhere).

    python bench/gpu.py [--epochs 4] [--repeats 3]

The hand loop is the careful one: a DataLoader with pinned memory and workers, asynchronous
copies, autocast, zero_grad(set_to_none=True), and a loss read back every 50 steps (not every
step). fit() runs with the same batch size, workers and precision, on a world of one process
(no DDP wrapper on either side: NCCL needs one GPU per rank). Two rates: end to end (from a
built network and dataset to a trained model: moving the model and starting the workers
count) and steady (after the first WARM steps). Prints a table and writes
bench/results/gpu.json. Target: fit() steps/s >= 0.97 x the hand loop.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from synthetic import Classification
from torch import nn

N, DIM, WIDTH, DEPTH, BATCH, WORKERS = 65536, 1024, 4096, 4, 512, 6
WARM = 20  # steps left out of the steady-state rate


def _net() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(DIM, WIDTH), nn.GELU()]
    for _ in range(DEPTH - 1):
        layers += [nn.Linear(WIDTH, WIDTH), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 10))


def _hand(ds: Classification, device: torch.device, epochs: int,
          precision: str) -> tuple[float, float]:
    """(steps/s end to end, steps/s after the first WARM steps), timed like fit(): from a built
    network and dataset, so moving the model and starting the loader count here too."""
    net = _net()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                         pin_memory=True, persistent_workers=True,
                                         generator=torch.Generator().manual_seed(0))
    model = net.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    steps, warm_at = 0, 0.0
    for _ in range(epochs):
        model.train()
        for x, y in loader:
            if steps == WARM:
                warm_at = time.perf_counter()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            ctx = (torch.autocast("cuda", dtype=torch.bfloat16) if precision == "bf16"
                   else contextlib.nullcontext())
            with ctx:
                loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
            if steps % 50 == 0:
                loss.item()
    torch.cuda.synchronize()
    end = time.perf_counter()
    return steps / (end - t0), (steps - WARM) / (end - warm_at)


def _loss(module: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch  # already on the GPU: fit() moved them
    return nn.functional.cross_entropy(module(x), y, reduction="none")


def _fit(ds: Classification, world: object, epochs: int, precision: str) -> tuple[float, float]:
    from ddpguard.train import FitConfig, fit

    cfg = FitConfig(epochs=epochs, batch_size=BATCH, num_workers=WORKERS, progress=False,
                    precision=precision)
    net = _net()
    warm_at = [0.0]

    def mark(epoch: int, step: int, batch: object) -> None:
        if step == WARM - 1 and not warm_at[0]:  # called after batch WARM's forward/backward
            warm_at[0] = time.perf_counter()

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = fit(net, ds, _loss, lambda p: torch.optim.AdamW(p, lr=1e-4), config=cfg,
              world=world, on_batch=mark)  # type: ignore[arg-type]
    torch.cuda.synchronize()
    end = time.perf_counter()
    return res.steps / (end - t0), (res.steps - WARM) / (end - warm_at[0])


def _profile(ds: Classification, world: object, epochs: int) -> int:
    import cProfile
    import pstats

    import ddpguard as dg

    try:
        _hand(ds, world.device, 1, "bf16")  # type: ignore[attr-defined]
        for name in ("hand", "fit"):
            prof = cProfile.Profile()
            prof.enable()
            rates = (_hand(ds, world.device, epochs, "bf16") if name == "hand"  # type: ignore
                     else _fit(ds, world, epochs, "bf16"))
            prof.disable()
            print(f"== {name}: {rates[1]:.1f} steps/s steady (under the profiler)")
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    finally:
        dg.shutdown(world)  # type: ignore[arg-type]
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", action="store_true",
                    help="instead: one bf16 run of each under cProfile, the top functions")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA GPU; none is visible here", file=sys.stderr)
        return 2
    import ddpguard as dg

    world = dg.init(backend="nccl")
    device = world.device
    ds = Classification(N, DIM)
    if args.profile:
        return _profile(ds, world, args.epochs)
    rows: dict[str, dict[str, list[tuple[float, float]]]] = {}
    try:
        for precision in ("bf16", "off"):
            runs: dict[str, list[tuple[float, float]]] = {"hand": [], "fit": []}
            _hand(ds, device, 1, precision)  # warm-up: kernels, allocator, workers
            for _ in range(args.repeats):  # interleaved: drift hits both alike
                runs["hand"].append(_hand(ds, device, args.epochs, precision))
                runs["fit"].append(_fit(ds, world, args.epochs, precision))
            rows[precision] = runs
    finally:
        dg.shutdown(world)
    print(f"{'precision':<10}{'rate':<14}{'hand steps/s':>14}{'fit steps/s':>14}{'fit/hand':>10}"
          "  runs (hand | fit)")
    out: dict[str, object] = {}
    for precision, runs in rows.items():
        entry: dict[str, object] = {}
        for k, rate in enumerate(("end to end", "steady")):
            hand = statistics.median(r[k] for r in runs["hand"])
            fitted = statistics.median(r[k] for r in runs["fit"])
            each = {n: [round(r[k], 1) for r in rs] for n, rs in runs.items()}
            print(f"{precision:<10}{rate:<14}{hand:>14.1f}{fitted:>14.1f}{fitted / hand:>10.3f}"
                  f"  {each['hand']} | {each['fit']}")
            entry[rate] = {"hand_steps_per_s": each["hand"], "fit_steps_per_s": each["fit"],
                           "hand_median": hand, "fit_median": fitted, "ratio": fitted / hand}
        out[precision] = entry
    out.update({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                "model": f"MLP {DIM}-{WIDTH}x{DEPTH}-10", "batch": BATCH, "samples": N,
                "workers": WORKERS, "epochs": args.epochs, "warm_steps": WARM,
                "machine": platform.platform()})
    path = Path(__file__).parent / "results" / "gpu.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
