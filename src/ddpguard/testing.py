"""Run a function on N real gloo ranks on loopback, with a hard deadline that names hung ranks.

    results = run_ranks(my_check, world_size=2, args=(...), timeout=60)

`fn(world, *args)` runs in each rank's own process (forked from a fork server that has
imported torch, or spawned) after `ddpguard.init()` (gloo,
127.0.0.1, a free port, OMP_NUM_THREADS=1); its return values come back in rank order. A rank
that raises fails the call with that rank's traceback; a rank that does not finish by the
deadline fails it with "rank N hung" and the rank's Python stack at the moment it was stopped.
Used by ddpguard's own tests and usable in users' test suites.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import queue
import signal
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .guard.config import EXIT_CODE as GUARD_EXIT

__all__ = ["RankFailure", "free_port", "run_ranks", "loopback_env"]


class RankFailure(AssertionError):
    """One or more ranks raised, crashed, or hung. The message names each rank and why."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it; tiny race accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loopback_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The variables torchrun would set for `rank`, pinned to loopback and one thread."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }


def _worker(
    rank: int,
    world_size: int,
    port: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    init_kwargs: dict[str, Any],
    caller_env: dict[str, str],
    extra_env: dict[str, str],
    stack_file: str,
    results: Any,
) -> None:
    os.environ.update(loopback_env(rank, world_size, port))
    os.environ.update(extra_env)
    with open(stack_file, "w") as stacks:
        # The parent sends SIGUSR1 before it kills a rank that is stuck, so the failure can say
        # where. faulthandler writes from C, so this works even inside a blocked collective.
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
        try:
            import torch

            torch.set_num_threads(1)
            from ddpguard.session import init, shutdown

            world = init(backend="gloo", **init_kwargs)
            try:
                value = fn(world, *args)
            except BaseException as exc:  # report everything, SystemExit included
                # Report before teardown: a peer's guard may end this process (exit 17)
                # while it leaves, and the traceback would be lost.
                _report(results, (rank, "error", traceback.format_exc()))
                shutdown(world, limit=10, error=f"{type(exc).__name__}: {exc}")
                return
            shutdown(world, limit=10)
            _report(results, (rank, "ok", value))
        except BaseException:  # init or teardown failed
            _report(results, (rank, "error", traceback.format_exc()))
        finally:
            faulthandler.unregister(signal.SIGUSR1)


def _report(results: Any, item: tuple[int, str, Any]) -> None:
    """Put and flush: a Queue writes from a feeder thread, which os._exit would cut off."""
    try:
        results.put(item)
        results.close()
        results.join_thread()
    except (ValueError, OSError):  # already reported and closed: the first report stands
        pass


def _describe_stuck(rank: int, stack_file: Path, why: str) -> str:
    try:
        stack = stack_file.read_text().strip()
    except OSError:
        stack = ""
    return f"rank {rank} {why}.\n" + (
        f"  its stack when stopped:\n{stack}" if stack else "  (no stack captured)"
    )


# What every rank imports anyway: the fork server imports it once, and each rank is forked
# from it in milliseconds instead of importing torch afresh (seconds per rank on a small machine).
_PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "ddpguard.session"]


def _context() -> Any:
    """The fork server where the platform has one (a clean single-threaded process: forking
    it is safe, unlike forking a caller that may hold threads or CUDA), else spawn."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    from multiprocessing import forkserver

    if not getattr(forkserver._forkserver, "_forkserver_pid", None):  # preloading still counts
        ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def run_ranks(
    fn: Callable[..., Any],
    world_size: int = 2,
    *,
    args: tuple[Any, ...] = (),
    timeout: float = 60.0,
    init_kwargs: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> list[Any]:
    """Run `fn(world, *args)` on `world_size` gloo ranks; return the results in rank order.

    `fn` must be importable by name (a module-level function): ranks do not share the caller's
    memory. Each rank sees the caller's environment as it is at the call, then `env`.
    Raises RankFailure naming every rank that raised, died, or outlived `timeout` seconds.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    tmp = tempfile.TemporaryDirectory(prefix="ddpguard-ranks-")
    stack_files = [Path(tmp.name) / f"rank{r}.stack" for r in range(world_size)]
    procs = [
        ctx.Process(
            target=_worker,
            args=(r, world_size, port, fn, args, dict(init_kwargs or {}),
                  dict(os.environ), dict(env or {}), str(stack_files[r]), results),
            name=f"ddpguard-rank{r}",
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    outcome: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout
    failed_at: float | None = None
    try:
        while len(outcome) < world_size:
            now = time.monotonic()
            if now >= deadline:
                break
            # Once a rank failed, give the others a short grace to report, then stop them: they
            # are usually blocked in a collective with the dead rank and would sit out the timeout.
            if failed_at is not None and now - failed_at > 5.0:
                break
            try:
                rank, status, value = results.get(timeout=0.2)
                outcome[rank] = (status, value)
                if status == "error" and failed_at is None:
                    failed_at = time.monotonic()
            except queue.Empty:
                for r, p in enumerate(procs):
                    if r not in outcome and not p.is_alive() and p.exitcode not in (None, 0):
                        # Died without reporting (SIGKILL, segfault, os._exit).
                        time.sleep(0.2)  # a last report may still be in the pipe
                        try:
                            while True:
                                rr, st, val = results.get_nowait()
                                outcome[rr] = (st, val)
                        except queue.Empty:
                            pass
                        if r not in outcome:
                            outcome[r] = ("died", p.exitcode)
                            failed_at = failed_at or time.monotonic()
    finally:
        stuck = [p for r, p in enumerate(procs) if r not in outcome and p.is_alive()]
        for p in stuck:
            if p.pid is not None:
                os.kill(p.pid, signal.SIGUSR1)  # our own child, by pid: dump stacks
        if stuck:
            time.sleep(1.0)
        from .guard.procs import kill_tree

        for p in procs:
            if p.is_alive():
                p.join(timeout=0.2)
            if p.is_alive() and p.pid is not None:
                # Our own child and everything below it (its DataLoader workers), by pid.
                kill_tree(p.pid, include_self=True)
        for p in procs:
            p.join(timeout=10)
        results.close()
    problems = []
    for r in range(world_size):
        status, value = outcome.get(r, ("hung", None))
        if status == "error":
            problems.append(f"rank {r} raised:\n{value}")
        elif status == "died" and value == GUARD_EXIT:
            problems.append(f"rank {r} was stopped by the hang guard (exit code {value}; "
                            "its report is above)")
        elif status == "died":
            problems.append(f"rank {r} died with exit code {value} before reporting")
        elif status == "hung":
            why = (
                "was stopped while blocked after another rank failed"
                if failed_at is not None
                else f"hung: no result within the {timeout:.0f} s deadline"
            )
            problems.append(_describe_stuck(r, stack_files[r], why))
    tmp.cleanup()
    if problems:
        raise RankFailure(
            f"{len(problems)} of {world_size} ranks failed:\n\n" + "\n\n".join(problems)
        )
    return [outcome[r][1] for r in range(world_size)]
