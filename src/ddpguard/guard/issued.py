"""Where each collective was issued.

A rank that issues `all_reduce(..., async_op=True)` (or any collective on NCCL, whose host
returns at once) waits for it somewhere else: `Work.wait()`, a poll, a synchronise. Its stack
then shows the wait, not the line that issued the collective, and that line is the one a
report must name (it is the one under `if rank == 0:`). The flight recorder can symbolize its
own stack traces, but that takes seconds (far longer while the waiting thread spins on the
GIL). So while the guard runs, the collectives of `torch.distributed` note their caller's
file:line, their thread and a time window; an entry of the recorder is matched to its call by
the time it was created and the thread that created it.

Synchronous calls are noted too: a waiting rank's line is on its stack, but the collective a
rank issued under a rank test and got through (paired with a peer's different call at the same
number) is history by the time the ranks wait, and only its noted line can name it.
"""

from __future__ import annotations

import collections
import functools
import linecache
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .conditional import in_conditional
from .stacks import is_library_file
from .unwinding import describe

__all__ = ["IssueSites"]

_NAMES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce",
          "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
          "gather", "scatter", "barrier", "all_reduce_coalesced", "all_gather_coalesced")


def _caller(depth_limit: int = 64) -> str:
    """The user's line that called the collective: the first frame outside torch, the standard
    library, site-packages and the guard (a Lightning hook's line, not Lightning's), else the
    first outside torch and the guard."""
    f: Any = sys._getframe(2)
    first = None
    for _ in range(depth_limit):
        if f is None:
            break
        name = f.f_code.co_filename
        if not is_library_file(name):
            return f"{name}:{f.f_lineno} in {f.f_code.co_name}"
        if first is None and "/torch/" not in name and "/ddpguard/guard/" not in name:
            first = f"{name}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return first or "?"


class IssueSites:
    def __init__(self, keep: int = 256, note: Callable[[str, str], None] | None = None
                 ) -> None:
        self.sites: collections.deque[tuple[int, int, int, str]] = collections.deque(
            maxlen=keep)
        # The error a thread is unwinding while it issues a collective (a `finally:` or a
        # Join exit on the way out) goes to the fault log (`note`) until that collective
        # completes: the transport may abort this rank inside it, and only the log remains.
        self._note = note
        self._orig: dict[tuple[Any, str], Any] = {}
        self._ranked: dict[str, bool] = {}  # call site -> under a rank test (read once)
        self._ranked_at: dict[str, float] = {}  # call site -> when it was last noted

    def _wrap(self, fn: Any) -> Any:
        sites = self.sites

        @functools.wraps(fn)
        def issue(*args: Any, **kwargs: Any) -> Any:
            t0 = time.time_ns()
            noted = False
            try:
                where = _caller()
                noted = self._unwinding(sys.exc_info()[1])
                self._note_ranked(fn.__name__, where)
            except Exception:  # never the user's collective's failure
                where = "?"
            work = fn(*args, **kwargs)
            if noted:  # it completed: the words are for a rank aborted inside it only
                self._unwound()
            sites.append((t0, time.time_ns(), threading.get_ident(), where))
            return work

        issue.__ddpguard_wrapped__ = fn  # type: ignore[attr-defined]
        return issue

    def _note_ranked(self, op: str, where: str) -> None:
        """A collective issued under a rank test (`if rank == 0: dist.barrier()`) goes to the
        fault log with its time: the others never issue it, so it pairs with their next one,
        and the transport may abort a rank on the difference at once. A launcher such as
        torch.multiprocessing then ends the others before any guard can report, and only the
        logs are left to say which line it was (launch/postmortem.py). Almost no correct
        program issues one, so the note costs nothing in steady training."""
        ranked = self._ranked.get(where)
        if ranked is None:
            path, _, rest = where.partition(":")
            line = rest.split(" ", 1)[0]
            ranked = line.isdigit() and in_conditional(linecache.getlines(path), int(line))
            if len(self._ranked) < 4096:
                self._ranked[where] = ranked
        if not ranked or self._note is None:
            return  # the common case: one dict lookup per collective
        now = time.time()
        # A test every rank passes (`if local_rank != -1:`) may hold a collective each step:
        # one line per site every few seconds keeps the log small.
        if now - self._ranked_at.get(where, 0.0) >= 5.0:
            self._ranked_at[where] = now
            self._note("ranked", f"{now:.3f}|{op}|{where}")

    def _unwinding(self, exc: BaseException | None) -> bool:
        """Note the error this collective's thread unwinds, if any; True if noted."""
        text = describe(exc) if exc is not None and self._note is not None else None
        if text is None or self._note is None:
            return False
        self._note("unwinding", text)
        return True

    def _unwound(self) -> None:
        if self._note is not None:
            self._note("unwinding", "-")

    def install(self) -> None:
        try:
            import torch.distributed as dist
            import torch.distributed.distributed_c10d as c10d
        except ImportError:
            return
        for name in _NAMES:
            fn = getattr(c10d, name, None)
            if fn is None or hasattr(fn, "__ddpguard_wrapped__"):
                continue
            wrapped = self._wrap(fn)
            for mod in (c10d, dist):
                if getattr(mod, name, None) is fn:
                    self._orig[(mod, name)] = fn
                    setattr(mod, name, wrapped)

    def uninstall(self) -> None:
        for (mod, name), fn in self._orig.items():
            current = getattr(mod, name, None)
            if getattr(current, "__ddpguard_wrapped__", None) is fn:
                setattr(mod, name, fn)
        self._orig.clear()

    def site_for(self, created_ns: int, thread: int = 0) -> str | None:
        """The call whose time window holds the recorder's creation time of an entry, on the
        entry's thread where the recorder names it (a blocking call's window holds whatever
        other threads issued meanwhile)."""
        for t0, t1, tid, where in reversed(self.sites):
            if t0 <= created_ns <= t1 and (not thread or tid == thread):
                return where
        return None
