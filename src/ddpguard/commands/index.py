"""`ddpguard index FILE...`: build JSONL offset indexes (and length sidecars) ahead of time."""

from __future__ import annotations

import argparse

NAME = "index"
HELP = "build the offset index (and optional length sidecar) of JSONL files ahead of training"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="JSONL files or globs")
    parser.add_argument("--length-field", metavar="F",
                        help="also store per-record lengths: len() of string/list field F "
                             "(or its value if an integer), for TokenBatchSampler")
    parser.add_argument("--force", action="store_true",
                        help="rebuild even when a valid index exists")


def main(args: argparse.Namespace) -> int:
    import os
    import sys
    import time

    from ..data import DatasetError, build_lengths, build_offsets, resolve_paths

    try:
        paths = resolve_paths(args.files)
    except (OSError, DatasetError) as exc:
        print(f"ddpguard index: {exc}", file=sys.stderr)
        return 1
    print(f"{'file':<40} {'records':>12} {'bytes':>14} {'seconds':>8} {'MB/s':>8}  index")
    failed = 0
    for p in paths:
        try:
            t0 = time.perf_counter()
            where, off, built = build_offsets(p, force=args.force)
            if args.length_field:
                build_lengths(p, off, args.length_field, force=args.force)
            dt = time.perf_counter() - t0
        except (OSError, DatasetError, TimeoutError) as exc:
            print(f"ddpguard index: {exc}", file=sys.stderr)
            failed += 1
            continue
        size = os.path.getsize(p)
        note = "" if built else " (up to date)"
        print(f"{p:<40} {len(off) - 1:>12,} {size:>14,} {dt:>8.2f} "
              f"{size / 1e6 / max(dt, 1e-9):>8.0f}  {where}{note}")
    return 1 if failed else 0
