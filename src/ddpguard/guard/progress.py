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

from .stacks import is_library_file

__all__ = ["Progress", "LoaderState", "install_hooks", "uninstall_hooks", "UnevenBatchesError"]

log = logging.getLogger("ddpguard.guard")


class UnevenBatchesError(RuntimeError):
    """Ranks are about to iterate DataLoaders of different lengths: DDP would hang or, worse,
    average gradients of different steps. Raised on every rank before the first batch."""


class LoaderState:
    __slots__ = ("site", "length", "epoch", "batches", "total", "sampler_epoch", "sampler_ref",
                 "key", "watch")

    def __init__(self, site: str) -> None:
        self.site = site
        # Cross-rank identity of the loader object's current pass: its creation call chain,
        # which creation at that chain, and which pass over it (set at __iter__).
        self.key: str | None = None
        # While set, each batch asks the guard whether the ranks agree on this pass's length.
        self.watch = False
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
        # Set by the guard thread on proof that the loaders differ; raised on the next batch.
        self.abort: BaseException | None = None
        self.epoch = 0
        self.steps_epoch = 0
        self._epoch_site: str | None = None
        # Called from __iter__ with (state, loader); returns nothing or raises.
        self.on_epoch: Callable[[LoaderState, Any], None] | None = None
        self.on_batch: Callable[[LoaderState], None] | None = None
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
        try:
            st.length = len(loader)
        except TypeError:  # an IterableDataset without __len__: nothing to compare
            st.length = None
        # The first loader ever iterated is taken as the training loader: its iterations are
        # the epochs reported in heartbeats.
        if self._epoch_site is None:
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
        else:
            st.key = None
        _check_set_epoch(self, st, loader, site)
        if self.on_epoch is not None:
            self.on_epoch(st, loader)
        return st

    def batch(self, st: LoaderState) -> None:
        if self.abort is not None:
            err, self.abort = self.abort, None
            raise err
        if st.watch and self.on_batch is not None:
            self.on_batch(st)
        st.batches += 1
        st.total += 1
        self.batches += 1

    def step(self) -> None:
        self.steps += 1
        self.steps_epoch += 1

    def forward(self) -> None:
        self.forwards += 1

    def total(self) -> int:
        """One number that moves whenever this rank does any training work."""
        return self.batches + self.steps + self.forwards

    def snapshot(self) -> dict[str, Any]:
        ep = self.loaders.get(self._epoch_site) if self._epoch_site else None
        return {
            "epoch": self.epoch,
            "steps": self.steps,
            "steps_epoch": self.steps_epoch,
            "batches": self.batches,
            "forwards": self.forwards,
            "epoch_batches": ep.batches if ep else 0,
            "epoch_len": ep.length if ep else None,
            "loaders": {s: {"epoch": st.epoch, "batches": st.batches, "len": st.length,
                            "key": st.key}
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
    if (st.epoch > 0 and same_sampler and seen == sampler.epoch
            and site not in progress.warned_set_epoch):
        progress.warned_set_epoch.add(site)
        warnings.warn(
            f"ddpguard: the DistributedSampler of the DataLoader iterated at {site} is used for "
            f"a new epoch (iteration {st.epoch + 1}) without set_epoch(): every epoch repeats "
            f"the same order (epoch={sampler.epoch}). Call sampler.set_epoch(epoch) before "
            "iterating, or use ddpguard's samplers, which do it for you.",
            RuntimeWarning, stacklevel=4,
        )


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


def _user_chain(depth: int) -> str:
    """The user's frames (file:line, outermost first) that lead to this call, hashed short."""
    import hashlib

    f = sys._getframe(depth)
    parts = []
    while f is not None:
        if not is_library_file(f.f_code.co_filename):
            parts.append(f"{f.f_code.co_filename}:{f.f_lineno}")
        f = f.f_back  # type: ignore[assignment]
    text = ">".join(reversed(parts)) or "?"
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def install_hooks(progress: Progress) -> None:
    """Point the process-wide hooks at `progress` (installing them on first use)."""
    global _current
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

        @functools.wraps(orig_init)
        def guarded_init(self: Any, *args: Any, **kwargs: Any) -> None:
            orig_init(self, *args, **kwargs)
            prog = _current
            if prog is not None and type(self).__init__ is not None:
                with contextlib.suppress(Exception):
                    self._ddpguard_created = prog.loader_created(_user_chain(2))

        @functools.wraps(orig_fwd)
        def guarded_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            prog = _current
            if prog is not None:
                prog.forward()
            return orig_fwd(self, *args, **kwargs)

        def guarded_iter(self: Any) -> Any:
            it = orig_iter(self)
            prog = _current
            if prog is not None:
                st = prog.loader_iter(_caller_site(2), self)
                with contextlib.suppress(AttributeError):  # an iterator with __slots__
                    it._ddpguard_state = st  # type: ignore[attr-defined]
            return it

        def guarded_next(self: Any) -> Any:
            item = orig_next(self)
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
        dl.DataLoader.__iter__ = guarded_iter  # type: ignore[method-assign]
        dl._BaseDataLoaderIter.__next__ = guarded_next  # type: ignore[method-assign]
        _saved["iter"] = orig_iter
        _saved["next"] = orig_next
        _saved["step"] = optim_mod.register_optimizer_step_post_hook(on_step)


def uninstall_hooks(progress: Progress | None = None) -> None:
    """Restore torch's classes; with `progress`, only if it is still the current one."""
    global _current
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
        dl.DataLoader.__iter__ = _saved.pop("iter")  # type: ignore[method-assign]
        dl._BaseDataLoaderIter.__next__ = _saved.pop("next")  # type: ignore[method-assign]
        _saved.pop("step").remove()
