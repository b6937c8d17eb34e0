"""Which loader each DataLoader worker process serves, so that a killed worker is named by the
script's line that iterates its loader.

torch reports a dead worker from its SIGCHLD handler, wherever the training thread happens to
be (an all_gather deep in the model), and by the time the error reaches the top of the rank
the loader's iterator (and its workers) are gone. So while the guard runs, each
multi-process iterator notes its workers' pids and the user line that started it (the `for`
over the loader): once per pass, nothing per batch. The cgroup's OOM-kill count is read when
the guard starts, so a SIGKILL can be told apart later.
"""

from __future__ import annotations

import collections
import functools
import signal
import sys
import threading
from typing import Any

from . import procs
from .stacks import is_library_file

__all__ = ["install", "uninstall", "site_of", "made_at", "note_loader_sites", "exit_signal",
           "dead_worker", "oom_counts"]

_lock = threading.Lock()
_sites: collections.OrderedDict[int, str] = collections.OrderedDict()
_made: dict[int, str] = {}  # worker pid -> 'file:line' that made its DataLoader (pids in _sites)
_saved: dict[str, Any] = {}
_oom0: list[int | None] = []
_KEEP = 256  # pids remembered (a few loaders x workers x passes)
# The latest workers' process objects: torch may notice a death by polling ("exited
# unexpectedly", no signal named) and the object still holds the status it reaped. Few, since
# each holds a descriptor until it is freed.
_procs: collections.OrderedDict[int, Any] = collections.OrderedDict()
_KEEP_PROCS = 16


def _user_site(depth: int) -> str | None:
    """'file:line in func' of the first frame outside torch, the standard library, installed
    packages and ddpguard: the `for` that iterates the loader (or the call that builds the
    iterator)."""
    f: Any = sys._getframe(depth)
    while f is not None:
        if not is_library_file(f.f_code.co_filename):
            return f"{f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return None


def _note(workers: list[Any], site: str, made: str | None = None) -> None:
    with _lock:
        for w in workers:
            _sites[w.pid] = site
            if made:
                _made[w.pid] = made
            _sites.move_to_end(w.pid)
            _procs[w.pid] = w
            _procs.move_to_end(w.pid)
        while len(_sites) > _KEEP:
            _made.pop(_sites.popitem(last=False)[0], None)
        while len(_procs) > _KEEP_PROCS:
            _procs.popitem(last=False)


def install() -> None:
    """Wrap torch's multi-process loader iterator (idempotent) and read the OOM-kill count."""
    if not _oom0:
        _oom0.append(procs.oom_kills())
    if _saved:
        return
    try:
        from torch.utils.data import dataloader as dl
    except ImportError:
        return
    note_loader_sites(dl)
    cls = dl._MultiProcessingDataLoaderIter
    orig_init = cls.__init__

    @functools.wraps(orig_init)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        try:
            site = _user_site(2)
            procs = [w for w in getattr(self, "_workers", ()) if w.pid]
            loader = args[0] if args else kwargs.get("loader")
            if site and procs:
                _note(procs, site, getattr(loader, "_ddpguard_made_at", None))
        except Exception:  # noqa: S110 (bookkeeping for a report must never break a loader)
            pass

    _saved["init"] = orig_init
    cls.__init__ = init  # type: ignore[method-assign]


def uninstall() -> None:
    if not _saved:
        return
    from torch.utils.data import dataloader as dl

    dl._MultiProcessingDataLoaderIter.__init__ = _saved.pop("init")  # type: ignore[method-assign]


def note_loader_sites(module: Any = None) -> None:
    """Wrap DataLoader.__init__ so each loader remembers the user line that made it, from the
    process's start: Lightning (and many scripts) build their loaders before the process group
    exists, when the guard's own hooks are not in place yet. Idempotent; one stack walk per
    loader made, nothing per batch."""
    if module is None:
        from torch.utils.data import dataloader as module
    cls = getattr(module, "DataLoader", None)
    if cls is None or getattr(cls.__init__, "__ddpguard_made__", False):
        return
    orig = cls.__init__

    @functools.wraps(orig)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        if getattr(self, "_ddpguard_made_at", None) is None:
            try:
                made = _made_line(self, sys._getframe(1), cls)
                if made:
                    self._ddpguard_made_at = made
            except Exception:  # noqa: S110 (bookkeeping for a report must never break a loader)
                pass

    init.__ddpguard_made__ = True  # type: ignore[attr-defined]
    cls.__init__ = init


def _made_line(loader: Any, f: Any, cls: type) -> str | None:
    """The user line that made `loader`. A framework that rebuilds the user's loader with its
    own sampler (Lightning's fit, accelerate's prepare) makes it in library code that holds
    the user's loader in a local: the rebuilt loader takes that loader's line."""
    while f is not None:
        if not is_library_file(f.f_code.co_filename):
            return f"{f.f_code.co_filename}:{f.f_lineno}"
        for value in f.f_locals.values():
            if value is not loader and isinstance(value, cls):
                made = getattr(value, "_ddpguard_made_at", None)
                if made:
                    return str(made)
        f = f.f_back
    return None


def made_at(pid: int) -> str | None:
    """'file:line' that made the DataLoader whose worker had `pid`, if known."""
    with _lock:
        return _made.get(pid)


def site_of(pid: int) -> str | None:
    """The line that iterated the loader whose worker had `pid`, if the guard saw it start."""
    with _lock:
        return _sites.get(pid)


def exit_signal(pid: int) -> str | None:
    """The signal that ended worker `pid` ('SIGKILL'), if the guard saw it start and its
    status is known; None otherwise."""
    with _lock:
        proc = _procs.get(pid)
    try:
        code = proc.exitcode if proc is not None else None
    except (ValueError, OSError):  # a closed process object
        return None
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def dead_worker() -> tuple[int, str] | None:
    """(pid, signal) of a recent worker killed by a signal other than the SIGTERM a loader's
    own shutdown sends: the cause of an error the training thread got while receiving from
    it (a connection reset in the middle of a batch), though torch did not name it."""
    with _lock:
        pids = list(reversed(_procs))
    for pid in pids:
        sig = exit_signal(pid)
        if sig is not None and sig != "SIGTERM":
            return pid, sig
    return None


def oom_counts() -> tuple[int | None, int | None]:
    """The cgroup's OOM-kill count when the guard started, and now (None: cannot tell)."""
    return (_oom0[0] if _oom0 else None), procs.oom_kills()
