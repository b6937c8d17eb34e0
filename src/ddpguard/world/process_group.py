"""Process-group set-up and teardown (impure: talks to the network and the GPU)."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .place import World

# Variables people set from old blog posts. The first two were renamed; the last never existed
# (blog posts recommend it): NCCL's own timeouts are NCCL_IB_TIMEOUT and a few socket ones.
DEPRECATED_VARIABLES: dict[str, str] = {
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
}
NONEXISTENT_VARIABLES: dict[str, str] = {
    "NCCL_TIMEOUT": "pass timeout= to ddpguard.init() or torch.distributed.init_process_group()",
}
# What we set for NCCL when the user has not: tear down on a failed collective (3 = abort
# without cleanup, which cannot hang on a broken communicator) and dump the flight recorder.
NCCL_DEFAULTS: dict[str, str] = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}


class DistributedSetupError(RuntimeError):
    """The process group could not be formed; the message says which rank, why, and what to do."""


def _pick_backend(world: World, backend: str | None) -> str:
    if backend is not None:
        if backend not in ("gloo", "nccl", "mpi", "ucc", "xccl") and ":" not in backend:
            raise ValueError(f"backend={backend!r} is not a torch.distributed backend")
        return backend
    return "nccl" if torch.cuda.is_available() else "gloo"


def _bind_device(world: World, backend: str) -> torch.device:
    if backend == "nccl" or (backend != "gloo" and torch.cuda.is_available()):
        n = torch.cuda.device_count()
        if world.local_rank >= n:
            raise DistributedSetupError(
                f"rank {world.rank}: LOCAL_RANK={world.local_rank} but this node has {n} visible "
                f"GPU(s) (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). "
                "Start at most one process per GPU (--nproc-per-node)."
            )
        torch.cuda.set_device(world.local_rank)
        return torch.device("cuda", world.local_rank)
    return torch.device("cpu")


def nccl_env_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """Pure: the NCCL variables ddpguard adds to `env` (NCCL_DEFAULTS minus what the user set).

    A user's value wins, also under the deprecated name: torch reads `TORCH_NCCL_X` before
    `NCCL_X`, so setting ours would silently override a user's `NCCL_ASYNC_ERROR_HANDLING`.
    """
    old_names = {new: old for old, new in DEPRECATED_VARIABLES.items()}
    # No None lookup: os.environ raises on a None key where a dict just says no.
    return {
        name: value for name, value in NCCL_DEFAULTS.items()
        if name not in env and (name not in old_names or old_names[name] not in env)
    }


def _warn_bad_variables(env: Mapping[str, str], log: logging.Logger) -> None:
    for old, new in DEPRECATED_VARIABLES.items():
        if old in env:
            log.warning("%s is deprecated and only read as a fallback; set %s instead", old, new)
    for name, instead in NONEXISTENT_VARIABLES.items():
        if name in env:
            log.warning("%s is not read by NCCL or PyTorch and does nothing; %s", name, instead)


def _explain_setup_failure(world: World, exc: BaseException, init_timeout: timedelta) -> str:
    text = str(exc)
    where = f"{world.master_addr}:{world.master_port}"
    low = text.lower()
    if "address already in use" in low or "eaddrinuse" in low:
        cause = (
            f"port {world.master_port} on {world.master_addr} is already in use (another job or a "
            "leftover process); set MASTER_PORT to a free port, or use `ddpguard run` which "
            "picks one"
        )
    elif "timed out" in low or "timeout" in low or "connect" in low or "refused" in low:
        cause = (
            f"could not reach rank 0's store at MASTER_ADDR:MASTER_PORT={where} within "
            f"{init_timeout.total_seconds():.0f} s, or not every rank joined in time. Check that "
            "rank 0 started, that the address is reachable from this node, and that all "
            f"{world.world_size} ranks were launched"
        )
    else:
        cause = "see the underlying error below"
    return f"rank {world.rank}/{world.world_size}: process group set-up failed: {cause}.\n  {text}"


def init_process_group(
    world: World,
    *,
    backend: str | None = None,
    init_timeout: timedelta = timedelta(minutes=10),
    timeout: timedelta = timedelta(minutes=5),
    env: Mapping[str, str] | None = None,
) -> World:
    """Form the process group for `world` and return it with backend and device filled in.

    `init_timeout` bounds the rendezvous and the first barrier (ranks may start minutes apart on a
    busy cluster); `timeout` then replaces it for training collectives, so a desync fails sooner.
    A single-process world forms no group.
    """
    log = logging.getLogger("ddpguard")
    env = os.environ if env is None else env
    _warn_bad_variables(env, log)
    chosen = _pick_backend(world, backend)
    if not world.distributed:
        dev = _bind_device(world, chosen) if chosen == "nccl" else torch.device("cpu")
        return dataclasses.replace(world, backend=chosen, device=dev)
    if dist.is_initialized():
        raise DistributedSetupError(
            f"rank {world.rank}: a default process group already exists; call "
            "ddpguard.shutdown() before initializing again"
        )
    device = _bind_device(world, chosen)
    if chosen == "nccl":
        # torch reads the process environment, so that is where the user's choice lives.
        os.environ.update(nccl_env_defaults(os.environ))
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    store = None
    try:
        # An explicit TCPStore rather than init_method="env://" so that MASTER_* coming from
        # SLURM (not the environment) work, and so the store timeout is exactly init_timeout.
        store = dist.TCPStore(
            world.master_addr,
            world.master_port,
            world.world_size,
            is_master=world.rank == 0 and not world.agent_store,
            timeout=init_timeout,
            wait_for_workers=not world.agent_store,
            multi_tenant=True,
        )
        dist.init_process_group(
            chosen,
            store=dist.PrefixStore(f"/ddpguard/attempt_{world.restart_count}", store),
            rank=world.rank,
            world_size=world.world_size,
            timeout=init_timeout,
            **kwargs,
        )
        dist.barrier()
    except (RuntimeError, ValueError, TimeoutError) as exc:
        if dist.is_initialized():
            _destroy_bounded(timedelta(seconds=5))
        raise DistributedSetupError(_explain_setup_failure(world, exc, init_timeout)) from exc
    if timeout != init_timeout:
        try:
            dist.distributed_c10d._set_pg_timeout(timeout)
        except (AttributeError, RuntimeError) as exc:  # private API: degrade, never fail set-up
            log.debug("could not shorten the collective timeout: %s", exc)
    return dataclasses.replace(world, backend=chosen, device=device)


def _destroy_bounded(limit: timedelta) -> bool:
    """destroy_process_group in a daemon thread: NCCL teardown can block on a dead peer."""
    done = threading.Event()

    def target() -> None:
        try:
            dist.destroy_process_group()
        except Exception:  # already torn down by an error path; nothing left to free
            pass
        finally:
            done.set()

    t = threading.Thread(target=target, name="ddpguard-destroy", daemon=True)
    t.start()
    return done.wait(limit.total_seconds())


def destroy_process_group(limit: timedelta = timedelta(seconds=30)) -> None:
    """Tear down the default group if there is one. Safe twice, alone, and after a peer died."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if not _destroy_bounded(limit):
        logging.getLogger("ddpguard").warning(
            "destroy_process_group did not return within %.0f s (a peer is probably gone); "
            "leaving it to process exit",
            limit.total_seconds(),
        )


# ---------------------------------------------------------------------------------------------
# logging
