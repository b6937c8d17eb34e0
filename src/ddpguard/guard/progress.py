"""In-process progress counters (the hooks that feed them are in hooks.py).

The hot path costs one Python call per batch and per optimizer step: counters are plain
attributes updated on the training thread; the guard's own thread reads and publishes them.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from .heartbeat import Heartbeat
from .loops import is_loop_head
from .timeline import BACKWARD, FORWARD, LOOP, Timeline

__all__ = ["Progress", "LoaderState", "UnevenBatchesError"]

log = logging.getLogger("ddpguard.guard")


class UnevenBatchesError(RuntimeError):
    """Kept for scripts that catch it: the guard no longer raises it. Ranks whose loaders
    differ in length get a notice; a stop comes only with proof of a hang (docs/guard.md)."""


# Ended passes kept per `for` site: the current one and the few before it (a rank that ran
# out starts its next pass while a peer still waits in the previous one).
DONE_KEPT = 3
# Lines with forwards through the wrapper that are counted (a program has a handful).
FORWARD_LINES_KEPT = 16


class LoaderState:
    __slots__ = ("site", "length", "epoch", "batches", "total", "sampler_epoch", "sampler_ref",
                 "key", "at", "end", "seq0", "done", "drop", "short", "head", "repeat")

    def __init__(self, site: str) -> None:
        self.site = site
        # Whether the site's line iterates (a `for`, a comprehension); a line that does not
        # takes a look at one batch (`next(iter(loader))`) or steps an iterator by hand.
        self.head = _loop_head(site)
        # A repeated sampler order seen at a line that is no loop head: said once the pass
        # draws a second batch (a one-batch peek before set_epoch is not an epoch).
        self.repeat: str | None = None
        # Cross-rank identity of the loader object's current pass: its creation call chain,
        # which creation at that chain, and which pass over it (set at __iter__).
        self.key: str | None = None
        # The line that created the loader (file:line), for reports and notices.
        self.at: str | None = None
        # How the current pass ended: "" still open, "stop" (its iterator raised
        # StopIteration: the rank has no batch left), "drop" (the iterator was dropped
        # early: a `break`).
        self.end = ""
        # Per process group, the last collective enqueued when the pass began: a collective
        # with a higher number was issued during the pass (empty without the ledger).
        self.seq0: dict[str, int] = {}
        # Ended passes at this site, newest last: [key, length, batches].
        self.done: list[list[Any]] = []
        # The first pass at this site left before its end ([pass, batches, length]): a
        # `break` epochs ago that made this rank leave early is long out of `done`.
        self.short: list[int] | None = None
        # A weak reference to the pass's iterator, whose callback marks the pass dropped.
        self.drop: Any = None
        self.length: int | None = None
        self.epoch = -1  # iterations started at this site
        self.batches = 0  # batches drawn in the current iteration
        self.total = 0
        self.sampler_epoch: int | None = None
        # A weak reference, not id(): a new sampler can be given a freed one's id.
        self.sampler_ref: Callable[[], Any] | None = None


class Progress:
    """What this rank has done so far; written by the training thread only."""

    def __init__(self) -> None:
        self.loaders: dict[str, LoaderState] = {}
        self.steps = 0
        self.batches = 0
        self.forwards = 0
        # For the report's alignment of the ranks' collectives (timeline.py, align.py).
        self.train_forwards = 0
        # Forwards through the wrapper per user line: a forward some ranks run and others do
        # not (a look at the predictions on rank 0) is named by its line.
        self.forward_lines: dict[str, int] = {}
        # Lightning's self.log(..., sync_dist=True) per user line: Lightning all-reduces the
        # metric later, from its own code, on every rank that logged it.
        self.synced_logs: dict[str, int] = {}
        self.stop_requests: dict[str, int] = {}  # user line -> trainer.should_stop = True
        self.backwards = 0
        self.timeline = Timeline()
        self.epoch = 0
        self.steps_epoch = 0
        self._epoch_site: str | None = None
        # Called from __iter__ with (state, loader); never raises into the training loop.
        self.on_epoch: Callable[[LoaderState, Any], None] | None = None
        self.warned_set_epoch: set[str] = set()
        self.created: dict[str, int] = {}

    def loader_created(self, chain: str) -> str:
        """A key for a new DataLoader that is the same on every rank that runs the same code:
        the user call chain that built it and how many loaders that chain built before."""
        n = self.created.get(chain, 0)
        self.created[chain] = n + 1
        return f"{chain}#{n}"

    def loader_iter(self, site: str, loader: Any) -> LoaderState:
        st = self.loaders.get(site)
        if st is None:
            st = self.loaders[site] = LoaderState(site)
        st.epoch += 1
        st.batches = 0
        st.end = ""
        st.seq0 = {}
        try:
            st.length = len(loader)
        except TypeError:  # an IterableDataset without __len__: nothing to compare
            st.length = None
        # The first loader ever iterated is taken as the training loader: its iterations are
        # the epochs reported in heartbeats.
        if self._epoch_site is None or (st.head and not self.loaders[self._epoch_site].head):
            self._epoch_site = site
        if site == self._epoch_site:
            self.epoch = st.epoch
            self.steps_epoch = 0
        created = getattr(loader, "_ddpguard_created", None)
        if created is not None:
            n = getattr(loader, "_ddpguard_passes", 0)
            with contextlib.suppress(AttributeError):
                loader._ddpguard_passes = n + 1
            st.key = f"{created}/{n}"
            st.at = getattr(loader, "_ddpguard_made_at", None)
        else:
            st.key = st.at = None
        _check_set_epoch(self, st, loader, site)
        if self.on_epoch is not None:
            self.on_epoch(st, loader)
        return st

    def batch(self, st: LoaderState) -> None:
        if st.repeat is not None and st.batches >= 1:
            warnings.warn(st.repeat, RuntimeWarning, stacklevel=3)
            st.repeat = None
        st.batches += 1
        st.total += 1
        self.batches += 1
        self.timeline.mark(self, LOOP)

    def pass_ended(self, st: LoaderState, key: str | None, how: str) -> None:
        """The pass `key` at this site ended: "stop" (no batch left) or "drop" (left early).
        A dropped iterator of an older pass (the site has moved on) changes nothing."""
        if st.key != key or st.end:
            return
        st.end = how
        if (how == "drop" and st.short is None and st.length is not None
                and st.batches < st.length):
            st.short = [st.epoch, st.batches, st.length]
        if how == "stop" and key is not None:
            st.done = [*st.done[-(DONE_KEPT - 1):], [key, st.length, st.batches]]

    def step(self) -> None:
        self.steps += 1
        self.steps_epoch += 1
        self.timeline.mark(self, LOOP)

    def forward(self, train: bool = False, line: str | None = None) -> None:
        self.forwards += 1
        self.train_forwards += train
        if line is not None and (line in self.forward_lines
                                 or len(self.forward_lines) < FORWARD_LINES_KEPT):
            self.forward_lines[line] = self.forward_lines.get(line, 0) + 1
        self.timeline.mark(self, FORWARD)

    def synced_log(self, line: str) -> None:
        if line in self.synced_logs or len(self.synced_logs) < FORWARD_LINES_KEPT:
            self.synced_logs[line] = self.synced_logs.get(line, 0) + 1

    def stop_request(self, line: str) -> None:
        if line in self.stop_requests or len(self.stop_requests) < FORWARD_LINES_KEPT:
            self.stop_requests[line] = self.stop_requests.get(line, 0) + 1

    def forward_done(self) -> None:
        self.timeline.mark(self, LOOP)

    def backward(self) -> None:
        self.backwards += 1
        self.timeline.mark(self, BACKWARD)

    def backward_done(self) -> None:
        self.timeline.mark(self, LOOP)

    def total(self) -> int:
        """One number that moves whenever this rank does any training work."""
        return self.batches + self.steps + self.forwards

    def snapshot(self) -> Heartbeat:
        """The progress keys of this rank's heartbeat."""
        ep = self.loaders.get(self._epoch_site) if self._epoch_site else None
        return {
            "epoch": self.epoch,
            "steps": self.steps,
            "steps_epoch": self.steps_epoch,
            "batches": self.batches,
            "forwards": self.forwards,
            "train_forwards": self.train_forwards,
            "forward_lines": dict(self.forward_lines),
            "synced_logs": dict(self.synced_logs),
            "stop_requests": dict(self.stop_requests),
            "backwards": self.backwards,
            "epoch_batches": ep.batches if ep else 0,
            "epoch_len": ep.length if ep else None,
            "loaders": {s: {"epoch": st.epoch, "batches": st.batches, "len": st.length,
                            "key": st.key, "at": st.at, "end": st.end, "seq0": st.seq0,
                            "done": st.done, "short": st.short}
                        for s, st in self.loaders.items()},
        }


def _check_set_epoch(progress: Progress, st: LoaderState, loader: Any, site: str) -> None:
    """torch's DistributedSampler reshuffles only when set_epoch is called: iterating it again
    with the same epoch repeats last epoch's order on every rank."""
    from torch.utils.data.distributed import DistributedSampler

    sampler = getattr(loader, "sampler", None)
    if not isinstance(sampler, DistributedSampler):
        sampler = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
    if not isinstance(sampler, DistributedSampler) or not getattr(sampler, "shuffle", False):
        return
    seen = st.sampler_epoch
    # A loader re-created at the same line brings a fresh sampler: that is not a repeat.
    same_sampler = st.sampler_ref is not None and st.sampler_ref() is sampler
    st.sampler_epoch, st.sampler_ref = sampler.epoch, weakref.ref(sampler)
    st.repeat = None
    if (st.epoch > 0 and same_sampler and seen == sampler.epoch
            and site not in progress.warned_set_epoch):
        progress.warned_set_epoch.add(site)
        text = (f"ddpguard: the DistributedSampler of the DataLoader iterated at {site} is "
                f"used for a new epoch (iteration {st.epoch + 1}) without set_epoch(): every "
                f"epoch repeats the same order (epoch={sampler.epoch}). Call "
                "sampler.set_epoch(epoch) before iterating, or use ddpguard's samplers, which "
                "do it for you.")
        if st.head:
            warnings.warn(text, RuntimeWarning, stacklevel=4)
        else:
            st.repeat = text


def _loop_head(site: str) -> bool:
    """Is the line at `site` (file:line) a loop head? Unknown source counts as one."""
    import linecache

    path, _, num = site.rpartition(":")
    text = linecache.getline(path, int(num)) if num.isdigit() else ""
    return not text or is_loop_head(text)
