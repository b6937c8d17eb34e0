"""`ddpguard report FILE.json`: render a hang report as one lane per rank in time: a
self-contained HTML page, a Chrome trace (Perfetto, chrome://tracing) and (matplotlib) a PNG."""

from __future__ import annotations

import argparse
import os
import sys

NAME = "report"
HELP = ("render a ddpguard hang report (JSON) as one lane per rank in time: HTML, a Chrome "
        "trace for Perfetto, and a PNG (with matplotlib)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the JSON report path printed by the guard")
    parser.add_argument("--out", default=None,
                        help="output path without extension; writes OUT.html, OUT.trace.json "
                             "and OUT.png (default: next to FILE, same name)")


def main(args: argparse.Namespace) -> int:
    from ddpguard.guard.report import load
    from ddpguard.reporting.render import render_html, render_png
    from ddpguard.reporting.trace import render_trace

    try:
        report = load(args.file)
    except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
        print(f"ddpguard report: cannot read {args.file}: {exc}\n"
              "  give the .json path that the guard printed after 'full report'",
              file=sys.stderr)
        return 2
    base = args.out or os.path.splitext(args.file)[0]
    try:
        written = [render_html(report, base + ".html"), render_trace(report, base + ".trace.json")]
    except OSError as exc:
        print(f"ddpguard report: cannot write next to {base}: {exc}; choose another --out",
              file=sys.stderr)
        return 2
    except (KeyError, TypeError, AttributeError) as exc:
        print(f"ddpguard report: {args.file} is a damaged ddpguard report ({exc!r} missing or "
              "malformed)", file=sys.stderr)
        return 2
    note = ""
    try:
        written.append(render_png(report, base + ".png"))
    except ImportError:
        note = ("no PNG: it needs matplotlib (pip install 'ddpguard[plot]'); "
                "the HTML page has the same picture")
    d = report["diagnosis"]
    print(f"likely cause: {d['title']}")
    for path in written:
        print(f"wrote {path}")
    print(f"open {written[1]} in https://ui.perfetto.dev or chrome://tracing to zoom in")
    if note:
        print(note)
    return 0
