"""Desync detection: ranks compare what they recorded for the same collective numbers.

A desync need not hang: a DDP buffer broadcast on one rank can pair with another library's
broadcast on the other, both 'complete', and the job dies later with a nonsense error (or
trains on mixed-up data). Every `digest_interval` rank 0 asks every rank for its ledger entries
in a window of sequence numbers that all ranks have completed; a rank whose own code raised
asks the same about its latest entries before the error is reported. Answers go through the
store; nothing here issues a collective.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from .config import GuardConfig
from .heartbeat import Heartbeat
from .ledger import Entry, Ledger, describe_entry, desync
from .rules import Decision
from .store import GuardStore

__all__ = ["Exchange"]

log = logging.getLogger("ddpguard.guard")
WINDOW = 32
SLOTS = ("dig/req", "dig/creq")

# (rank a, rank b, a's entry, b's entry): the first collective number two ranks disagree on.
Found = tuple[int, int, Entry, Entry]


class DigestRequest(TypedDict, total=False):
    """A request in a `dig/req` or `dig/creq` slot: every rank answers under `dig/<id>/<rank>`
    with its entries in the window (and where it issued the `frames` ones)."""

    id: str
    win: dict[str, list[int]]        # group -> [first seq, last seq]
    frames: list[list[Any]]          # [group, seq] whose issuing line is wanted


class DigestReply(TypedDict, total=False):
    entries: list[Entry]
    frames: list[list[Any]]          # [group, seq, 'file:line in func']


class _Round(TypedDict):
    """The judge's periodic request still waiting for answers."""

    id: str
    win: dict[str, list[int]]
    at: float
    ranks: list[int]


class Exchange:
    """Everything a rank needs to compare ledgers with its peers: its own ledger, the store,
    who it is, and the settings."""

    def __init__(self, store: GuardStore, ledger: Ledger, rank: int, world_size: int,
                 config: GuardConfig) -> None:
        self.store = store
        self.ledger = ledger
        self.rank = rank
        self.world_size = world_size
        self.config = config
        self._served: set[str] = set()
        self._open: _Round | None = None
        self._issued = 0
        self._last_hi: dict[str, int] = {}
        self._next = time.monotonic() + config.digest_interval

    # -- answering (every rank, guard thread) --------------------------------------------------

    def serve(self, control: dict[str, Any]) -> None:
        """Answer the desync requests found in this tick's control keys."""
        if not self.ledger.available:
            return
        for slot in SLOTS:
            req: DigestRequest | None = control.get(slot)  # from the store: may be anything
            if not isinstance(req, dict):
                continue
            rid = req.get("id")
            if not rid or rid in self._served:
                continue
            self._served.add(rid)
            self.answer(req)
            log.debug("answered %s %s", slot, rid)

    def answer(self, req: DigestRequest) -> None:
        win = {k: (int(v[0]), int(v[1])) for k, v in (req.get("win") or {}).items()}
        mine = [e for e in self.ledger.entries() if e[0] in win
                and win[e[0]][0] <= e[1] <= win[e[0]][1]]
        reply: DigestReply = {"entries": mine}
        want = {(str(p), int(s)) for p, s in req.get("frames") or []}
        if want:
            try:
                reply["frames"] = [[k[0], k[1], v] for k, v in
                                   self.ledger.frames_for(want).items()]
            except Exception as exc:
                log.debug("no recorder stack traces: %s", exc)
        self.store.set(f"dig/{req['id']}/{self.rank}", reply)

    # -- asking (rank 0 periodically, guard thread) ----------------------------------------------

    def check(self, peers: dict[int, Heartbeat]) -> Decision | None:
        """The judge's periodic comparison of every rank's recent collectives."""
        if not self.ledger.available:
            return None
        if self._open is not None:
            return self._collect_periodic(peers)
        if time.monotonic() < self._next:
            return None
        self._next = time.monotonic() + self.config.digest_interval
        ledgers: list[Mapping[str, Sequence[int]]] = [
            hb.get("ledger") or {} for hb in peers.values() if hb.get("state") == "running"]
        if len(ledgers) < self.world_size or any(not lg for lg in ledgers):
            return None
        common = set.intersection(*(set(lg) for lg in ledgers))
        win: dict[str, list[int]] = {}
        for pg in common:
            hi = min(int(lg[pg][1]) for lg in ledgers)
            if hi > self._last_hi.get(pg, -1):
                win[pg] = [max(0, hi - WINDOW + 1), hi]
                self._last_hi[pg] = hi
        if not win:
            return None
        self._issued += 1
        self._open = {"id": f"p{self._issued}", "win": win, "at": time.monotonic(),
                      "ranks": sorted(peers)}
        self.store.set("dig/req", {"id": self._open["id"], "win": win})
        return None

    def _collect_periodic(self, peers: dict[int, Heartbeat]) -> Decision | None:
        req = self._open
        assert req is not None  # guarded by the caller
        got = self.store.get_many([f"dig/{req['id']}/{r}" for r in req["ranks"]],
                                    partial=False)
        if len(got) < len(req["ranks"]):
            if time.monotonic() - req["at"] > 10 * self.config.heartbeat_interval:
                self._open = None  # a rank is busy or gone; the next round will tell
            return None
        self._open = None
        for key in got:
            self.store.delete(key)
        found = desync({int(k.rsplit("/", 1)[1]): v["entries"] for k, v in got.items()})
        if found is None:
            return None
        return Decision("desync", self.describe(found, self.frames(found)),
                        (found[0], found[1]))

    # -- the failure paths ------------------------------------------------------------------------

    def frames(self, found: Found, wait: float = 8.0
               ) -> dict[int, str]:
        """Ask the two ranks where they issued the two entries (their recorders' stacks)."""
        ra, rb, ea, eb = found
        rid = f"f{self.rank}-{time.monotonic_ns()}"
        req: DigestRequest = {"id": rid, "win": {ea[0]: [ea[1], ea[1]]},
                              "frames": [[ea[0], ea[1]]]}
        self.store.set("dig/creq", req)
        out: dict[int, str] = {}
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and len(out) < 2:
            if self.rank in (ra, rb) and rid not in self._served:
                self._served.add(rid)
                self.answer(req)
            got = self.store.get_many([f"dig/{rid}/{r}" for r in (ra, rb)])
            for k, v in got.items():
                r = int(k.rsplit("/", 1)[1])
                for p, s, where in v.get("frames") or []:
                    if (p, s) == (ea[0], ea[1]):
                        out[r] = where
                out.setdefault(r, "?")
            time.sleep(0.1)
        return out

    @staticmethod
    def describe(found: Found, where: dict[int, str]) -> str:
        ra, rb, ea, eb = found
        return (f"collective #{ea[1]} of group {ea[0]} differs between ranks: rank {ra} ran "
                f"{describe_entry(ea)} at {where.get(ra, '?')}, rank {rb} ran "
                f"{describe_entry(eb)} at {where.get(rb, '?')}. The ranks issue different "
                "collectives in different orders; data exchanged from here on belongs to "
                "neither (a DDP buffer broadcast on some ranks only, or a collective inside a "
                "rank-conditional branch).")

    def _gather(self, base: str, wait: float) -> dict[int, list[Entry]]:
        """The other ranks' entries under `base/<rank>`, as many as arrive within `wait` s
        (the failure path only)."""
        others = [r for r in range(self.world_size) if r != self.rank]
        deadline = time.monotonic() + wait
        got: dict[str, Any] = {}
        pause = 0.02
        while time.monotonic() < deadline:
            got = self.store.get_many([f"{base}/{r}" for r in others])
            if len(got) == len(others):
                break
            time.sleep(pause)
            pause = min(0.25, pause * 2)
        return {int(k.rsplit("/", 1)[1]): v["entries"] for k, v in got.items()}

    def at_exit(self, wait: float = 2.0) -> str | None:
        """Every rank leaving cleanly publishes its last entries; rank 0 compares them (one
        read of W keys, not W reads each) and says what it found. A rank named in a desync
        stays until the report is written, so its guard thread can say where it issued its
        collective."""
        if not self.ledger.available:
            return None
        mine = self.ledger.entries()[-WINDOW:]
        self.store.set(f"dig/final/{self.rank}", {"entries": mine})
        n = self.store.add("dig/final/count", 1)
        deadline = time.monotonic() + wait
        if self.rank != 0:
            verdict = self._await_key("dig/final/verdict", deadline + 1.0)
            found = (verdict or {}).get("found")
            if found and self.rank in found:
                self._await_key("reported", time.monotonic() + 8.0)
            return None
        pause = 0.02
        while n < self.world_size and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(0.2, pause * 2)
            n = self.store.add("dig/final/count", 0)
        digests = {int(k.rsplit("/", 1)[1]): v["entries"] for k, v in self.store.get_many(
            [f"dig/final/{r}" for r in range(self.world_size)]).items()}
        digests[self.rank] = mine
        result = desync(digests)
        self.store.set("dig/final/verdict", {"found": list(result[:2]) if result else None})
        if result is None:
            return None
        return self.describe(result, self.frames(result, wait=4.0))

    def _await_key(self, key: str, deadline: float) -> Any:
        pause = 0.02
        while time.monotonic() < deadline:
            got = self.store.get_many([key]).get(key)
            if got is not None:
                return got
            time.sleep(pause)
            pause = min(0.2, pause * 2)
        return None

    def on_crash(self, wait: float = 3.0) -> str | None:
        """From the training thread of a rank whose code raised: did the ranks desync just
        before? Returns the explanation, or None."""
        if not self.ledger.available:
            return None
        try:
            mine = self.ledger.entries()
            win: dict[str, list[int]] = {}
            for e in mine[-WINDOW:]:
                lo, hi = win.get(e[0], [e[1], e[1]])
                win[e[0]] = [min(lo, e[1]), max(hi, e[1])]
            if not win:
                return None
            rid = f"c{self.rank}-{time.monotonic_ns()}"
            self.store.set("dig/creq", {"id": rid, "win": win})
            digests = self._gather(f"dig/{rid}", wait)
            digests[self.rank] = [e for e in mine if e[0] in win and win[e[0]][0] <= e[1]]
            found = desync(digests)
            if found is None:
                return None
            return self.describe(found, self.frames(found))
        except Exception as exc:  # a report without this is still a report
            log.debug("desync check after a crash failed: %s", exc)
            return None
