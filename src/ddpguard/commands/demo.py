"""`ddpguard demo`: train a small byte-level language model on the standard library's docstrings
on 2 ranks (gloo on CPU, NCCL on GPUs), with exact evaluation every epoch, atomic checkpoints,
`--resume`, count-based baselines, a summary and a self-contained HTML/SVG picture. Launched
through torch.distributed.run like `ddpguard run`. `--hang KIND` runs the same job with one
classic DDP bug under the hang guard instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

NAME = "demo"
HELP = "train a small language model on 2 ranks with eval, checkpoints and resume (~1 minute)"
HANG_KINDS = ("uneven", "rank0-collective", "crash", "bn-eval")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="ddpguard-demo",
                        help="folder for checkpoints, log.csv, summary.json, report.html "
                             "(default: ./ddpguard-demo)")
    parser.add_argument("--nproc-per-node", type=int, default=None,
                        help="ranks to start (default: the GPU count, or 2 on CPU)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop after this many optimizer steps (a quick check)")
    parser.add_argument("--max-tokens", type=int, default=512,
                        help="token budget of one batch on one rank")
    parser.add_argument("--lr", type=float, default=5e-3, help="peak learning rate (AdamW)")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="optimizer steps")
    parser.add_argument("--corpus-bytes", type=int, default=400_000,
                        help="text taken from the standard library's docstrings")
    parser.add_argument("--cache-dir", default=None,
                        help="where the corpus JSONL is written once (default: "
                             "$DDPGUARD_CACHE/demo or ~/.cache/ddpguard/demo)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest checkpoint in --out")
    parser.add_argument("--hang", choices=HANG_KINDS, default=None, metavar="KIND",
                        help="run the job with one classic DDP bug under the hang guard: "
                             f"{', '.join(HANG_KINDS)} (docs/pitfalls.md)")


def main(args: argparse.Namespace) -> int:
    from ..demo.corpus import build_corpus

    for name in ("epochs", "max_tokens", "checkpoint_every", "corpus_bytes"):
        if getattr(args, name) < 1:
            print(f"ddpguard demo: --{name.replace('_', '-')} must be >= 1, got "
                  f"{getattr(args, name)}", file=sys.stderr)
            return 2
    if not args.lr > 0:
        print(f"ddpguard demo: --lr must be > 0, got {args.lr}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    ckpts = out / "checkpoints"
    if args.resume and not any(ckpts.glob("ckpt-*.pt")):
        print(f"ddpguard demo: --resume found no checkpoint in {ckpts}; run `ddpguard demo "
              f"--out {args.out}` first", file=sys.stderr)
        return 2
    print("building the corpus from the standard library's docstrings (once) ...", flush=True)
    train, val = build_corpus(Path(args.cache_dir) if args.cache_dir else None,
                              total_bytes=args.corpus_bytes)
    if args.hang is not None:
        from ..demo.hang import run_hang

        return run_hang(args.hang, out, train, val, args.nproc_per_node)
    return _train(args, out, train, val)


def plan_ranks(nproc: int | None, gpu_count: int) -> tuple[int, str | None]:
    """(ranks to start, a note to print or None): one rank per GPU, 2 on a machine without
    one (`ddpguard run`'s default). NCCL refuses two ranks on one GPU, so more ranks than GPUs
    run on the CPU (gloo)."""
    from ..launch.argv import default_nproc

    n = nproc or default_nproc(gpu_count)
    if 0 < gpu_count < n:
        return n, (f"{n} ranks asked for but {gpu_count} GPU(s) here; NCCL needs one GPU per "
                   "rank, so the ranks run on the CPU (gloo)")
    return n, None


def _train(args: argparse.Namespace, out: Path, train: Path, val: Path) -> int:
    import torch

    from ..demo.baselines import byte_baselines
    from ..demo.report import read_summary, summary_lines, write_page
    from ..launch.torchrun import run_script

    ckpts = out / "checkpoints"
    if not args.resume:
        for old in [*ckpts.glob("ckpt-*.pt"), out / "log.csv", out / "summary.json",
                    out / "throughput.csv"]:
            old.unlink(missing_ok=True)  # a fresh run starts a fresh log and checkpoint series
    out.mkdir(parents=True, exist_ok=True)
    base = byte_baselines(train, val)
    print(f"baselines on the eval text, fitted on the training text: byte unigram "
          f"{base.unigram:.3f}, byte bigram {base.bigram:.3f} nats/byte", flush=True)
    worker = ["-m", "ddpguard.demo.worker", "--out", str(out), "--train", str(train),
              "--val", str(val), "--epochs", str(args.epochs), "--max-tokens",
              str(args.max_tokens), "--lr", str(args.lr),
              "--checkpoint-every", str(args.checkpoint_every)]
    if args.max_steps is not None:
        worker += ["--max-steps", str(args.max_steps)]
    if args.resume:
        worker.append("--resume")
    gpus = torch.cuda.device_count()
    nproc, note = plan_ranks(args.nproc_per_node, gpus)
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    if note:
        print(f"ddpguard demo: {note}", flush=True)
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # read by the ranks torchrun starts
    try:
        # Exactly `ddpguard run`: the guard on every rank, its verdict printed once.
        code = run_script([f"--nproc-per-node={nproc}", *worker])
        if code != 0:
            print(f"ddpguard demo: the training job failed (exit code {code})", file=sys.stderr)
            return code
    finally:  # a caller in this process keeps its own view of the GPUs
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
    summary = read_summary(out)
    print("\nddpguard demo finished")
    for line in summary_lines(summary, base):
        print("  " + line)
    print(f"  picture (losses, baselines, throughput): {write_page(out, summary, base)}")
    print(f"  checkpoints: {ckpts} (continue with: ddpguard demo --resume --out {args.out})")
    return 0
