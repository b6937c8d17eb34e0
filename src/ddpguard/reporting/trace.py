"""The report's lanes as a Chrome trace (Trace Event Format), which opens in Perfetto and
chrome://tracing: one process per rank, one complete event per segment, and a global instant
event at the moment of the report."""

from __future__ import annotations

import json
from typing import Any

from .render import coarsen, lanes, merge_equal, t_start

__all__ = ["chrome_trace", "render_trace", "MAX_TRACE_EVENTS"]

MAX_TRACE_EVENTS = 400_000  # per report; beyond, runs of short segments are folded


def chrome_trace(report: dict[str, Any]) -> dict[str, Any]:
    """Trace Event Format: one process per rank, one complete ("X") event per segment (ts and
    dur in microseconds since t_start), and a global instant event at the report."""
    t0 = t_start(report)
    per_rank = [merge_equal(lanes(r), gap=0.0) for r in report["ranks"]]
    total = sum(len(s) for s in per_rank)
    if total > MAX_TRACE_EVENTS:
        span = max([float(report["created"])] + [s[-1][1] for s in per_rank if s]) - t0
        per_rank = [coarsen(s, span * total / MAX_TRACE_EVENTS / max(1, len(s)) * 2)
                    for s in per_rank]

    def us(t: float) -> float:
        return round((t - t0) * 1e6, 3)

    meta: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for i, (rec, segs) in enumerate(zip(report["ranks"], per_rank, strict=True)):
        pid = int(rec.get("rank", i))
        meta += [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
             "args": {"name": f"rank {pid} ({rec.get('state', '?')})"}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
             "args": {"sort_index": pid}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "main"}},
        ]
        for s in segs:
            start = us(s[0])
            events.append({"name": s[3], "cat": s[2], "ph": "X", "ts": start,
                           "dur": max(0.0, round(us(s[1]) - start, 3)), "pid": pid, "tid": 0})
    d = report["diagnosis"]
    reporter = report.get("reporter_rank", 0)
    events.append({"name": str(d["title"]), "cat": "report", "ph": "i", "s": "g",
                   "ts": us(float(report["created"])), "pid": int(reporter or 0),
                   "tid": 0, "args": {"explanation": str(d.get("explanation", "")),
                                      "fix": str(d.get("fix", "")),
                                      "reason": str(report.get("reason", ""))}})
    events.sort(key=lambda e: (e["ts"], e["pid"]))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"run_id": str(report.get("run_id", "")), "cause": str(d.get("cause", "")),
                          "t_start_unix": t0}}


def render_trace(report: dict[str, Any], path: str) -> str:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(chrome_trace(report), fh, separators=(",", ":"))
    return path
