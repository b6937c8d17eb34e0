"""`ddpguard report FILE.json`: render a hang report to PNG and self-contained HTML."""

from __future__ import annotations

import argparse
import os
import sys

NAME = "report"
HELP = "render a ddpguard hang report (JSON) as a per-rank timeline: PNG and HTML"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the JSON report path printed by the guard")
    parser.add_argument("--out", default=None,
                        help="output path without extension (default: next to FILE)")


def main(args: argparse.Namespace) -> int:
    from ddpguard.guard.render import render_html, render_png
    from ddpguard.guard.report import load

    try:
        report = load(args.file)
    except (OSError, ValueError) as exc:
        print(f"ddpguard report: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    base = args.out or os.path.splitext(args.file)[0]
    png = render_png(report, base + ".png")
    page = render_html(report, base + ".html")
    d = report["diagnosis"]
    print(f"likely cause: {d['title']}")
    print(f"wrote {png}")
    print(f"wrote {page}")
    return 0
