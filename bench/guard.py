"""Hang-guard benchmark, with the guard's DEFAULT settings: `python bench/guard.py`.

1. Healthy programs (tests/guard/scripts/scenarios.py) whose long work lasts --dur seconds
   (default 70, past the 45 s no-sign-of-life limit and the 60 s first notice): how many
   the guard leaves running.
2. Broken programs: for proven deadlocks, seconds from the last rank blocking to the report
   (target <= 5 s); for stalls with no sign of life, seconds from the waiting rank blocking to
   the report (target <= 60 s). Each is also run under plain torchrun (`--no-guard`) on the
   same script: what a user gets today (hangs until killed at --plain-cap, or which error after
   how long).
3. Overhead: steps/s of a DDP script whose steps take --step-ms (20-100 ms), guard on against
   off, interleaved runs; median of the per-pair ratios with the spread.
4. Life of the whole rank (tests/guard/scripts/life_scenarios.py): rank 0 works outside its
   training thread for --life-dur seconds (default 105: 60 s past the 45 s no-life limit) while
   rank 1 waits in barrier(): a multiprocessing.Pool.map, a subprocess, a ThreadPoolExecutor
   writing, a download trickling in from a local HTTP server. How many the guard leaves running.

Prints tables and writes bench/results/guard.json. `--only healthy,broken,overhead,life`
selects.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddpguard.guard.procs import kill_tree

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "tests/guard/scripts/scenarios.py"
HEALTHY = ["ckpt_barrier", "slow_first_step", "slow_first_backward", "rank0_eval_tensors",
           "rank0_eval_loader", "slow_first_batch", "step_spike", "nanogpt_eval",
           "accelerate_wait", "final_ckpt_after_exit", "val_same_helper", "random_step_times"]
PROVEN = ["mismatch_before_training", "cond_barrier", "eval_rank0_bn", "uneven_tail",
          "early_exit", "crash", "desync_broadcast"]
STALLS = ["infinite_loop", "blocked_read", "loader_worker_deadlock", "frozen"]
LIFE_SCRIPT = "tests/guard/scripts/life_scenarios.py"
LIFE = ["pool", "subprocess", "thread_writes", "http"]


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("DDPGUARD_", "SLURM_"))
           and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
    out.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return out


def launch(args: list[str], cap: float, extra_env: dict[str, str]) -> tuple[int | None, float,
                                                                               str, str]:
    """Run `ddpguard run ARGS`; end the whole job after `cap` seconds."""
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "ddpguard", "run", *args], cwd=ROOT,
                         env=env(**extra_env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        out, err = p.communicate(timeout=cap)
        code: int | None = p.returncode
    except subprocess.TimeoutExpired:
        # torchrun starts each rank in a session of its own: end the launcher's whole tree, by
        # pid, while the launcher is still there to find it by (ranks hold our pipes open).
        kill_tree(p.pid, include_self=True)
        out, err = p.communicate()
        code = None
    return code, time.monotonic() - t0, out, err


def first_error(err: str) -> str:
    for pat in (r"(RuntimeError: [^\n]{0,160})", r"(ValueError: [^\n]{0,120})",
                r"(\w+Error: [^\n]{0,120})", r"(died from signal \w+)"):
        m = re.search(pat, err)
        if m:
            return m.group(1)
    return err.strip().splitlines()[-1][:160] if err.strip() else ""


def healthy(dur: float, script: str = SCRIPT, cases: list[str] = HEALTHY
            ) -> list[dict[str, object]]:
    rows = []
    for case in cases:
        server = None
        if case == "http":  # the slow server, in a process of its own (not the rank's work)
            server = subprocess.Popen([sys.executable, script, "--serve", "--dur", str(dur)],
                                      cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env())
            assert server.stdout is not None
            url = server.stdout.readline().split()[1]
        with tempfile.TemporaryDirectory() as rep:
            try:
                code, took, out, err = launch(
                    ["--nproc-per-node", "2", script, "--case", case, "--dur", str(dur)]
                    + (["--url", url] if server else []), dur * 3 + 120,
                    {"DDPGUARD_REPORT_DIR": rep})
            finally:
                if server is not None:
                    server.kill()
                    server.wait()
            reports = sorted(Path(rep).glob("*.json"))
            why = None
            if reports:  # a false alarm: keep the evidence
                keep = ROOT / "bench" / "results" / f"guard-false-alarm-{case}.json"
                keep.parent.mkdir(parents=True, exist_ok=True)
                keep.write_text(reports[0].read_text())
                why = json.loads(reports[0].read_text())["reason"]
        ok = code == 0 and not reports
        notices = err.count("has waited")
        rows.append({"case": case, "left_running": ok, "exit": code, "seconds": round(took, 1),
                     "notices": notices, "stopped_because": why})
        print(f"  healthy {case:24s} {'left running' if ok else 'STOPPED':12s} exit={code} "
              f"{took:6.1f} s, {notices} notice(s)", flush=True)
    return rows


def _blocked_since(rep: dict, culprits: list[int], stall: bool) -> float | None:
    """When the last rank started blocking (proof), or when the first waiting rank did
    (stall: the clock of the no-sign-of-life rule starts there)."""
    starts = []
    for r in rep["ranks"]:
        lanes = r.get("lanes") or []
        if not lanes:
            continue
        last = lanes[-1]
        if last[2] == "collective":
            starts.append(float(last[0]))
        elif r["rank"] in culprits and stall:
            continue
    if not starts:
        return None
    return min(starts) if stall else max(starts)


def broken(dur: float, plain_cap: float, skip_plain: bool) -> list[dict[str, object]]:
    rows = []
    for case in PROVEN + STALLS:
        stall = case in STALLS
        with tempfile.TemporaryDirectory() as rep:
            code, took, out, err = launch(["--nproc-per-node", "2", SCRIPT, "--case", case,
                                           "--dur", str(dur)], 300, {"DDPGUARD_REPORT_DIR": rep})
            reports = sorted(Path(rep).glob("*.json"))
            data = json.loads(reports[0].read_text()) if reports else None
        row: dict[str, object] = {"case": case, "kind": "stall" if stall else "proof",
                                  "exit": code, "seconds_total": round(took, 1)}
        if data is not None:
            since = _blocked_since(data, data["diagnosis"]["culprits"], stall)
            row["cause"] = data["diagnosis"]["cause"]
            row["to_report_s"] = (round(data["created"] - since, 2) if since is not None
                                  else None)
        else:
            row["cause"] = first_error(err) or "no report"
            row["to_report_s"] = None
        if not skip_plain:
            pcode, ptook, _, perr = launch(["--no-guard", "--nproc-per-node", "2", SCRIPT,
                                            "--case", case, "--dur", str(dur)], plain_cap, {})
            row["plain"] = (f"hung, killed at {plain_cap:.0f} s" if pcode is None else
                            f"exit {pcode} after {ptook:.0f} s: {first_error(perr)}")
        rows.append(row)
        print(f"  broken  {case:24s} exit={code} cause={row['cause']} "
              f"to_report={row['to_report_s']} s (total {took:.1f} s) | plain: "
              f"{row.get('plain', 'not measured')}", flush=True)
    return rows


TRAIN = '''
import sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
steps, width = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo")
torch.manual_seed(0)
x = torch.randn((steps + 10) * 2 * 32, width); y = torch.randn(len(x), 1)
ds = TensorDataset(x, y)
sampler = DistributedSampler(ds, shuffle=True, seed=0, drop_last=True)
loader = DataLoader(ds, batch_size=32, sampler=sampler, drop_last=True)
model = DDP(torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.ReLU(),
                                torch.nn.Linear(4 * width, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
n = 0; t0 = None
for xb, yb in loader:
    if n == 10: t0 = time.perf_counter()
    opt.zero_grad(); torch.nn.functional.mse_loss(model(xb), yb).backward(); opt.step(); n += 1
dt = time.perf_counter() - t0
if dist.get_rank() == 0: print(f"STEPS_PER_S {(n - 10) / dt:.4f}", flush=True)
import threading, os
for t in threading.enumerate():
    if t.name == "ddpguard-guard" and dist.get_rank() == 0:
        f = open(f"/proc/self/task/{t.native_id}/stat").read().rsplit(")", 1)[1].split()
        cpu = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
        print(f"GUARD_CPU_S {cpu:.3f} OVER {dt:.3f}", flush=True)
dist.destroy_process_group()
'''


def overhead(steps: int, width: int, pairs: int) -> dict[str, object]:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(TRAIN)
        script = fh.name
    ratios, on_all, off_all, shares = [], [], [], []
    try:
        for i in range(pairs):
            order = [True, False] if i % 2 == 0 else [False, True]
            got = {}
            for guard in order:
                args = ([] if guard else ["--no-guard"]) + ["--nproc-per-node", "2", script,
                                                            str(steps), str(width)]
                code, _, out, err = launch(args, 900, {})
                m = re.search(r"STEPS_PER_S ([0-9.]+)", out)
                if code != 0 or not m:
                    raise RuntimeError(f"overhead run failed:\n{err[-2000:]}")
                got[guard] = float(m.group(1))
                g = re.search(r"GUARD_CPU_S ([0-9.]+) OVER ([0-9.]+)", out)
                if guard and g:
                    # The guard thread's own CPU over the timed part (it also ran during
                    # start-up, so this is an upper bound), as a share of one core.
                    shares.append(float(g.group(1)) / float(g.group(2)))
            on_all.append(got[True])
            off_all.append(got[False])
            ratios.append(got[True] / got[False])
            print(f"  pair {i + 1}: guard {got[True]:.2f} steps/s, plain {got[False]:.2f} "
                  f"steps/s, ratio {got[True] / got[False]:.4f}", flush=True)
    finally:
        os.unlink(script)
    step_ms = 1000.0 / statistics.median(off_all)
    return {"step_ms": round(step_ms, 1), "median_ratio": round(statistics.median(ratios), 4),
            "min_ratio": round(min(ratios), 4), "max_ratio": round(max(ratios), 4),
            "overhead_pct": round(100 * (1 - statistics.median(ratios)), 2),
            "guard_thread_cpu_share_pct": [round(100 * x, 3) for x in shares],
            "guard_steps_per_s": on_all, "plain_steps_per_s": off_all}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dur", type=float, default=70.0,
                    help="long work of healthy cases (s): past the 45 s no-life limit and the "
                         "60 s first notice")
    ap.add_argument("--plain-cap", type=float, default=120.0)
    ap.add_argument("--skip-plain", action="store_true")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--width", type=int, default=384, help="model width (sets the step time)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--life-dur", type=float, default=105.0,
                    help="work outside the training thread (s): 60 s past the no-life limit")
    ap.add_argument("--only", default="healthy,broken,overhead,life")
    a = ap.parse_args()
    parts = set(a.only.split(","))
    result: dict[str, object] = {"date": time.strftime("%Y-%m-%d"), "machine":
                                 f"{os.cpu_count()} cores", "settings": "guard defaults"}
    if "healthy" in parts:
        print("healthy programs (guard defaults):", flush=True)
        rows = healthy(a.dur)
        result["healthy"] = rows
        print(f"=> left running: {sum(bool(r['left_running']) for r in rows)} of {len(rows)}")
    if "broken" in parts:
        print("broken programs (guard defaults vs plain torchrun):", flush=True)
        rows = broken(min(a.dur, 8.0), a.plain_cap, a.skip_plain)
        result["broken"] = rows
        proof = [r["to_report_s"] for r in rows if r["kind"] == "proof" and r["to_report_s"]]
        stall = [r["to_report_s"] for r in rows if r["kind"] == "stall" and r["to_report_s"]]
        if proof:
            print(f"=> proven deadlocks, last rank blocking -> report: max {max(proof):.2f} s, "
                  f"median {statistics.median(proof):.2f} s (target <= 5 s)")
        if stall:
            print(f"=> no-sign-of-life stalls, wait start -> report: max {max(stall):.1f} s "
                  f"(target <= 60 s)")
    if "overhead" in parts:
        print("overhead (interleaved pairs):", flush=True)
        ov = overhead(a.steps, a.width, a.pairs)
        result["overhead"] = ov
        print(f"=> step {ov['step_ms']} ms: guard/plain steps/s median {ov['median_ratio']} "
              f"(spread {ov['min_ratio']}-{ov['max_ratio']}), overhead {ov['overhead_pct']} %; "
              f"guard thread CPU per rank: {ov['guard_thread_cpu_share_pct']} % of a core")
    if "life" in parts:
        print("work outside the training thread (guard defaults):", flush=True)
        rows = healthy(a.life_dur, LIFE_SCRIPT, LIFE)
        result["life"] = rows
        print(f"=> left running: {sum(bool(r['left_running']) for r in rows)} of {len(rows)}")
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    # Parts run separately (--only) are merged into one file; each part keeps its own date.
    path = out / "guard.json"
    merged = json.loads(path.read_text()) if path.exists() else {}
    merged.update({k: v for k, v in result.items() if k in parts or k not in merged})
    merged.setdefault("dates", {}).update({k: result["date"] for k in parts})
    path.write_text(json.dumps(merged, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
