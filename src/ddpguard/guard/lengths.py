"""Loader lengths across ranks: a notice, never a stop by itself.

The training thread, at each DataLoader pass's start, publishes the pass's length (one store
write) and notes the ledger's position (so the rules can tell a collective issued during the
pass from one issued before it). Rank 0's guard thread compares the ranks' lengths at its own
pace (one store round trip per open pass and tick: the traffic stays linear in the world size)
and, when they differ, prints one line per loader for the whole job: which loader, the lengths,
and the ways to make them equal. Unequal lengths are legal when the program handles them
(torch's Join, a loop whose ranks agree on when to stop); the proof that one does not is
uneven.py's, from the ranks' states once a rank waits for one that ran out.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from . import channel
from .config import GuardConfig
from .ledger import Ledger
from .progress import LoaderState
from .store import GuardStore
from .uneven import counts_text, short_path_of

__all__ = ["LengthCheck", "notice_text"]

log = logging.getLogger("ddpguard.guard")
# Passes whose lengths are compared at once; an older one is dropped (some rank never
# iterated it, so there is nothing to compare).
KEPT = 16


def notice_text(site: str, at: str | None, lengths: Sequence[int | None]) -> str:
    made = f"created at {short_path_of(at)}, " if at else ""
    return (f"ddpguard: notice: the DataLoader ({made}iterated at {short_path_of(site)}) has "
            f"a different number of batches on each rank ({counts_text(lengths)}). Not a stop "
            "by itself: torch's Join or a loop whose ranks agree on when to stop handles it; "
            "the guard stops only if a rank that ran out leaves others waiting in a "
            "collective. To make them equal: ddpguard.EvenSampler, drop_last=True on the "
            "sampler and the DataLoader, or torch.distributed.algorithms.Join.")


class LengthCheck:
    """Needs the store, the ledger (its position at each pass's start) and who this rank is."""

    def __init__(self, store: GuardStore, ledger: Ledger, rank: int, world_size: int,
                 config: GuardConfig) -> None:
        self.store = store
        self.ledger = ledger
        self.rank = rank
        self.world_size = world_size
        self.config = config
        # What the comparison found, published in the heartbeat (the last notice's text).
        self.mismatch: str | None = None
        # Passes handed over by the training thread: (key, site, creation line).
        self._new: list[tuple[str, str, str | None]] = []
        self._open: dict[str, tuple[str, str | None]] = {}
        self._told: set[str] = set()

    def on_pass(self, st: LoaderState, loader: Any) -> None:
        """Training thread, at __iter__: note the ledger's position and publish this pass's
        length (one store write). Never raises into the training loop."""
        if not self.config.check_lengths:
            return
        if self.ledger.available:
            try:
                st.seq0 = {g: q for g, (q, _) in self.ledger.status().items()}
            except Exception as exc:  # the guard never breaks training by itself
                log.debug("ledger position not read: %s", exc)
        if st.key is None or st.length is None:
            return
        try:
            self.store.set(f"len/{st.key}/{self.rank}", st.length)
        except Exception as exc:
            log.debug("loader length not published: %s", exc)
            return
        if self.rank == 0:
            self._new.append((st.key, st.site, st.at))

    def check(self) -> None:
        """Guard thread (rank 0): compare the passes whose lengths every rank has published;
        print the notice once per loader."""
        while self._new:
            key, site, at = self._new.pop(0)
            self._open[key] = (site, at)
        while len(self._open) > KEPT:
            del self._open[next(iter(self._open))]
        for key, (site, at) in list(self._open.items()):
            # All or nothing: one round trip while some rank has not reached the pass yet.
            got = self.store.get_many([f"len/{key}/{r}" for r in range(self.world_size)],
                                      partial=False)
            if len(got) < self.world_size:
                continue
            del self._open[key]
            lengths = [int(got[f"len/{key}/{r}"]) for r in range(self.world_size)]
            if len(set(lengths)) == 1:
                continue
            # One notice per loader (its creation chain), however many passes or re-creations.
            chain = key.split("#", 1)[0]
            if chain in self._told:
                continue
            self._told.add(chain)
            self.mismatch = notice_text(site, at, lengths)
            channel.write(self.mismatch)
