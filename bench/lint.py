"""Benchmark `ddpguard lint` against plain `ast.parse` of the same files (the floor).

Generates N scripts of about 300 lines (DDP training code in several styles, with and
without the seeds' bugs), then times, in one run: reading + ast.parse only, and the full lint
(parse + rules) in one process, and with --jobs N processes, in interleaved rounds.
Target: lint <= 2x parse, on the CPU time of this process (the VM is shared, wall time is
printed beside it).

    python bench/lint.py [--files 1000] [--jobs 2]
"""

from __future__ import annotations

import argparse
import ast
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from ddpguard.lint import Selection, lint_file, lint_paths  # noqa: E402

_HEAD = """import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
"""

_BLOCKS = [
    '''
def build_loader_{i}(ds, batch_size={b}):
    sampler = DistributedSampler(ds, shuffle=True, drop_last={drop})
    loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=2)
    return loader, sampler
''',
    '''
class Trainer{i}:
    def __init__(self, net, ds):
        self.rank = dist.get_rank()
        self.model = DDP(net.cuda(), device_ids=[int(os.environ["LOCAL_RANK"])])
        self.sampler = DistributedSampler(ds, drop_last=True)
        self.loader = DataLoader(ds, batch_size={b}, sampler=self.sampler)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.{b})

    def fit(self, epochs):
        for epoch in range(epochs):
            {set_epoch}
            for step, (x, y) in enumerate(self.loader):
                loss = torch.nn.functional.cross_entropy(self.model(x), y)
                loss.backward()
                if (step + 1) % {b} == 0:
                    self.opt.step()
                    self.opt.zero_grad()
            if self.rank == 0:
                torch.save(self.model.module.state_dict(), f"ckpt_{{epoch}}.pt")
            dist.barrier()
''',
    '''
def evaluate_{i}(model, loader, device):
    total = torch.zeros(2, device=device)
    with torch.no_grad():
        for x, y in loader:
            out = model(x.to(device))
            total[0] += torch.nn.functional.cross_entropy(out, y.to(device)).item()
            total[1] += 1
    dist.all_reduce(total)
    return (total[0] / total[1]).item()
''',
    '''
def get_reduced_{i}(tensor, dst, world_size):
    tensor = tensor.clone().detach()
    dist.reduce(tensor, dst=dst)
    if dist.get_rank() == dst:
        return tensor.item() / world_size
    return None
''',
    '''
def collate_{i}(batch):
    xs = torch.stack([b[0] for b in batch])
    ys = torch.tensor([b[1] for b in batch])
    return xs, ys


def configure_{i}(args):
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if args.local_rank in [-1, 0]:
        print("configured", args)
    state = torch.load(args.resume, map_location="cpu", weights_only=True)
    return {{"lr": 0.{b} * args.world_size, "state": state}}
''',
]


def make_script(rng: random.Random, target_lines: int = 300) -> str:
    parts = [_HEAD]
    i = 0
    while sum(p.count("\n") for p in parts) < target_lines:
        block = rng.choice(_BLOCKS)
        parts.append(block.format(i=i, b=rng.randint(1, 9), drop=rng.choice([True, False]),
                                  set_epoch=rng.choice(["self.sampler.set_epoch(epoch)",
                                                        "pass"])))
        i += 1
    parts.append('\nif __name__ == "__main__":\n    dist.init_process_group("nccl")\n'
                 '    dist.destroy_process_group()\n')
    return "".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files = []
        for n in range(args.files):
            p = root / f"d{n % 10}" / f"train_{n}.py"
            p.parent.mkdir(exist_ok=True)
            p.write_text(make_script(rng))
            files.append(p)
        lines = sum(p.read_text().count("\n") for p in files)
        # What `ddpguard lint` runs: the default rules and the preview rules it counts.
        sel = Selection(preview=True)

        def parse_all() -> None:
            for p in files:
                ast.parse(p.read_bytes().decode("utf-8"), filename=str(p))

        def lint_all() -> int:
            return sum(len(lint_file(p, sel)) for p in files)

        def lint_jobs() -> int:
            return len(lint_paths([root], sel, jobs=args.jobs))

        # Rounds interleave parse and lint so both meet the same machine load (the VM is
        # shared); the ratio uses CPU time of this process, which other jobs' load moves
        # least. --jobs runs afterwards (its worker processes would load the next round),
        # and only its wall time means anything.
        runs = [("ast.parse (floor)", parse_all), ("lint, 1 process", lint_all)]
        timings: dict[str, float] = {name: float("inf") for name, _ in runs}
        cpu: dict[str, float] = dict(timings)
        findings = 0
        for _ in range(args.repeat):
            for name, fn in runs:
                t0, c0 = time.perf_counter(), time.process_time()
                out = fn()
                timings[name] = min(timings[name], time.perf_counter() - t0)
                cpu[name] = min(cpu[name], time.process_time() - c0)
                if isinstance(out, int):
                    findings = out
        jobs_name = f"lint, --jobs {args.jobs}"
        timings[jobs_name] = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            lint_jobs()
            timings[jobs_name] = min(timings[jobs_name], time.perf_counter() - t0)
    floor = timings["ast.parse (floor)"]
    print(f"{args.files} files, {lines} lines ({lines / args.files:.0f}/file), "
          f"{findings} findings, best of {args.repeat} interleaved rounds")
    print(f"{'run':<22}{'wall s':>10}{'files/s':>10}{'x parse':>10}{'cpu s':>10}{'x parse':>10}")
    rows = []
    for name, sec in timings.items():
        ratio = sec / floor
        c = cpu.get(name)
        cpu_cols = f"{c:>10.3f}{c / cpu['ast.parse (floor)']:>10.2f}" if c is not None else \
            f"{'-':>10}{'-':>10}"
        print(f"{name:<22}{sec:>10.3f}{args.files / sec:>10.0f}{ratio:>10.2f}{cpu_cols}")
        rows.append({"run": name, "seconds": sec, "files_per_s": args.files / sec,
                     "ratio_to_parse": ratio, "cpu_seconds": c})
    print(f"wall x parse, 1 process: {timings['lint, 1 process'] / floor:.2f}")
    ratio1 = cpu["lint, 1 process"] / cpu["ast.parse (floor)"]
    print(f"target lint <= 2.0x parse (cpu): {'MET' if ratio1 <= 2.0 else 'MISSED'} "
          f"({ratio1:.2f}x)")
    out = Path(__file__).resolve().parent / "results" / "lint.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"files": args.files, "lines": lines, "findings": findings,
                               "python": platform.python_version(), "rows": rows,
                               "target_ratio": 2.0, "ratio": ratio1}, indent=2))


if __name__ == "__main__":
    main()
