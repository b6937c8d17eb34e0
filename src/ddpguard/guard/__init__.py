"""Run-time hang guard: heartbeats through the rendezvous store, an agreement check on loader
lengths, stall and dead-rank detection, all-rank stack dumps and a diagnosis.

`start(world)` after the process group formed, `stop()` before leaving; `ddpguard.init()` and
`ddpguard run` (through `ddpguard.guard.bootstrap`) do both for you.
"""

from __future__ import annotations

import threading
from typing import Any

from .config import EXIT_CODE, GuardConfig
from .diagnose import diagnose
from .monitor import Guard
from .progress import UnevenBatchesError

__all__ = ["Guard", "GuardConfig", "UnevenBatchesError", "EXIT_CODE", "diagnose", "start",
           "stop", "active"]

_lock = threading.Lock()
_active: Guard | None = None


def active() -> Guard | None:
    return _active


def start(world: Any, config: GuardConfig | None = None) -> Guard | None:
    """Start the guard for `world` (a ddpguard World or anything with rank, world_size,
    master_addr, master_port). A single-process world needs none: returns None."""
    global _active
    if world.world_size < 2:
        return None
    with _lock:
        if _active is not None:
            return _active
        _active = Guard(world.rank, world.world_size, world.master_addr, world.master_port,
                        config or GuardConfig.from_env(),
                        shared_store=getattr(world, "store", None)).start()
        return _active


def stop(state: str = "exited", error: str | None = None) -> None:
    """Stop this process's guard, if any; safe to call twice."""
    global _active
    with _lock:
        g, _active = _active, None
    if g is not None:
        g.stop(state, error)
