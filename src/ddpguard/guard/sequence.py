"""This rank's recent collectives, each placed in its training loop and tagged with the thread
that issued it: what a report aligns across ranks (align.py). Built only when a report is
written, from the flight recorder (each entry's creation time and issuing thread) and the
training thread's timeline of counters (timeline.py); nothing of it travels in heartbeats."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .ledger import Ledger, describe_entry, signature
from .records import SeqEntry
from .timeline import LOOP, Timeline, mark_at

__all__ = ["recent", "add_lines", "KEEP"]

log = logging.getLogger("ddpguard.guard")

# Enough to hold a few training steps of a model with many gradient buckets.
KEEP = 48
# Loop-phase collectives of the training thread among the newest entries whose issuing line
# is looked up in the recorder's own stack traces (add_lines). The recorder symbolizes its
# whole ring for that (seconds, longer while the training thread spins in a poll), so only
# where a rank died (the one alignment that names a collective its rank has left behind,
# align.extra_before_death), after the first report is written; a waiting rank's line is on
# its stack.
LINES_FOR = 8


def recent(ledger: Ledger, timeline: Timeline, main_ident: int | None, keep: int = KEEP,
           site_for: Callable[[int, int], str | None] | None = None) -> list[SeqEntry]:
    """The newest `keep` collectives of this rank, oldest first; [] without the recorder.
    `site_for(created_ns, thread)` names the line that issued each (issued.IssueSites)."""
    if not ledger.available:
        return []
    try:
        origins = ledger.origins()[-keep:]
    except Exception as exc:  # a report without the alignment is still a report
        log.debug("flight recorder entries unreadable: %s", exc)
        return []
    marks = timeline.snapshot()
    # Python threads other than the training thread, by ident. A collective from a thread
    # Python does not know (autograd's device threads run DDP's gradient all-reduce on GPUs)
    # belongs to the training thread's work.
    names = {t.ident: t.name for t in threading.enumerate()
             if t.ident != main_ident and not isinstance(t, threading._DummyThread)}
    out: list[SeqEntry] = []
    for e, created, tid in origins:
        m = mark_at(marks, created)
        out.append({
            "g": str(e[0]), "seq": int(e[1]), "op": str(e[2]), "sig": repr(signature(e)),
            "desc": describe_entry(e), "done": bool(e[5]),
            "phase": m.phase if m else LOOP, "epoch": m.epoch if m else 0,
            "batches": m.batches if m else 0, "fwd": m.forwards if m else 0,
            "tfwd": m.train_forwards if m else 0, "bwd": m.backwards if m else 0,
            "steps": m.steps if m else 0, "thread": names.get(tid, ""),
            "line": site_for(created, tid) if site_for is not None else None})
    return out


def add_lines(ledger: Ledger, entries: list[SeqEntry]) -> None:
    """The issuing line of the newest loop-phase collectives (those a rank's own code called:
    the ones an alignment may name after the rank has left them behind) that the rank's own
    notes (issued.py) left without one. The recorder's stack traces cost seconds the first
    time (symbolizing them imports torch._dynamo): read only where a line is missing."""
    wanted = {(e["g"], e["seq"]) for e in entries[-LINES_FOR:]
              if e["phase"] == LOOP and not e.get("line")}
    if not wanted:
        return
    try:
        found: dict[tuple[str, int], Any] = ledger.frames_for(wanted)
    except Exception as exc:
        log.debug("no recorder stack traces: %s", exc)
        return
    for e in entries:
        where = found.get((e["g"], e["seq"]))
        if where:
            e["line"] = str(where)
