"""`ddpguard.init()` / `ddpguard.shutdown()`: the two calls a training script makes.

This module sits above `world` (set-up) and `guard` (the run-time watchdog) and composes them,
so `world` stays free of anything that watches training.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from .world import World, destroy_process_group, detect, init_process_group, setup_logging

if TYPE_CHECKING:
    from .guard import GuardConfig

__all__ = ["init", "shutdown"]


def _as_timedelta(value: float | timedelta, name: str) -> timedelta:
    td = value if isinstance(value, timedelta) else timedelta(seconds=float(value))
    if td.total_seconds() <= 0:
        raise ValueError(f"{name} must be a positive duration, got {value!r}")
    return td


def init(
    world: World | None = None,
    *,
    backend: str | None = None,
    init_timeout: float | timedelta = 600.0,
    timeout: float | timedelta = 300.0,
    log_level: int = logging.INFO,
    env: Mapping[str, str] | None = None,
    guard: bool = True,
    guard_config: GuardConfig | None = None,
) -> World:
    """Detect the launcher, form the process group, bind the device; return the `World`.

    Works under torchrun / `ddpguard run`, SLURM (srun), and as a single plain process.
    `backend` defaults to nccl with CUDA and gloo otherwise. `init_timeout` (seconds) bounds
    the rendezvous; the shorter `timeout` then applies to every collective.
    With `guard` (the default) the hang guard watches the job once the group has formed:
    `guard_config` tunes it (DDPGUARD_* variables otherwise); `shutdown()` stops it.
    """
    world = detect(env) if world is None else world
    init_td = _as_timedelta(init_timeout, "init_timeout")
    coll_td = _as_timedelta(timeout, "timeout")
    setup_logging(world, log_level)
    if guard and world.distributed:
        from .guard.ledger import ensure_recorder_env

        ensure_recorder_env()
    world = init_process_group(
        world, backend=backend, init_timeout=init_td, timeout=coll_td, env=env
    )
    if guard and world.distributed:
        from . import guard as guard_mod

        guard_mod.start(world, guard_config)
        from .guard.crash import install_excepthook

        install_excepthook()  # nothing wraps this script: its crash path starts at the top
    return world


def shutdown(world: World | None = None, *, limit: float = 30.0,
             error: str | None = None) -> None:
    """Leave the job. Safe to call twice, without a group, and after another rank failed:
    teardown runs with a bound of `limit` seconds and never blocks forever.

    Pass `error` (e.g. "RuntimeError: ... at train.py:88") when this rank leaves because its
    own code raised: the peers' hang reports then say this rank crashed and why, rather than
    that it left early."""
    import sys

    # Only if the guard was ever imported: shutting down must not pull in torch hooks.
    if "ddpguard.guard" in sys.modules:
        if error is None:
            sys.modules["ddpguard.guard"].stop("exited")
        else:
            sys.modules["ddpguard.guard"].stop("crashed", error)
    destroy_process_group(timedelta(seconds=limit))
