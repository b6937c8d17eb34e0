"""Hang-guard benchmark: `python bench/guard.py [--steps N]`.

(a) steps/s of a correct 2-rank gloo DDP script under `ddpguard run` (guard on) against plain
    `torchrun` (python -m torch.distributed.run), same run, alternating, best of --repeats.
(b) for uneven batches, seconds from the moment the ranks block to the report on every rank,
    with default guard settings, against gloo's default 30-minute collective timeout.
Prints a table and writes bench/results/guard.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLOO_DEFAULT_TIMEOUT_S = 1800.0

TRAIN = '''
import sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
steps = int(sys.argv[1])
dist.init_process_group("gloo")
torch.manual_seed(0)
x = torch.randn(steps * 2 * 32, 64); y = torch.randn(len(x), 1)
ds = TensorDataset(x, y)
sampler = DistributedSampler(ds, shuffle=True, seed=0, drop_last=True)
loader = DataLoader(ds, batch_size=32, sampler=sampler, drop_last=True)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
n = 0; t0 = None
for xb, yb in loader:
    if n == 20: t0 = time.perf_counter()
    opt.zero_grad(); torch.nn.functional.mse_loss(model(xb), yb).backward(); opt.step(); n += 1
dt = time.perf_counter() - t0
if dist.get_rank() == 0: print(f"STEPS_PER_S {(n - 20) / dt:.3f}", flush=True)
dist.destroy_process_group()
'''


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DDPGUARD_", "SLURM_"))
           and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def _steps_per_s(cmd: list[str]) -> float:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env(), cwd=ROOT)
    m = re.search(r"STEPS_PER_S ([0-9.]+)", out.stdout)
    if out.returncode != 0 or not m:
        raise RuntimeError(f"{cmd} failed:\n{out.stderr[-2000:]}")
    return float(m.group(1))


def overhead(steps: int, repeats: int, script: str) -> dict[str, float]:
    guarded, plain = [], []
    for _ in range(repeats):
        plain.append(_steps_per_s([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                   "--nproc-per-node=2", script, str(steps)]))
        guarded.append(_steps_per_s([sys.executable, "-m", "ddpguard", "run",
                                     "--nproc-per-node", "2", script, str(steps)]))
    g, p = max(guarded), max(plain)
    return {"torchrun_steps_per_s": p, "guard_steps_per_s": g,
            "overhead_pct": 100.0 * (p - g) / p, "repeats": repeats}


def time_to_report(case: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        t0 = time.time()
        out = subprocess.run([sys.executable, "-m", "ddpguard", "run", "--nproc-per-node", "2",
                              "tests/guard_scripts/train.py", "--case", case],
                             capture_output=True, text=True, timeout=600,
                             env=_env(DDPGUARD_REPORT_DIR=d), cwd=ROOT)
        wall = time.time() - t0
        reports = []
        for p in glob.glob(os.path.join(d, "*.json")):
            with open(p) as fh:
                reports.append(json.load(fh))
    if out.returncode == 0 or not reports:
        raise RuntimeError(f"{case}: expected a guard report\n{out.stderr[-2000:]}")
    # The ranks block right after the last progress anywhere (or, with no step at all, when
    # the guard started); the job is over when the last rank has written its report.
    blocked_at = max(r["hb"].get("last_progress") or r["hb"].get("t", t0)
                     for rep in reports for r in rep["ranks"] if r["hb"])
    reported_at = max(rep["created"] for rep in reports)
    # Upper bound (a rank may progress past the check): job start to the last report.
    secs = reported_at - t0
    return {"seconds_to_report": secs,
            "after_last_progress_s": max(0.0, reported_at - blocked_at),
            "job_wall_s": wall, "reports": len(reports),
            "gloo_default_timeout_s": GLOO_DEFAULT_TIMEOUT_S,
            "speedup_vs_timeout": GLOO_DEFAULT_TIMEOUT_S / max(secs, 1e-3),
            "cause": reports[0]["diagnosis"]["title"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "bench_train.py")
        with open(script, "w") as fh:
            fh.write(TRAIN)
        a = overhead(args.steps, args.repeats, script)
    b = {c: time_to_report(c) for c in ("uneven_tail", "collate_drop")}
    print(f"{'measurement':<48}{'ddpguard':>12}{'anchor':>12}{'ratio':>10}")
    print(f"{'(a) steps/s, 2 gloo ranks (guard vs torchrun)':<48}"
          f"{a['guard_steps_per_s']:>12.1f}{a['torchrun_steps_per_s']:>12.1f}"
          f"{a['guard_steps_per_s'] / a['torchrun_steps_per_s']:>10.3f}")
    print("    (b) counts from the job's start, so it includes ~3 s of process start-up")
    print(f"    overhead: {a['overhead_pct']:.2f}% (target < 1%)")
    for c, r in b.items():
        print(f"{'(b) s to report, ' + c + ' (vs gloo timeout)':<48}"
              f"{r['seconds_to_report']:>12.1f}{r['gloo_default_timeout_s']:>12.0f}"
              f"{r['seconds_to_report'] / r['gloo_default_timeout_s']:>10.4f}")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "guard.json"), "w") as fh:
        json.dump({"overhead": a, "time_to_report": b, "date": time.strftime("%Y-%m-%d")},
                  fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
