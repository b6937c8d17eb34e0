"""The failure report: one printed block per rank and one JSON file with everything known."""

from __future__ import annotations

import json
import os
import time
from typing import Any

__all__ = ["format_text", "write_json", "report_path", "load"]

VERSION = 1


def report_path(report_dir: str | None, run_id: str, rank: int) -> str:
    base = report_dir or os.path.join(os.getcwd(), "ddpguard-reports")
    os.makedirs(base, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in run_id)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join(base, f"ddpguard-{safe}-{stamp}-rank{rank}.json")


def write_json(path: str, report: dict[str, Any]) -> str:
    """Write atomically: a half-written report after os._exit would be worse than none."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"version": VERSION, **report}, fh, indent=1, default=str)
    os.replace(tmp, path)
    return path


def load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or "diagnosis" not in data or "ranks" not in data:
        raise ValueError(f"{path} is not a ddpguard report (no 'diagnosis'/'ranks' keys)")
    return data


def format_text(report: dict[str, Any], path: str | None) -> str:
    d = report["diagnosis"]
    me = report["reporter_rank"]
    lines = [
        "",
        f"=============== ddpguard: {report['event']} (report of rank {me} of "
        f"{report['world_size']}) ===============",
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
    if path:
        lines.append(f"full report (all threads' stacks, timeline): {path}")
        lines.append(f"  render it: ddpguard report {path}")
    lines.append("=" * 80)
    return "\n".join(lines)
