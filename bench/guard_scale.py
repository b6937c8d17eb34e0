"""The guard's protocol at 64, 256 and 1,024 ranks, simulated against a real TCPStore on this
machine: `python bench/guard_scale.py`.

Simulated ranks run the guard's own store code (`ddpguard.guard.store.GuardStore`,
`ddpguard.guard.board.Board`) and the judge runs the real rules (`ddpguard.guard.rules.decide`)
over the heartbeats it reads, each rank with its own store connection, spread over a few
worker processes; the store is hosted by a process of its own, as torchrun's agent hosts it.
Each tick every rank writes a heartbeat shaped like a real one and does what the guard's
tick does. Reported, per world size:

- requests per tick (counted on every connection) for the linear protocol, and for the old
  one in which every rank read every heartbeat (one `check` per key, then a `multi_get`);
- the tick period held against the 0.5 s goal (slowest worker's tick, median and max);
- the judge's CPU share (its process time per tick over the tick period);
- at the largest size, seconds from the moment two ranks publish mismatched pending
  collectives to the moment the last rank has seen the stop (goal <= 5 s; the guard adds its
  1 s settle before a rank publishes itself as blocked);
- the job's own store traffic under the guard's load: latency of a rendezvous-like
  `add` + `get` probe with the guard running, against the idle store in the same run.

Writes bench/results/guard_scale.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
INTERVAL = 0.5


def _store(port: int, master: bool = False) -> Any:
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=master, wait_for_workers=False,
                         timeout=timedelta(seconds=60), use_libuv=True)


def heartbeat(rank: int, seq: int, blocked: bool, op: str = "all_reduce") -> dict[str, Any]:
    """The fields and sizes of a real heartbeat (see Guard.heartbeat)."""
    pending = [["0", 4000, op, [[1024, 1024]], ["Float"], False]] if blocked else []
    return {"epoch": 3, "steps": 1200, "steps_epoch": 200, "batches": 1210, "forwards": 1210,
            "train_forwards": 1210, "backwards": 1210, "epoch_batches": 200, "epoch_len": 400,
            "loaders": {"train.py:88": {"epoch": 3, "batches": 1210, "len": 400,
                                        "key": "ab12cd34/3"}},
            "rank": rank, "pid": 10000 + rank, "host": f"node{rank // 8}", "seq": seq,
            "state": "running", "error": None, "mismatch": None, "t": time.time(),
            "ledger": {"0": [4000 if blocked else 3999, 3999]}, "blocked": blocked,
            "blocked_for": 1.0 if blocked else 0.0, "pending": pending, "quiet": 0.1,
            "life": "progress", "doing": "in a collective" if blocked else "computing",
            "kind": "collective" if blocked else "computing", "where": "train.py:120"}


def old_tick(gs: Any, world: int) -> None:
    """The protocol before this one: every rank read every heartbeat, one `check` per key,
    then one `multi_get`, and the trigger (what Guard._tick did per rank)."""
    keys = [gs.prefix + f"hb/{p}" for p in range(world)]
    present = [k for k in keys if gs._store.check([k])]
    gs._store.multi_get(present)
    gs._store.check([gs.prefix + "trigger"])
    gs.counter.requests += len(keys) + 2


def worker(ranks: list[int], world: int, port: int, start_q: Any, ticks: int, protocol: str,
           mismatch_tick: int | None, out: Any) -> None:
    from ddpguard.guard.board import Board
    from ddpguard.guard.rules import decide
    from ddpguard.guard.store import Counter, GuardStore

    counter = Counter()
    members = []
    for r in ranks:
        gs = GuardStore(_store(port), "ddpguard/guard/sim/", counter)
        board = Board(gs, r, world, INTERVAL)
        board.create()
        members.append((r, gs, board))
    for r, gs, _ in members:
        gs.set(f"hb/{r}", heartbeat(r, 0, False))
    out.put({"ready": len(ranks)})
    t0 = start_q.get(timeout=600)
    for _, _, board in members:
        board.watch_from(time.monotonic() + (t0 - time.time()))
    tick_times: list[float] = []
    judge_cpu: list[float] = []
    requests: list[int] = []
    seen_stop: dict[int, float] = {}
    for tick in range(1, ticks + 1):
        start = t0 + tick * INTERVAL
        delay = start - time.time()
        if delay > 0:
            time.sleep(delay)
        w0 = time.perf_counter()
        c0 = counter.requests
        blocked = mismatch_tick is not None and tick >= mismatch_tick
        for r, gs, board in members:
            op = "broadcast" if blocked and r == world - 1 else "all_reduce"
            gs.set(f"hb/{r}", heartbeat(r, tick, blocked, op))
            if protocol == "old":
                old_tick(gs, world)
                continue
            control = board.poll()
            if control.get("trigger"):
                seen_stop.setdefault(r, time.time())
                continue
            if board.judging():
                p0 = time.process_time()
                peers = board.heartbeats()
                board.publish()
                decision = decide(peers, world, grace=1.0, no_life=45.0, hard_limit=None,
                                  fallback_deadlock=15.0)
                if decision is not None:
                    gs.first("trigger", {"by": r, "cause": decision.cause})
                judge_cpu.append(time.process_time() - p0)
        tick_times.append(time.perf_counter() - w0)
        requests.append(counter.requests - c0)
        if mismatch_tick is not None and len(seen_stop) == len(members):
            break
    out.put({"ranks": len(ranks), "tick_times": tick_times, "requests": requests,
             "judge_cpu": judge_cpu, "seen_stop": seen_stop})


def probe(port: int, seconds: float) -> list[float]:
    """Latency (ms) of the job's own kind of store traffic: an add and a get."""
    s = _store(port)
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        s.add("job/probe", 1)
        s.get("job/probe")
        out.append((time.perf_counter() - t) * 1e3)
        time.sleep(0.02)
    return out


def host(port_q: Any, stop: Any) -> None:
    s = _store(0, master=True)
    port_q.put(s.port)
    stop.wait()


def run(world: int, protocol: str, ticks: int, workers: int, mismatch: bool,
        port: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    q, start_q = ctx.Queue(), ctx.Queue()
    per = [list(range(w, world, workers)) for w in range(workers)]
    mtick = 4 if mismatch else None
    procs = [ctx.Process(target=worker, args=(rs, world, port, start_q, ticks, protocol, mtick,
                                              q)) for rs in per]
    for p in procs:
        p.start()
    for _ in procs:  # every connection open and every heartbeat written
        q.get(timeout=600)
    t0 = time.time() + 0.5
    for _ in procs:
        start_q.put(t0)
    time.sleep(max(0.0, t0 - time.time() + INTERVAL))
    lat = probe(port, min(ticks * INTERVAL * 0.6, 6.0)) if not mismatch else []
    results = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    ticks_slowest = [max(r["tick_times"][i] for r in results if i < len(r["tick_times"]))
                     for i in range(min(len(r["tick_times"]) for r in results))]
    reqs = [sum(r["requests"][i] for r in results) for i in range(len(ticks_slowest))]
    jcpu = [c for r in results for c in r["judge_cpu"]]
    out: dict[str, Any] = {
        "world": world, "protocol": protocol,
        "requests_per_tick": statistics.median(reqs[1:] or reqs),
        "tick_work_s_median": statistics.median(ticks_slowest),
        "tick_work_s_max": max(ticks_slowest),
        "period_held": max(ticks_slowest) <= INTERVAL,
        "judge_cpu_share": (statistics.median(jcpu) / INTERVAL) if jcpu else None,
        "judge_ticks": len(jcpu),
        "probe_ms_p50": statistics.median(lat) if lat else None,
        "probe_ms_p99": sorted(lat)[int(0.99 * (len(lat) - 1))] if lat else None,
    }
    if mismatch:
        blocked_at = t0 + (mtick or 0) * INTERVAL
        seen = [t for r in results for t in r["seen_stop"].values()]
        out["stop_all_seen_s"] = (max(seen) - blocked_at) if len(seen) == world else None
        out["ranks_stopped"] = len(seen)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="64,256,1024")
    ap.add_argument("--old-worlds", default="64,256")
    ap.add_argument("--ticks", type=int, default=12)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("spawn")
    port_q, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=host, args=(port_q, stop))
    server.start()
    port = port_q.get(timeout=30)
    idle = probe(port, 3.0)
    rows = []
    try:
        for w in [int(x) for x in args.worlds.split(",") if x]:
            rows.append(run(w, "linear", args.ticks, args.workers, False, port))
            print(json.dumps(rows[-1]), flush=True)
        for w in [int(x) for x in args.old_worlds.split(",") if x]:
            rows.append(run(w, "old", max(4, args.ticks // 3), args.workers, False, port))
            print(json.dumps(rows[-1]), flush=True)
        biggest = max(int(x) for x in args.worlds.split(","))
        rows.append(run(biggest, "linear", 40, args.workers, True, port))
        print(json.dumps(rows[-1]), flush=True)
    finally:
        stop.set()
        server.join(timeout=10)
    result = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
              "interval_s": INTERVAL, "idle_probe_ms_p50": statistics.median(idle),
              "idle_probe_ms_p99": sorted(idle)[int(0.99 * (len(idle) - 1))], "rows": rows}
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "guard_scale.json").write_text(json.dumps(result, indent=1))
    print(f"idle store probe: p50 {result['idle_probe_ms_p50']:.3f} ms, "
          f"p99 {result['idle_probe_ms_p99']:.3f} ms")
    print(f"{'world':>6} {'protocol':>8} {'req/tick':>9} {'tick work med/max s':>20} "
          f"{'held':>5} {'judge cpu':>9} {'probe p50/p99 ms':>17} {'stop s':>7}")
    for r in rows:
        jc = f"{100 * r['judge_cpu_share']:.1f}%" if r["judge_cpu_share"] is not None else "-"
        pr = (f"{r['probe_ms_p50']:.2f}/{r['probe_ms_p99']:.2f}"
              if r["probe_ms_p50"] is not None else "-")
        st = f"{r['stop_all_seen_s']:.2f}" if r.get("stop_all_seen_s") is not None else "-"
        print(f"{r['world']:>6} {r['protocol']:>8} {r['requests_per_tick']:>9.0f} "
              f"{r['tick_work_s_median']:>9.3f}/{r['tick_work_s_max']:<9.3f} "
              f"{'yes' if r['period_held'] else 'NO':>5} {jc:>9} {pr:>17} {st:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
