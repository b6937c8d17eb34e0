"""The failure report: one JSON file with everything known, and the block printed from it.

Under `ddpguard run` the launcher prints the block (commands/run.py reads the JSON the ranks
leave); the rank that wrote the report says one line. Without the launcher the rank prints
the block itself, through the guard's own descriptor (channel.py)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from . import channel
from .records import Report
from .stacks import short_text

__all__ = ["format_text", "write_json", "report_path", "load", "announce", "LAUNCH_ENV"]

# A token `ddpguard run` gives its ranks; every report they write carries it, so the launcher
# prints this run's reports and never an older one from the same folder.
LAUNCH_ENV = "DDPGUARD_LAUNCH_ID"

VERSION = 1


_paths: dict[tuple[str, str, int], str] = {}


def report_path(report_dir: str | None, run_id: str, rank: int) -> str:
    """One path per (folder, run, rank) in a process: the partial report a rank writes first
    and its finished report are the same file, whatever the clock did in between."""
    base = report_dir or os.path.join(os.getcwd(), "ddpguard-reports")
    os.makedirs(base, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in run_id)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return _paths.setdefault((base, safe, rank),
                             os.path.join(base, f"ddpguard-{safe}-{stamp}-rank{rank}.json"))


def write_json(path: str, report: Mapping[str, Any]) -> str:
    """Write atomically: a half-written report after os._exit would be worse than none.
    `report` is a `Report`, as assembled or as read back and finished by the launcher."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"version": VERSION, "launch_id": os.environ.get(LAUNCH_ENV),
                   "attempt": _attempt(), **report}, fh,
                  indent=1, default=str)
    os.replace(tmp, path)
    return path


def _attempt() -> int:
    """torchrun's restart count: the launcher prints only the last attempt's report."""
    raw = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(raw) if raw.isdigit() else 0


def load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or "diagnosis" not in data or "ranks" not in data:
        raise ValueError(f"{path} is not a ddpguard report (no 'diagnosis'/'ranks' keys)")
    return data


def format_text(report: Mapping[str, Any], path: str | None) -> str:
    """The stop block, from a `Report` (built here, or read back from its file)."""
    d = report["diagnosis"]
    me = report["reporter_rank"]
    lines = [
        "",
        f"=============== ddpguard: {report['event']} (report of "
        f"{'rank ' + str(me) if me is not None else 'ddpguard run, from the fault logs'} of "
        f"{report['world_size']}{_attempt_text(report)}) ===============",
        f"likely cause: {d['title']}",
        f"  {d['explanation']}",
        f"what to do: {d['fix']}",
        "where each rank is:",
    ]
    for r in report["ranks"]:
        p = d["positions"].get(str(r["rank"]), {})
        hb = r.get("hb") or {}
        state = "" if r["state"] == "running" else f" [{r['state']}]"
        lines.append(
            f"  rank {r['rank']}{state}: {p.get('doing', '?')} at {p.get('user', '?')}"
            f"\n      innermost: {p.get('innermost', '?')}"
            f"\n      epoch {hb.get('epoch', '?')}, steps {hb.get('steps', '?')} "
            f"({hb.get('steps_epoch', '?')} this epoch), batches {hb.get('batches', '?')}"
        )
    for note in report.get("notes") or []:
        lines.append(f"note: {note}")
    if path:
        lines.append(f"full report (all threads' stacks, timeline): {path}")
        lines.append(f"  render it: ddpguard report {path}")
    lines.append("=" * 80)
    return short_text("\n".join(lines))


def _attempt_text(report: Mapping[str, Any]) -> str:
    """Which attempt, once torchrun has restarted the job: a later attempt's report is not
    the first one's."""
    k = report.get("attempt")
    return f", attempt {k}" if isinstance(k, int) and k > 0 else ""


def announce(report: Report, path: str | None) -> None:
    """Say that this rank stopped the job. Under `ddpguard run` one line (the launcher prints
    the block from the JSON file, so it appears once whatever the ranks' streams are); alone,
    the whole block. Both through the guard's own descriptor, never the script's streams."""
    channel.flush_user_streams()
    if channel.under_launcher() and path:
        title = report["diagnosis"]["title"]
        channel.write(f"ddpguard: rank {report['reporter_rank']} stopped the job: {title} "
                      f"(report: {path}; `ddpguard run` prints it)")
    else:
        channel.write(format_text(report, path))
