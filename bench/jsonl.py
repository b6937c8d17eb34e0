"""JSONL benchmark: `python bench/jsonl.py [--gb 1.0] [--big-records 10000000]`.

Same run, same files (generated in a temp folder, deleted at the end):
(a) index build throughput (MB/s, warm page cache) against `wc -l`, as a ratio;
(b) random-access records/s, one process, shuffled order, records of ~200 bytes;
(c) resident memory of a process holding the opened dataset against `list(open(f))`,
    at 1M and 10M records (the dataset's must not grow with the record count);
(d) time to first batch.
The anchor for (b) and (d) is HF `datasets` (`pip install -e .[bench]`), measured on the same
file in the same run: `load_dataset("json")` (the Arrow conversion every first use pays) and
random `ds[i]` reads in the same shuffled order. Without `datasets` it prints "not measured".
Prints a table and writes bench/results/jsonl.json. Targets (issue 4): build >= 0.5x wc -l,
>= 150,000 random records/s, memory growth 1M -> 10M within 20 MB.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RSS_CHILD = r'''
import os, sys, random
def rss():
    fields = dict(l.split(":", 1) for l in open("/proc/self/status"))
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["RssAnon"].split()[0]) / 1024
mode, path = sys.argv[1], sys.argv[2]
from ddpguard.data import JsonlDataset  # imported in both modes: compare like with like
import orjson
before = rss()
if mode == "dataset":
    ds = JsonlDataset(path)
    n = len(ds)
    for i in random.Random(0).sample(range(n), 2000):
        ds[i]
else:
    lines = list(open(path))
    n = len(lines)
    for i in random.Random(0).sample(range(n), 2000):
        orjson.loads(lines[i])
after = rss()
print(n, after[0] - before[0], after[1] - before[1])
'''


def generate(path: str, target_bytes: int, mean_len: int, seed: int) -> int:
    """Write varied records (lognormal text lengths around mean_len bytes) until target."""
    rng = np.random.default_rng(seed)
    words = [b"lorem", b"ipsum", b"dolor", b"sit", b"amet", b"\\u00e9t\\u00e9", b"data"]
    pool = []
    for k in range(20000):
        n = int(np.clip(rng.lognormal(np.log(max(mean_len - 40, 4)), 0.6), 1, 20 * mean_len))
        # whole words only: cutting inside an escape would make the record malformed
        text = b" ".join(words[j] for j in rng.integers(0, len(words), max(n // 6, 1)))
        pool.append(b'{"id": %d, "text": "%s", "n": %d}\n' % (k, text, n))
    pool_arr = np.array(pool, dtype=object)
    written = records = 0
    with open(path, "wb") as f:
        while written < target_bytes:
            block = b"".join(pool_arr[rng.integers(0, len(pool), 200000)])
            f.write(block)
            written += len(block)
            records += 200000
    return records


def hf_anchor(path: str, order: list[int], cache: str) -> dict:
    """HF datasets on the same file: load_dataset("json") time and Arrow cache size, time to the
    first 32 records, random reads/s in `order`. {"not_measured": why} when not installed."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local file: never touch the network
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import datasets
    except ImportError as exc:
        return {"not_measured": f"HF datasets not installed ({exc}); pip install -e .[bench]"}
    datasets.disable_progress_bars()
    t0 = time.perf_counter()
    ds = datasets.load_dataset("json", data_files=path, split="train", cache_dir=cache)
    load_s = time.perf_counter() - t0
    first = [ds[i] for i in range(32)]
    first_batch_s = time.perf_counter() - t0
    assert len(first) == 32 and len(ds) > 0
    arrow_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cache)
                      for f in fs if f.endswith(".arrow"))
    for i in order[:1000]:
        ds[i]
    t = best_of(lambda: [ds[i] for i in order], 2)
    return {"version": datasets.__version__, "records": len(ds), "load_dataset_s": load_s,
            "first_batch_s": first_batch_s, "arrow_cache_MB": arrow_bytes / 1e6,
            "random_reads": len(order), "random_s": t, "records_per_s": len(order) / t}


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def rss_child(mode: str, path: str) -> tuple[int, float, float]:
    out = subprocess.run([sys.executable, "-c", RSS_CHILD, mode, path], capture_output=True,
                         text=True, check=True, timeout=600).stdout.split()
    return int(out[0]), float(out[1]), float(out[2])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0, help="size of the build/access file")
    ap.add_argument("--big-records", type=int, default=10_000_000)
    ap.add_argument("--random-reads", type=int, default=300_000)
    ap.add_argument("--hf-reads", type=int, default=100_000,
                    help="random reads for the HF datasets anchor (a prefix of the same order)")
    args = ap.parse_args()
    import torch

    from ddpguard.data import JsonlDataset, build_offsets, make_loader

    res: dict = {"date": datetime.date.today().isoformat(), "cpus": os.cpu_count(),
                 "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="ddpguard-bench-jsonl-") as tmp:
        big = os.path.join(tmp, "big.jsonl")
        t0 = time.perf_counter()
        n_big = generate(big, int(args.gb * 1e9), 200, 0)
        size = os.path.getsize(big)
        print(f"generated {size / 1e9:.2f} GB, {n_big:,} records "
              f"(mean {size / n_big:.0f} B) in {time.perf_counter() - t0:.1f} s")
        subprocess.run(["cat", big], stdout=subprocess.DEVNULL, check=True)  # warm the cache
        wc = best_of(lambda: subprocess.run(["wc", "-l", big], capture_output=True,
                                            check=True), 3)
        build = best_of(lambda: build_offsets(big, force=True), 3)
        index_mb = os.path.getsize(build_offsets(big)[0]) / 1e6
        res["build"] = {"bytes": size, "records": n_big, "wc_l_s": wc, "index_s": build,
                        "wc_l_MBps": size / 1e6 / wc, "index_MBps": size / 1e6 / build,
                        "ratio_vs_wc_l": wc / build, "index_MB": index_mb}

        ds = JsonlDataset(big)
        assert len(ds) == n_big
        order = np.random.default_rng(1).permutation(len(ds))[:args.random_reads].tolist()
        for i in order[:1000]:
            ds[i]
        t = best_of(lambda: [ds[i] for i in order], 2)
        res["random_access"] = {"records": len(order), "seconds": t,
                                "records_per_s": len(order) / t}

        t0 = time.perf_counter()
        loader = make_loader(JsonlDataset(big), batch_size=32, num_workers=0,
                             collate_fn=lambda b: b)
        next(iter(loader))
        res["first_batch_s"] = {"ddpguard_indexed": time.perf_counter() - t0}
        # Same file, same shuffled order: the anchor is measured here, never quoted.
        res["hf_datasets"] = hf_anchor(big, order[:args.hf_reads], os.path.join(tmp, "hf"))
        os.unlink(big)

        res["memory_MB"] = {}
        for n in (1_000_000, args.big_records):
            path = os.path.join(tmp, f"m{n}.jsonl")
            generate(path, n * 40, 40, n)  # ~40-byte records: 10M fit in ~0.5 GB of disk
            JsonlDataset(path)  # index once, outside the measured process
            rows = {mode: rss_child(mode, path) for mode in ("dataset", "list")}
            res["memory_MB"][str(n)] = {m: {"records": r[0], "rss_MB": r[1], "anon_MB": r[2]}
                                        for m, r in rows.items()}
            os.unlink(path)

    b, r, hf = res["build"], res["random_access"], res["hf_datasets"]
    print(f"\n{'measure':<44} {'ddpguard':>12} {'anchor':>12} {'ratio':>8}")
    print(f"{'index build MB/s vs wc -l (warm)':<44} {b['index_MBps']:>12,.0f} "
          f"{b['wc_l_MBps']:>12,.0f} {b['ratio_vs_wc_l']:>8.2f}")
    label = "random records/s vs HF datasets (target 150k)"
    if "not_measured" in hf:
        print(f"{label:<44} {r['records_per_s']:>12,.0f} {'not measured':>12}")
    else:
        print(f"{label:<44} {r['records_per_s']:>12,.0f} {hf['records_per_s']:>12,.0f} "
              f"{r['records_per_s'] / hf['records_per_s']:>8.1f}")
    mem = res["memory_MB"]
    for n, rows in mem.items():
        d, naive = rows["dataset"], rows["list"]
        print(f"{'RSS growth MB, ' + n + ' records vs list(open)':<44} {d['rss_MB']:>12,.1f} "
              f"{naive['rss_MB']:>12,.1f} {naive['rss_MB'] / max(d['rss_MB'], 0.1):>8.0f}")
    keys = list(mem)
    growth = mem[keys[-1]]["dataset"]["rss_MB"] - mem[keys[0]]["dataset"]["rss_MB"]
    res["memory_growth_1M_to_big_MB"] = growth
    print(f"{'dataset RSS growth ' + keys[0] + ' -> ' + keys[-1] + ' (target < 20 MB)':<44} "
          f"{growth:>12,.1f}")
    fb = res["first_batch_s"]["ddpguard_indexed"]
    label = "time to first batch s (index present) vs HF"
    if "not_measured" in hf:
        print(f"{label:<44} {fb:>12.3f} {'not measured':>12}")
        print(hf["not_measured"])
    else:
        print(f"{label:<44} {fb:>12.3f} {hf['first_batch_s']:>12.3f} "
              f"{hf['first_batch_s'] / fb:>8.1f}")
        print(f"HF datasets {hf['version']}: load_dataset('json') {hf['load_dataset_s']:.2f} s, "
              f"Arrow copy {hf['arrow_cache_MB']:,.0f} MB (ddpguard index {b['index_MB']:,.0f} MB) "
              f"for a {b['bytes'] / 1e6:,.0f} MB file; "
              f"random reads over {hf['random_reads']:,} of the same order")
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "jsonl.json"), "w") as f:
        json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
