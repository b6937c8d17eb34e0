"""DDP programs whose rank 0 works OUTSIDE its training thread while rank 1 waits in barrier():
the guard must see the work as life (healthy cases) and see a stuck child as none (broken).

    ddpguard run --nproc-per-node 2 tests/guard/scripts/life_scenarios.py --case CASE --dur 8
    python tests/guard/scripts/life_scenarios.py --serve --dur 8   # the trickling HTTP server

Healthy: pool (tokenizing with multiprocessing.Pool.map, the "main process first" pattern),
subprocess (compressing a checkpoint in a child), thread_writes (a ThreadPoolExecutor writes
while the training thread waits on the future), http (a download that trickles in on the
training thread, from the server `--serve` starts: the test or benchmark runs it, so that its
bytes and CPU are not the rank's own). Broken: child_deadlock (rank 0 waits for a child that
deadlocked), child_sleeps (rank 0 waits for a subprocess that sleeps forever),
mismatch_busy_helper (a mismatched collective on a rank whose helper thread keeps writing: the
rank waits in a collective, so its helper's work is not life and the mismatch is proven).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

COMPRESS = """import os, sys, tempfile, time, zlib
end = time.monotonic() + float(sys.argv[1])
with tempfile.TemporaryFile() as fh:
    while time.monotonic() < end:
        fh.write(zlib.compress(os.urandom(1 << 18), 9))
        if fh.tell() > 64 << 20:
            fh.seek(0)
"""


def tokenize(seconds: float) -> int:
    """CPU-bound work in a pool worker (a tokenizer in pure Python)."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += sum(len(w) for w in ("the", "quick", "brown", "fox", "jumps", "over", "the"))
    return n


def write_for(seconds: float) -> int:
    """Checkpoint shards written by a worker thread (a slow disk: small sleeps between)."""
    end = time.monotonic() + seconds
    written = 0
    with tempfile.TemporaryFile() as fh:
        while time.monotonic() < end:
            written += fh.write(os.urandom(1 << 16))
            if fh.tell() > 64 << 20:
                fh.seek(0)
            time.sleep(0.02)
    return written


def deadlock(lock: threading.Lock) -> None:
    lock.acquire()
    lock.acquire()  # never released: no CPU, no I/O


def serve(dur: float, chunk: int = 256, every: float = 0.25) -> None:
    """An HTTP server on 127.0.0.1 whose every response trickles `chunk` bytes every `every`
    seconds for `dur` seconds. Prints its URL, then serves until killed."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Trickle(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            end = time.monotonic() + dur
            try:
                while time.monotonic() < end:
                    self.wfile.write(b"t" * chunk)
                    self.wfile.flush()
                    time.sleep(every)
            except (BrokenPipeError, ConnectionResetError):
                print("trickle: the client went away", file=sys.stderr, flush=True)

        def log_message(self, *a: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    print(f"URL http://127.0.0.1:{httpd.server_address[1]}/data", flush=True)
    httpd.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--case", default="")
    p.add_argument("--dur", type=float, default=8.0)
    p.add_argument("--url", default="")
    p.add_argument("--serve", action="store_true")
    args = p.parse_args()
    if args.serve:
        serve(args.dur)
        return

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def steps(n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            opt.step()

    steps(3)
    dur = args.dur
    if args.case == "mismatch_busy_helper":
        if rank == 0:  # an asynchronous checkpoint writer that never stops
            threading.Thread(target=write_for, args=(3600.0,), daemon=True).start()
            time.sleep(1.0)
            dist.barrier()
        else:
            time.sleep(1.0)
            dist.all_reduce(torch.ones(3))  # rank 1 all-reduces where rank 0 waits in barrier
    for case in args.case.split(","):
        phase(case, rank, dur, args.url)
    steps(2)
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


def phase(case: str, rank: int, dur: float, url: str) -> None:
    """Rank 0 works `dur` seconds outside its training thread, the way `case` says, while
    rank 1 waits in barrier(); several phases run one after another in one job."""
    import multiprocessing
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    import torch.distributed as dist

    if rank == 0:
        if case == "pool":
            with multiprocessing.get_context("fork").Pool(2) as pool:
                pool.map(tokenize, [dur / 4] * 8, chunksize=1)  # dataset.map(num_proc=2)
        elif case == "subprocess":
            subprocess.run([sys.executable, "-c", COMPRESS, str(dur)], check=True)
        elif case == "thread_writes":
            with ThreadPoolExecutor(2) as ex:
                ex.submit(write_for, dur).result()
        elif case == "http":
            got = 0
            with urllib.request.urlopen(url) as resp:  # no timeout: blocked in recv
                while data := resp.read(1024):
                    got += len(data)
            print(f"rank 0: downloaded {got} bytes", flush=True)
        elif case == "child_deadlock":
            child = multiprocessing.get_context("fork").Process(
                target=deadlock, args=(threading.Lock(),))
            child.start()
            child.join()  # the child deadlocked: waits forever
        elif case == "child_sleeps":
            subprocess.run(["sleep", "600"], check=True)  # an upload tool stuck on nothing
        print(f"rank 0: phase {case} done", flush=True)
    dist.barrier()  # rank 1 waits here all along


if __name__ == "__main__":
    main()
