"""`ddpguard demo`: train a small byte-level language model on the standard library's docstrings
on 2 ranks (gloo on CPU, NCCL on GPUs), with exact evaluation every epoch, atomic checkpoints,
`--resume`, a summary and a loss plot. Launched through torch.distributed.run like `ddpguard run`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

NAME = "demo"
HELP = "train a small language model on 2 ranks with eval, checkpoints and resume (~1 minute)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="ddpguard-demo",
                        help="folder for checkpoints, log.csv, summary.json, loss.png "
                             "(default: ./ddpguard-demo)")
    parser.add_argument("--nproc-per-node", type=int, default=None,
                        help="ranks to start (default: the GPU count, or 2 on CPU)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop after this many optimizer steps (a quick check)")
    parser.add_argument("--max-tokens", type=int, default=2048,
                        help="token budget of one batch on one rank")
    parser.add_argument("--checkpoint-every", type=int, default=100, help="optimizer steps")
    parser.add_argument("--corpus-bytes", type=int, default=400_000,
                        help="text taken from the standard library's docstrings")
    parser.add_argument("--cache-dir", default=None,
                        help="where the corpus JSONL is written once (default: "
                             "$DDPGUARD_CACHE/demo or ~/.cache/ddpguard/demo)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest checkpoint in --out")


def main(args: argparse.Namespace) -> int:
    import torch
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    from ..demo.corpus import build_corpus
    from ..demo.report import plot, read_summary, summary_lines
    from .run import _flag_options, build_torchrun_argv

    for name in ("epochs", "max_tokens", "checkpoint_every", "corpus_bytes"):
        if getattr(args, name) < 1:
            print(f"ddpguard demo: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    out = Path(args.out).resolve()
    ckpts = out / "checkpoints"
    if args.resume and not any(ckpts.glob("ckpt-*.pt")):
        print(f"ddpguard demo: --resume found no checkpoint in {ckpts}; run `ddpguard demo "
              f"--out {args.out}` first", file=sys.stderr)
        return 2
    if not args.resume:
        for old in [*ckpts.glob("ckpt-*.pt"), out / "log.csv", out / "summary.json"]:
            old.unlink(missing_ok=True)  # a fresh run starts a fresh log and checkpoint series
    out.mkdir(parents=True, exist_ok=True)
    print("building the corpus from the standard library's docstrings (once) ...", flush=True)
    train, val = build_corpus(Path(args.cache_dir) if args.cache_dir else None,
                              total_bytes=args.corpus_bytes)
    worker = ["-m", "ddpguard.demo.worker", "--out", str(out), "--train", str(train),
              "--val", str(val), "--epochs", str(args.epochs), "--max-tokens",
              str(args.max_tokens), "--checkpoint-every", str(args.checkpoint_every)]
    if args.max_steps is not None:
        worker += ["--max-steps", str(args.max_steps)]
    if args.resume:
        worker.append("--resume")
    opts = [f"--nproc-per-node={args.nproc_per_node}"] if args.nproc_per_node else []
    argv = build_torchrun_argv(opts + worker, gpu_count=torch.cuda.device_count(),
                               flags=_flag_options())
    try:
        torchrun_main(argv)
    except ChildFailedError as exc:
        print(f"ddpguard demo: a rank failed: {exc}", file=sys.stderr)
        return 1
    summary = read_summary(out)
    print("\nddpguard demo finished")
    for line in summary_lines(summary):
        print("  " + line)
    png, why = plot(out)
    print(f"  loss plot: {png}" if png else f"  {why}")
    print(f"  checkpoints: {ckpts} (continue with: ddpguard demo --resume --out {args.out})")
    return 0
