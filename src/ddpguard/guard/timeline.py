"""When this rank's training counters changed, so that each collective of the flight recorder
can be placed in the training loop: in which batch, inside a DDP forward or a backward or in
the loop's own code, after how many forwards, backwards and optimizer steps (align.py compares
that across ranks when a report is written).

The training thread appends one small tuple per batch, forward, backward and optimizer step
(about half a microsecond each); the guard thread reads the ring only when it writes a report.
The recorder's entries carry their creation time (wall clock, ns), the marks carry theirs: an
entry belongs to the last mark made before it.
"""

from __future__ import annotations

import collections
import time
from typing import Any, NamedTuple

__all__ = ["Mark", "Timeline", "FORWARD", "BACKWARD", "LOOP"]

# Where the training thread is after a mark: inside a forward through the DDP wrapper, inside a
# backward, or in the loop's own code (between them, after a step, fetching a batch).
FORWARD, BACKWARD, LOOP = "forward", "backward", "loop"


class Mark(NamedTuple):
    t_ns: int
    phase: str
    epoch: int
    batches: int
    forwards: int
    train_forwards: int   # forwards in training mode with gradients on (a backward is due)
    backwards: int
    steps: int


class Timeline:
    """A ring of marks, newest last. 1,024 marks cover more than the recorder's 256 entries
    of a loop with one forward, one backward and one step per batch."""

    def __init__(self, keep: int = 1024) -> None:
        # Plain tuples on the hot path (a NamedTuple's constructor costs several times more);
        # Marks only when read.
        self.marks: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=keep)

    def mark(self, progress: Any, phase: str) -> None:
        p = progress
        self.marks.append((time.time_ns(), phase, p.epoch, p.batches, p.forwards,
                           p.train_forwards, p.backwards, p.steps))

    def snapshot(self) -> list[Mark]:
        """A copy the guard thread can read while the training thread appends."""
        for _ in range(5):
            try:
                return [Mark(*m) for m in list(self.marks)]
            except RuntimeError:  # appended to during the copy
                continue
        return []


def mark_at(marks: list[Mark], t_ns: int) -> Mark | None:
    """The last mark made at or before `t_ns` (marks in time order); None if none is."""
    lo, hi = 0, len(marks)
    while lo < hi:
        mid = (lo + hi) // 2
        if marks[mid].t_ns <= t_ns:
            lo = mid + 1
        else:
            hi = mid
    return marks[lo - 1] if lo else None
