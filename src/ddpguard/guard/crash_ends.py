"""The ends of a rank that the guard explains from its own error (crash.py hands them here):
a collective that ran out the process group's timeout, a DataLoader worker that was killed.
Each ends the job with the report (exit 17)."""

from __future__ import annotations

import os
import time
from typing import Any

from . import channel, workers
from .config import EXIT_CODE
from .ends import (
    WorkerDeath,
    oom_words,
    peer_doing,
    timeout_cause,
    timeout_reason,
    worker_death,
    worker_reason,
)
from .rules import Decision
from .stacks import Frame, short_path

__all__ = ["timed_out", "worker_death_of", "worker_killed"]


def timed_out(g: Any, ms: int, waiting: str, place: str, text: str,
               frames: list[Frame]) -> int:
    """A collective of this rank ran out the process group's own timeout: report what every
    peer was doing at that moment, and the setting."""
    peers = g.read_peers()
    now = time.monotonic()
    doing: dict[int, str] = {}
    working: list[int] = []
    gone: list[int] = []
    frozen: list[int] = []
    for r, hb in sorted(peers.items()):
        if r == g.rank:
            continue
        is_gone, how = g.peer_gone(r, hb, now)
        # A heartbeat older than three intervals: that rank's guard is not running (a
        # stopped process, a call holding the GIL), so what it last said is no proof of work.
        age = time.time() - float(hb.get("t") or time.time())
        silent = age if age > 3 * g.config.heartbeat_interval else 0.0
        doing[r] = peer_doing(r, hb, how if is_gone else "", silent)
        if is_gone:
            gone.append(r)
        elif silent:
            frozen.append(r)
        elif not (hb.get("blocked") or hb.get("pending")):
            working.append(r)
    cause, culprits, kind = timeout_cause(gone, frozen, working)
    reason = timeout_reason(g.rank, ms, waiting, place, doing, kind)
    channel.write(f"ddpguard: rank {g.rank}: its collective{waiting} failed on the process "
                  f"group's timeout ({ms / 1000:g} s): {text}")
    g.failure.crashed(frames, text)
    g.failure.fail(Decision(cause, reason, tuple(culprits)), peers)
    return EXIT_CODE  # not reached: the failure path ends the process


def worker_death_of(exc: BaseException, frames: list[Frame]) -> WorkerDeath | None:
    """The DataLoader worker whose death `exc` is: named by torch in the error or one it
    chains to, or, for an error raised while receiving a batch (a connection reset when the
    worker died in the middle of sending one), a worker of this rank killed by a signal."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            break
        death = worker_death(str(seen))
        if death is not None:
            return death
        seen = seen.__cause__ or seen.__context__
    if any("torch/utils/data/" in f["file"].replace(os.sep, "/") for f in frames):
        found = workers.dead_worker()
        if found is not None:
            return WorkerDeath(*found)
    return None


def worker_killed(g: Any, death: WorkerDeath, place: str, text: str, frames: list[Frame]) -> int:
    """A DataLoader worker of this rank died: name its loader's line and what killed it."""
    site = workers.site_of(death.pid)
    if death.signal is None:
        # torch noticed the death by polling ("exited unexpectedly"): the status it reaped
        # still says which signal, if any.
        death = WorkerDeath(death.pid, workers.exit_signal(death.pid))
    oom = oom_words(*workers.oom_counts()) if death.signal == "SIGKILL" else ""
    loader_line = site.rsplit(" in ", 1)[0] if site else None
    here = place.rsplit(" in ", 1)[0]
    same = loader_line is not None and short_path(loader_line.rpartition(":")[0]) + ":" + \
        loader_line.rpartition(":")[2] == here
    surfaced = place if place and not same else ""
    if site and loader_line:
        # Where the report shows this rank: the loop over the loader, not the line torch
        # happened to raise on.
        path, _, line = loader_line.rpartition(":")
        frames = [{"file": path, "line": int(line), "func": site.rsplit(" in ", 1)[1],
                   "code": _source_line(path, int(line))}]
    reason = worker_reason(g.rank, death, site, surfaced, oom, workers.made_at(death.pid))
    channel.write(f"ddpguard: rank {g.rank} crashed: {text}")
    g.failure.crashed(frames, text)
    g.failure.fail(Decision("loader_worker_killed", reason, (g.rank,)), g.read_peers())
    return EXIT_CODE  # not reached: the failure path ends the process


def _source_line(path: str, line: int) -> str:
    import linecache

    return linecache.getline(path, line).strip()
