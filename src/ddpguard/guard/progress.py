"""In-process progress counters and the hooks that feed them.

The hot path costs one Python call per batch and per optimizer step: counters are plain
attributes updated on the training thread; the guard's own thread reads and publishes them.
Hooks are installed on classes (DataLoader, its iterator, torch.optim), so they also see
unmodified scripts.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from .heartbeat import Heartbeat
from .loops import is_loop_head
from .stacks import is_library_file
from .timeline import BACKWARD, FORWARD, LOOP, Timeline

__all__ = ["Progress", "LoaderState", "install_hooks", "uninstall_hooks", "UnevenBatchesError"]

log = logging.getLogger("ddpguard.guard")


class UnevenBatchesError(RuntimeError):
    """Kept for scripts that catch it: the guard no longer raises it. Ranks whose loaders
    differ in length get a notice; a stop comes only with proof of a hang (docs/guard.md)."""


# Ended passes kept per `for` site: the current one and the few before it (a rank that ran
# out starts its next pass while a peer still waits in the previous one).
DONE_KEPT = 3


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
            st.at = getattr(loader, "_ddpguard_created_at", None)
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

    def forward(self, train: bool = False) -> None:
        self.forwards += 1
        self.train_forwards += train
        self.timeline.mark(self, FORWARD)

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


# ---------------------------------------------------------------------------------------------
# hooks (class-level patches, installed once per process; they feed whichever Progress is set)

_lock = threading.Lock()
_current: Progress | None = None
_saved: dict[str, Any] = {}


def _caller_site(depth: int) -> str:
    """file:line of the loop that iterates the loader. Skips torch, ddpguard and installed
    libraries (tqdm wraps a loader and iterates it from its own file; every wrapped loader
    would otherwise share tqdm's line). When every frame is library code (a script that lives
    inside a package, such as the demo), the first frame outside torch's data package is used."""
    f = sys._getframe(depth)
    fallback = None
    while f is not None:
        name = f.f_code.co_filename
        if fallback is None and "torch/utils/data" not in name.replace("\\", "/"):
            fallback = f
        if not is_library_file(name):
            break
        f = f.f_back  # type: ignore[assignment]
    f = f or fallback
    if f is None:
        return "?:0"
    return f"{f.f_code.co_filename}:{f.f_lineno}"


def _user_chain(depth: int) -> tuple[str, str | None]:
    """The user's frames (file:line, outermost first) that lead to this call, hashed short,
    and the innermost of them (the line that made the call)."""
    import hashlib

    f = sys._getframe(depth)
    parts = []
    while f is not None:
        if not is_library_file(f.f_code.co_filename):
            parts.append(f"{f.f_code.co_filename}:{f.f_lineno}")
        f = f.f_back  # type: ignore[assignment]
    text = ">".join(reversed(parts)) or "?"
    return hashlib.sha1(text.encode()).hexdigest()[:12], (parts[0] if parts else None)


def _dropped(prog: Progress, st: LoaderState, key: str | None) -> Callable[[Any], None]:
    def on_drop(_ref: Any) -> None:
        prog.pass_ended(st, key, "drop")
    return on_drop


def install_hooks(progress: Progress) -> None:
    """Point the process-wide hooks at `progress` (installing them on first use)."""
    global _current
    import torch
    import torch.optim.optimizer as optim_mod
    from torch.utils.data import dataloader as dl

    with _lock:
        _current = progress
        if _saved:
            return
        from torch.nn.parallel import DistributedDataParallel as DDP

        orig_init = dl.DataLoader.__init__
        orig_iter = dl.DataLoader.__iter__
        orig_next = dl._BaseDataLoaderIter.__next__
        orig_fwd = DDP.forward
        orig_bwd = torch.autograd.backward

        @functools.wraps(orig_init)
        def guarded_init(self: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(self, *args, **kwargs)
            prog = _current
            if prog is not None and type(self).__init__ is not None:
                with contextlib.suppress(Exception):
                    chain, at = _user_chain(2)
                    self._ddpguard_created = prog.loader_created(chain)
                    self._ddpguard_created_at = at

        @functools.wraps(orig_fwd)
        def guarded_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            prog = _current
            if prog is None:
                return orig_fwd(self, *args, **kwargs)
            # A training forward (a backward is due after it) or an evaluation one.
            prog.forward(bool(self.training and torch.is_grad_enabled()))
            try:
                return orig_fwd(self, *args, **kwargs)
            finally:
                prog.forward_done()

        @functools.wraps(orig_bwd)
        def guarded_backward(*args: Any, **kwargs: Any) -> Any:
            prog = _current
            if prog is None:
                return orig_bwd(*args, **kwargs)
            prog.backward()
            try:
                return orig_bwd(*args, **kwargs)
            finally:
                prog.backward_done()

        def guarded_iter(self: Any) -> Any:
            it = orig_iter(self)
            prog = _current
            if prog is not None:
                st = prog.loader_iter(_caller_site(2), self)
                with contextlib.suppress(AttributeError):  # an iterator with __slots__
                    it._ddpguard_state = st  # type: ignore[attr-defined]
                with contextlib.suppress(TypeError):  # an iterator without weak references
                    # A `for` left by `break` drops its iterator: the pass is over for this
                    # rank although no StopIteration was seen.
                    st.drop = weakref.ref(it, _dropped(prog, st, st.key))
            return it

        def guarded_next(self: Any) -> Any:
            try:
                item = orig_next(self)
            except StopIteration:
                prog = _current
                st = getattr(self, "_ddpguard_state", None)
                if prog is not None and st is not None:
                    prog.pass_ended(st, st.key, "stop")
                raise
            prog = _current
            st = getattr(self, "_ddpguard_state", None)
            if prog is not None and st is not None:
                prog.batch(st)
            return item

        def on_step(opt: Any, args: Any, kwargs: Any) -> None:
            prog = _current
            if prog is not None:
                prog.step()

        dl.DataLoader.__init__ = guarded_init  # type: ignore[method-assign]
        DDP.forward = guarded_forward  # type: ignore[method-assign]
        _saved["init"] = orig_init
        _saved["fwd"] = orig_fwd
        torch.autograd.backward = guarded_backward  # Tensor.backward calls it by this name
        _saved["bwd"] = orig_bwd
        dl.DataLoader.__iter__ = guarded_iter  # type: ignore[method-assign]
        dl._BaseDataLoaderIter.__next__ = guarded_next  # type: ignore[method-assign]
        _saved["iter"] = orig_iter
        _saved["next"] = orig_next
        _saved["step"] = optim_mod.register_optimizer_step_post_hook(on_step)


def uninstall_hooks(progress: Progress | None = None) -> None:
    """Restore torch's classes; with `progress`, only if it is still the current one."""
    global _current
    import torch
    from torch.utils.data import dataloader as dl

    with _lock:
        if progress is not None and _current is not progress:
            return
        _current = None
        if not _saved:
            return
        from torch.nn.parallel import DistributedDataParallel as DDP

        dl.DataLoader.__init__ = _saved.pop("init")  # type: ignore[method-assign]
        DDP.forward = _saved.pop("fwd")  # type: ignore[method-assign]
        torch.autograd.backward = _saved.pop("bwd")
        dl.DataLoader.__iter__ = _saved.pop("iter")  # type: ignore[method-assign]
        dl._BaseDataLoaderIter.__next__ = _saved.pop("next")  # type: ignore[method-assign]
        _saved.pop("step").remove()
