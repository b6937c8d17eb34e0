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
    parser.add_argument("file", help="the JSON report path printed by the guard, or a report "
                                     "folder: lists its launches and their attempts")
    parser.add_argument("--out", default=None,
                        help="output path without extension; writes OUT.html, OUT.trace.json "
                             "and OUT.png (default: next to FILE, same name)")


def list_folder(folder: str) -> list[str]:
    """One block per launch (newest last): each attempt's reports, with the rank that wrote
    it and the likely cause."""
    import glob
    import json

    launches: dict[str, list[tuple[float, int, str, dict]]] = {}
    for path in glob.glob(os.path.join(glob.escape(folder), "ddpguard-*.json")):
        try:
            with open(path, encoding="utf-8") as fh:
                rep = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(rep, dict) and "diagnosis" in rep:
            key = str(rep.get("launch_id") or "(no launch id: run without `ddpguard run`)")
            launches.setdefault(key, []).append(
                (float(rep.get("created", 0)), int(rep.get("attempt") or 0), path, rep))
    lines = []
    for launch, rows in sorted(launches.items(), key=lambda kv: min(r[0] for r in kv[1])):
        lines.append(f"launch {launch}:")
        for _, attempt, path, rep in sorted(rows, key=lambda r: (r[1], r[0])):
            title = rep["diagnosis"].get("title", "?")
            lines.append(f"  attempt {attempt}: rank {rep.get('reporter_rank', '?')}: {title}"
                         f"{' (partial)' if rep.get('partial') else ''}\n    {path}")
    return lines


def main(args: argparse.Namespace) -> int:
    from ddpguard.guard.report import load

    if os.path.isdir(args.file):
        lines = list_folder(args.file)
        print("\n".join(lines) if lines else f"no ddpguard reports in {args.file}")
        return 0
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
