"""Token batching benchmark: `python bench/tokens.py [--n 2000000] [--max-tokens 16384]`.

Same run, same lengths (lognormal, median 200, clipped 1..2048, seed 0), same token budget:
- ddpguard `TokenBatchSampler` (8 replicas): planning time and padding waste of its plan;
- the anchors, measured here rather than quoted: greedy batching in random order (the rule of
  fairseq's `batch_by_size`: a batch is full when (len(batch) + 1) x longest > max_tokens),
  and the same greedy rule over windows sorted by length (FunASR-style, windows of 1,024,
  8,192 and 65,536 samples).
Padding waste = padded token slots / all token slots (len(batch) x longest, summed), the
definition `TokenPlan.padding_waste` uses. Prints a table and writes bench/results/tokens.json.
Targets (issue 3): planning < 2 s at 2M lengths, waste < 5%.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lognormal_lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(200), 0.8, n)), 1, 2048).astype(np.int64)


def greedy_waste(lengths: np.ndarray, max_tokens: int) -> tuple[float, int]:
    """(padding waste, batches) of greedy batching of `lengths` in the order given."""
    slots = 0
    batches = 0
    count = longest = 0
    for n in lengths.tolist():
        if count and (count + 1) * max(longest, n) > max_tokens:
            slots += count * longest
            batches += 1
            count = longest = 0
        count += 1
        longest = max(longest, n)
    if count:
        slots += count * longest
        batches += 1
    return 1.0 - float(lengths.sum()) / slots, batches


def sorted_windows(lengths: np.ndarray, window: int) -> np.ndarray:
    """Each window of `window` samples (in random order) sorted by length, FunASR-style."""
    out = lengths.copy()
    for start in range(0, out.size, window):
        out[start:start + window].sort()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--replicas", type=int, default=8)
    args = ap.parse_args()
    import torch

    from ddpguard.sampling import TokenBatchSampler

    lengths = lognormal_lengths(args.n)
    res: dict = {"date": datetime.date.today().isoformat(), "cpus": os.cpu_count(),
                 "torch": torch.__version__, "n": args.n, "max_tokens": args.max_tokens,
                 "replicas": args.replicas, "median_length": float(np.median(lengths))}
    sampler = TokenBatchSampler(lengths, args.max_tokens, args.replicas, 0, seed=0)
    t0 = time.perf_counter()
    plan = sampler.plan()
    res["ddpguard"] = {"plan_s": time.perf_counter() - t0, "padding_waste": plan.padding_waste,
                       "batches_per_rank": len(sampler), "skipped": sampler.skipped}

    shuffled = lengths[np.random.default_rng(1).permutation(lengths.size)]
    anchors: dict[str, dict] = {}
    for name, order in [("random order", shuffled)] + [
            (f"sorted windows of {w:,}", sorted_windows(shuffled, w))
            for w in (1024, 8192, 65536)]:
        t0 = time.perf_counter()
        waste, batches = greedy_waste(order, args.max_tokens)
        anchors[name] = {"padding_waste": waste, "batches": batches,
                         "seconds": time.perf_counter() - t0}
    res["anchors"] = anchors

    d = res["ddpguard"]
    print(f"{args.n:,} lognormal lengths (median {res['median_length']:.0f}, max 2048), "
          f"max_tokens {args.max_tokens}, {args.replicas} replicas")
    print(f"{'batching':<36} {'padding waste':>14} {'batches':>10} {'waste ratio':>12}")
    print(f"{'ddpguard TokenBatchSampler':<36} {d['padding_waste']:>14.2%} "
          f"{d['batches_per_rank'] * args.replicas:>10,} {'1':>12}")
    for name, a in anchors.items():
        ratio = a["padding_waste"] / max(d["padding_waste"], 1e-9)
        print(f"{'greedy, ' + name:<36} {a['padding_waste']:>14.2%} {a['batches']:>10,} "
              f"{ratio:>11,.0f}x")
    print(f"ddpguard planning time: {d['plan_s']:.2f} s (target < 2 s); skipped {d['skipped']}")
    out = os.path.join(ROOT, "bench", "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokens.json"), "w") as f:
        json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
