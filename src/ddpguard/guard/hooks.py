"""The process-wide hooks that feed a rank's Progress: class-level patches of torch's
DataLoader, its iterator, DistributedDataParallel.forward, autograd's backward and the
optimizers' step, installed once per process and pointed at whichever Progress is current.
Nothing here may raise into the training loop."""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .progress import LoaderState, Progress
from .stacks import is_library_file
from .workers import note_loader_sites

__all__ = ["install_hooks", "uninstall_hooks", "caller_site"]


_lock = threading.Lock()
_current: Progress | None = None
_saved: dict[str, Any] = {}


def caller_site(depth: int) -> str:
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

    note_loader_sites(dl)  # each loader's making line, which the pass states quote
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
                    # Its making line is workers.note_loader_sites' (`_ddpguard_made_at`).
                    self._ddpguard_created = prog.loader_created(_user_chain(2))

        @functools.wraps(orig_fwd)
        def guarded_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            prog = _current
            if prog is None:
                return orig_fwd(self, *args, **kwargs)
            # A training forward (a backward is due after it) or an evaluation one.
            line = None
            with contextlib.suppress(Exception):
                line = caller_site(2)
            prog.forward(bool(self.training and torch.is_grad_enabled()), line)
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
                st = prog.loader_iter(caller_site(2), self)
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
        _patch_lightning_log()
        _patch_lightning_should_stop()


# Where Lightning's LightningModule lives (the unified package and the older one).
_LIGHTNING = ("lightning.pytorch.core.module", "pytorch_lightning.core.module")


def _patch_lightning_log() -> None:
    """Note the user's line of each self.log(..., sync_dist=True): Lightning all-reduces the
    metric at the end of the step or epoch from its own code, where no user line is on the
    stack (a sync logged under `if self.trainer.is_global_zero:` hangs there)."""
    for name in _LIGHTNING:
        cls = getattr(sys.modules.get(name), "LightningModule", None)
        if cls is None or f"log:{name}" in _saved:
            continue
        _saved[f"log:{name}"] = (cls, cls.log)
        cls.log = _noting_synced_logs(cls.log)


def _noting_synced_logs(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def guarded_log(self: Any, *args: Any, **kwargs: Any) -> Any:
        prog = _current
        if prog is not None and kwargs.get("sync_dist"):
            with contextlib.suppress(Exception):
                prog.synced_log(caller_site(2))
        return orig(self, *args, **kwargs)
    return guarded_log


# Where Lightning's Trainer lives.
_TRAINERS = ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer")


def _patch_lightning_should_stop() -> None:
    """Note the user's line that sets `trainer.should_stop = True`: Lightning ends the epoch
    loop of that rank alone (it never reduces the flag), the others go on into their next
    collective, and by the time they wait the line is history."""
    for name in _TRAINERS:
        cls = getattr(sys.modules.get(name), "Trainer", None)
        if cls is None or f"stop:{name}" in _saved or "should_stop" in vars(cls):
            continue
        _saved[f"stop:{name}"] = (cls, None)
        cls.should_stop = property(_get_should_stop, _set_should_stop)


def _get_should_stop(trainer: Any) -> Any:
    return trainer.__dict__.get("should_stop", False)


def _set_should_stop(trainer: Any, value: Any) -> None:
    trainer.__dict__["should_stop"] = value
    prog = _current
    if prog is not None and value:
        with contextlib.suppress(Exception):
            f = sys._getframe(1)  # the assignment's own line (Lightning's callbacks: skipped)
            if not is_library_file(f.f_code.co_filename):
                prog.stop_request(f"{f.f_code.co_filename}:{f.f_lineno}")


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
        for key in [k for k in _saved if k.startswith("log:")]:
            cls, orig = _saved.pop(key)
            cls.log = orig
        for key in [k for k in _saved if k.startswith("stop:")]:
            cls, _ = _saved.pop(key)
            del cls.should_stop  # the instances' own values show through again
