"""`ddpguard lint`: the DDP pitfalls of docs/pitfalls.md, found in a script before it runs."""

from __future__ import annotations

import argparse
import os
import sys

NAME = "lint"
HELP = "check training scripts for DDP pitfalls (static: never imports or runs them)"


def _codes(text: str | None) -> tuple[str, ...]:
    return tuple(c.strip().upper() for c in (text or "").split(",") if c.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="files and folders to check")
    parser.add_argument("--format", choices=("text", "json", "sarif"), default="text")
    parser.add_argument("--select", help="comma-separated codes or prefixes (DDP001,DDP01,ALL)")
    parser.add_argument("--extend-select", help="codes to add to the default set (DDP018)")
    parser.add_argument("--ignore", help="comma-separated codes or prefixes to skip")
    parser.add_argument("--preview", action="store_true",
                        help="also run the rules not yet proven on unseen code "
                             "(docs/lint.md: default and preview rules)")
    parser.add_argument("--no-config", action="store_true",
                        help="ignore [tool.ddpguard.lint] in pyproject.toml")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="processes to use")
    parser.add_argument("--exit-zero", action="store_true", help="exit 0 even with findings")


def main(args: argparse.Namespace) -> int:
    from collections import Counter
    from dataclasses import replace
    from pathlib import Path

    from .. import __version__
    from ..lint import Selection, discover, lint_paths
    from ..lint.config import load_selection
    from ..lint.output import render_json, render_sarif, render_text

    select, ignore = _codes(args.select), _codes(args.ignore)
    extend = _codes(args.extend_select)
    try:
        files = discover(args.paths)
        if args.no_config:
            selection = Selection(select=select, ignore=ignore, extend_select=extend,
                                  preview=args.preview)
        else:
            selection = load_selection(Path(args.paths[0]), select, ignore, extend,
                                       args.preview)
        if args.jobs < 1:
            raise ValueError(f"--jobs must be at least 1, got {args.jobs}")
    except (ValueError, FileNotFoundError) as exc:
        print(f"ddpguard lint: {exc}", file=sys.stderr)
        return 2
    held_back = selection.held_back()
    findings = lint_paths(args.paths, replace(selection, preview=True) if held_back
                          else selection, jobs=args.jobs)
    # The preview rules ran only to be counted: their findings are neither shown nor
    # counted in the exit code (they would cry wolf more than a default rule may).
    held = Counter(f.code for f in findings if f.code in held_back)
    findings = [f for f in findings if f.code not in held_back]
    if args.format == "json":
        text = render_json(findings)
    elif args.format == "sarif":
        text = render_sarif(findings, __version__)
    else:
        text = render_text(findings, len(files), held)
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # `ddpguard lint src | head`: the reader has what it wanted; no traceback, and none
        # at exit either when Python flushes the closed pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if args.exit_zero:
        return 0
    return 1 if any(f.severity in ("error", "warning") for f in findings) else 0
