"""The guard's per-tick protocol, linear in the world size.

Every rank writes its own heartbeat (one request) and reads the control keys in one
`multi_get`: the board, the stop trigger and the two desync-request slots. One rank, the
judge, also reads every heartbeat in one `multi_get`, runs the rules and rewrites the board.
That is 2W + 2 requests per tick for W ranks, against W(W + 2) when every rank read every
heartbeat (bench/guard_scale.py measures both).

The judge is rank 0 while its board keeps changing. If the board stops changing (the judge's
process died, froze, or cannot get the GIL), the next rank in order takes over after
`TAKEOVER` heartbeat intervals, the one after it after twice that, and so on, so exactly one
rank judges at a time in the common case and some rank always does. A judge that comes back
and finds another rank's board steps down.
"""

from __future__ import annotations

import time
from typing import Any

from . import channel
from .heartbeat import Heartbeat
from .store import GuardStore

__all__ = ["Board", "CONTROL", "TAKEOVER"]

CONTROL = ("board", "trigger", "dig/req", "dig/creq")
# Heartbeat intervals of an unchanged board before the next rank in line judges.
TAKEOVER = 4


class Board:
    def __init__(self, store: GuardStore, rank: int, world_size: int, interval: float) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.interval = interval
        self.judge = 0
        self._n = 0
        self._mark: tuple[int, int] = (-1, -1)
        self._changed_at = time.monotonic()

    def watch_from(self, now: float | None = None) -> None:
        """Start the takeover clock now (when the guard thread starts ticking), not at
        construction: waiting for slow peers to start must not look like a silent judge."""
        self._changed_at = time.monotonic() if now is None else now

    def await_peers(self, limit: float) -> None:
        """Every rank, at start: return once every rank's guard holds its store connection
        (or after `limit` s, with one line). Without this, a rank that finishes a short script
        could take the store (hosted by rank 0 outside torchrun) down while a slower peer is
        still connecting, and that peer would fail at start-up."""
        n = self.store.add("started", 1)
        deadline = time.monotonic() + limit
        pause = 0.005
        while n < self.world_size and time.monotonic() < deadline:
            # Backing off keeps a thousand starting ranks from flooding the store.
            pause = min(0.25, pause * 2)
            time.sleep(pause)
            n = self.store.add("started", 0)
        if n < self.world_size:
            channel.write(f"ddpguard: guard on rank {self.rank}: only {n} of "
                          f"{self.world_size} ranks started a guard within {limit:.0f} s; start "
                          "every rank with the same guard setting")

    def create(self) -> None:
        """Every rank, at start: the control keys exist (empty) before anyone reads them."""
        self.store.create_empty(CONTROL)

    def poll(self, now: float | None = None) -> dict[str, Any]:
        """One round trip: the control keys that are set. Tracks whether the judge's board
        still changes."""
        now = time.monotonic() if now is None else now
        got = self.store.get_existing(CONTROL)
        board = got.get("board")
        if board:
            mark = (int(board.get("judge", 0)), int(board.get("n", 0)))
            if mark != self._mark:
                self._mark, self._changed_at = mark, now
                self.judge = mark[0]
        return got

    def judging(self, now: float | None = None) -> bool:
        """Is this rank the judge now (or its turn to take over a silent one)?"""
        now = time.monotonic() if now is None else now
        if self.judge == self.rank:
            return True
        distance = (self.rank - self.judge) % self.world_size
        return now - self._changed_at > TAKEOVER * self.interval * distance

    def publish(self, **extra: Any) -> None:
        """The judge's tick: rewrite the board so the others know it is alive."""
        self._n += 1
        self.judge = self.rank
        self._mark = (self.rank, self._n)
        self.store.set("board", {"judge": self.rank, "n": self._n, "t": time.time(), **extra})

    def heartbeats(self) -> dict[int, Heartbeat]:
        """The judge's read of every rank's heartbeat: one `check` and one `multi_get` when
        every rank has started its guard."""
        got = self.store.get_many([f"hb/{r}" for r in range(self.world_size)])
        return {int(k.rsplit("/", 1)[1]): v for k, v in got.items()}
