"""Loader lengths across ranks: the training thread publishes each DataLoader pass's length
(one store write) and, on the first batches of the pass, compares without waiting; the guard
thread keeps comparing afterwards. Different lengths are proof of a coming hang once the
ranks issue collectives during the pass."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .config import GuardConfig
from .ledger import Ledger, Status
from .progress import LoaderState, Progress, UnevenBatchesError
from .rules import Decision
from .store import GuardStore

__all__ = ["LengthCheck", "WATCH_BATCHES"]

log = logging.getLogger("ddpguard.guard")
# Batches of a pass during which the training thread itself compares loader lengths.
WATCH_BATCHES = 16


class LengthCheck:
    """Needs the store, the ledger (collectives issued so far), the training thread's
    progress, who this rank is, and the status the guard thread last read."""

    def __init__(self, store: GuardStore, ledger: Ledger, progress: Progress, rank: int,
                 world_size: int, config: GuardConfig, last_status: Callable[[], Status]
                 ) -> None:
        self.store = store
        self.ledger = ledger
        self.progress = progress
        self.rank = rank
        self.world_size = world_size
        self.config = config
        self.last_status = last_status
        # Set once the ranks are shown to differ: published in the heartbeat.
        self.mismatch: str | None = None
        self._new: list[tuple[str, int, int, str]] = []
        self._lengths: dict[str, tuple[int, int, str]] = {}
        self._watch: dict[str, list[Any]] = {}

    def on_pass(self, st: LoaderState, loader: Any) -> None:
        """Training thread, at __iter__: publish this pass's length (one store write)."""
        if not (self.config.check_lengths and st.key is not None and st.length is not None):
            return
        try:
            self.store.set(f"len/{st.key}/{self.rank}", st.length)
        except Exception as exc:  # the guard never breaks training by itself
            log.debug("loader length not published: %s", exc)
            return
        self._watch[st.key] = [st.length, self.enqueued(fresh=True), st.site, WATCH_BATCHES]
        st.watch = True

    def on_batch(self, st: LoaderState) -> None:
        """Training thread, on the first batches of a pass: compare lengths without waiting;
        raise before the hang once the ranks differ and collectives run in this pass."""
        w = self._watch.get(st.key or "")
        if w is None:
            st.watch = False
            return
        length, q0, site, left = w
        try:
            got = self.store.get_many([f"len/{st.key}/{r}" for r in range(self.world_size)])
        except Exception:
            got = {}
        if len(got) == self.world_size:
            lengths = [int(got[f"len/{st.key}/{r}"]) for r in range(self.world_size)]
            if len(set(lengths)) == 1:
                self._watch.pop(st.key or "", None)
                st.watch = False
                return
            if self.enqueued(fresh=True) > q0:
                self._watch.pop(st.key or "", None)
                st.watch = False
                decision = self.uneven(lengths, site)
                err, self.progress.abort = self.progress.abort, None
                raise err or UnevenBatchesError(decision.reason)
        w[3] = left - 1
        if w[3] <= 0:
            # Hand over to the guard thread, which keeps comparing at its own pace.
            self._watch.pop(st.key or "", None)
            st.watch = False
            self._new.append((st.key or "", length, q0, site))

    def enqueued(self, fresh: bool = False) -> int:
        """Collectives this rank has issued so far (optimizer steps without the ledger)."""
        status = self.last_status()
        if fresh and self.ledger.available:
            try:
                status = self.ledger.status()
            except Exception:
                status = self.last_status()
        return sum(q for q, _ in status.values()) if status else self.progress.steps

    def check(self) -> Decision | None:
        """Guard thread: the passes handed over by the training thread."""
        while self._new:
            key, length, q0, site = self._new.pop(0)
            self._lengths[key] = (length, q0, site)
        for key, (_, q0, site) in list(self._lengths.items()):
            got = self.store.get_many([f"len/{key}/{r}" for r in range(self.world_size)])
            if len(got) < self.world_size:
                continue
            lengths = [int(got[f"len/{key}/{r}"]) for r in range(self.world_size)]
            if len(set(lengths)) == 1:
                del self._lengths[key]
                continue
            # Different lengths alone can be fine (a loop with no collective in it); once this
            # rank has issued a collective during the pass, the pass will end in a hang.
            if self.enqueued() <= q0:
                continue
            del self._lengths[key]
            return self.uneven(lengths, site)
        return None

    def uneven(self, lengths: list[int], site: str) -> Decision:
        counts = ", ".join(f"rank {r}: {n}" for r, n in enumerate(lengths))
        self.mismatch = (f"the DataLoader iterated at {site} has a different number of batches "
                      f"on each rank ({counts}); the ranks already issue collectives in this "
                      "pass, so the one with fewer batches will leave it while the others "
                      "wait in their next collective.")
        self.progress.abort = UnevenBatchesError(
            f"ddpguard, rank {self.rank}: ranks have different numbers of batches: {counts} "
            f"(DataLoader iterated at {site}). Use drop_last=True in the sampler and the "
            "DataLoader, filter before sharding, or ddpguard.EvenSampler.")
        return Decision("uneven_batches", self.mismatch)
