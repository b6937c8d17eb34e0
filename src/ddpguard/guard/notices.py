"""The one line the judge prints when ranks have waited long for a rank that is still working:
who waits, where, and what the others are doing, after `notice_after` seconds, then 2x, 4x, ...
Never a reason to stop; only so that a person watching the log knows the guard saw it."""

from __future__ import annotations

from collections.abc import Mapping

from . import channel
from .heartbeat import PeerView
from .ledger import describe_entry, first_pending
from .rules import notice_due

__all__ = ["Notices", "LIFE_WORDS"]

LIFE_WORDS = {"progress": "last sign of life: batches, steps or collectives",
              "io": "last sign of life: reading or writing data",
              "stack": "last sign of life: its code moving between functions",
              "cpu": "last sign of life: computing inside one call",
              "threads": "last sign of life: work on another of its threads",
              "children": "last sign of life: work in its child processes",
              "socket": "last sign of life: bytes moving on a socket it reads or writes",
              "start": "no sign of life since the guard started"}


class Notices:
    def __init__(self, first: float, no_life: float) -> None:
        self.first = first
        self.no_life = no_life
        self.printed = 0

    def maybe(self, views: Mapping[int, PeerView]) -> None:
        """The judge's one line when ranks have waited long for a rank that is still
        working: about the lowest waiting rank, then after 2x, 4x, ... as long."""
        waiting = sorted(r for r, v in views.items() if v.get("blocked") and not v.get("gone"))
        if not waiting:
            self.printed = 0
            return
        r0 = waiting[0]
        v0 = views[r0]
        waited = float(v0.get("blocked_for", 0.0))
        if not notice_due(waited, self.first, self.printed):
            return
        self.printed += 1
        busy = [f"rank {r} is at {hb.get('where')} ("
                f"{LIFE_WORDS.get(hb.get('life', ''), hb.get('life'))}, "
                f"{hb.get('quiet', 0.0):.1f} s ago)"
                for r, hb in sorted(views.items()) if not hb.get("blocked")
                and hb.get("state") == "running" and not hb.get("gone")]
        first = first_pending(v0.get("pending") or [])
        what = f"in {describe_entry(first)}" if first else v0.get("doing", "waiting")
        channel.write(f"ddpguard: rank {r0} has waited {waited:.0f} s {what} at "
                      f"{v0.get('where')}; {'; '.join(busy) or 'the other ranks are busy'}. "
                      "The guard keeps waiting while it shows signs of life (it stops after "
                      f"{self.no_life:.0f} s without any).")
