"""Each rank's recent history as lanes: contiguous segments of what its training thread did
(computing, waiting for a batch, inside a collective, exited), for the report's timeline."""

from __future__ import annotations

__all__ = ["Lanes", "MAX_SEGMENTS"]

MAX_SEGMENTS = 2000


class Lanes:
    """Segments [t0, t1, kind, label] in wall-clock seconds. Consecutive samples of the same
    kind merge (computing and loader ones keep their first label; collective ones merge only
    when they wait on the same thing), so a day of training stays a few thousand segments."""

    def __init__(self) -> None:
        self.segments: list[list[object]] = []

    def add(self, t: float, kind: str, label: str, since: float | None = None) -> None:
        """Extend the lane to `t`; a new segment starts at `since` when known (a wait is
        recognised `settle` seconds after it began), else at `t`."""
        if self.segments:
            last = self.segments[-1]
            same = last[2] == kind and (kind in ("computing", "loader") or last[3] == label)
            if same:
                last[1] = t
                return
            start = t if since is None else max(float(last[0]), min(since, t))  # type: ignore[arg-type]
            last[1] = start
            self.segments.append([start, t, kind, label])
        else:
            self.segments.append([t if since is None else min(since, t), t, kind, label])
        if len(self.segments) > MAX_SEGMENTS:
            # Keep the recent past: the end of a run is what a hang report is about.
            del self.segments[: MAX_SEGMENTS // 4]

    def export(self) -> list[list[object]]:
        return [list(s) for s in self.segments]
