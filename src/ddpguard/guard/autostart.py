"""Start the guard when a process forms its default process group, whoever started the process.

Rank, world size and the job's store are known only once `init_process_group` has returned,
and that call is the one thing every way of starting ranks has in common: torchrun, `python -m
torch.distributed.launch`, `torch.multiprocessing.spawn` inside `main()`, Lightning re-running
the script for its other ranks, accelerate, one task per rank under srun. So the guard hooks
that call (and `destroy_process_group`, so a clean exit is not mistaken for a hang) instead of
relying on the launcher's environment:

- `ddpguard run script.py` (torchrun) installs the hooks from `bootstrap`, before the script;
- `ddpguard run -- COMMAND` installs them in every Python process of the command's tree, from
  `launch/site/sitecustomize.py`, right after torch.distributed's module is loaded.

In a process started the second way nothing wraps the script, so the ends the bootstrap
handles around `runpy` are handled here: a normal exit stops the guard (`atexit`), an uncaught
exception on the main thread goes to the crash path (`sys.excepthook`), and an exception in an
`mp.spawn` rank, which torch catches before any hook could see it, is reported by wrapping
torch's per-rank entry point.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import sys
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from . import channel

__all__ = ["GroupWorld", "patch_module", "hook_process_group", "store_address", "clonable_store",
           "AUTOGUARD_ENV"]

# Set by `ddpguard run -- COMMAND` for the whole tree: the sitecustomize hands over only then.
AUTOGUARD_ENV = "DDPGUARD_AUTOGUARD"
_MARK = "__ddpguard_hooked__"


@dataclass(frozen=True)
class GroupWorld:
    """What the guard needs of a rank, read from its default process group."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    store: Any = None  # a store to clone when it is no TCPStore (file://: a FileStore)


def patch_module(module: ModuleType) -> None:
    """Called by the sitecustomize right after a watched torch module has been loaded."""
    if module.__name__ == "torch.distributed.distributed_c10d":
        hook_process_group(module)
    elif module.__name__ == "torch.multiprocessing.spawn":
        _hook_spawn(module)
    elif module.__name__ == "torch.utils.data.dataloader":
        from .workers import note_loader_sites

        note_loader_sites(module)


def hook_process_group(c10d: ModuleType | None = None) -> None:
    """Wrap `init_process_group` / `destroy_process_group` in `c10d` (and in
    torch.distributed, when that has already copied the names). Idempotent."""
    if c10d is None:
        import torch.distributed.distributed_c10d as loaded

        c10d = loaded
    if getattr(c10d, "init_process_group", None) is None or \
            getattr(c10d.init_process_group, _MARK, False):
        return
    orig_init = c10d.init_process_group
    orig_destroy = c10d.destroy_process_group

    @functools.wraps(orig_init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        out = orig_init(*args, **kwargs)
        try:
            _start_for_group()
        except Exception as exc:  # never break the user's set-up because of the guard
            channel.write(f"ddpguard: guard not started: {exc}")
        return out

    @functools.wraps(orig_destroy)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        if not args and kwargs.get("group") is None:
            from ddpguard import guard

            from .leaving import note_leave_site

            note_leave_site(sys._getframe(1))

            failing = _report_failure_in_flight()
            if failing is None:
                guard.stop("exited")
            else:
                # The rank's own error is on its way out: it crashed, it did not leave.
                from .crash import crash_text

                guard.stop("crashed", crash_text(failing))
        return orig_destroy(*args, **kwargs)

    for fn in (init_process_group, destroy_process_group):
        setattr(fn, _MARK, True)
    targets = [c10d]
    dist = sys.modules.get("torch.distributed")
    if dist is not None and hasattr(dist, "init_process_group"):
        targets.append(dist)  # it copied the names already (`from .distributed_c10d import *`)
    for module in targets:
        setattr(module, "init_process_group", init_process_group)  # noqa: B010
        setattr(module, "destroy_process_group", destroy_process_group)  # noqa: B010


def _report_failure_in_flight() -> BaseException | None:
    """`finally: dist.destroy_process_group()` runs while the rank's error propagates: a
    collective that failed because a peer died or timed out is this rank's end, and the guard
    reports it now (the failure path ends the process with exit 17), before the clean-up
    would make it look like a rank that left on purpose. Returns the error in flight."""
    from ddpguard import guard

    failing = sys.exc_info()[1]
    if (failing is None or not isinstance(failing, Exception) or guard.active() is None
            or threading.current_thread() is not threading.main_thread()):
        return None
    from .crash import explained_end, report_until_settled

    if explained_end(failing):
        report_until_settled(failing)
    return failing


def store_address(store: Any) -> tuple[str, int] | None:
    """Host and port of the TCPStore under `store` (unwrapping PrefixStores), or None for a
    store the guard cannot open a connection of its own to (FileStore, HashStore)."""
    import torch.distributed as dist

    store = _underlying(store)
    if isinstance(store, dist.TCPStore):
        return str(store.host), int(store.port)
    return None


def _underlying(store: Any) -> Any:
    """The store under any PrefixStores (c10d wraps the group's own in one)."""
    import torch.distributed as dist

    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def clonable_store(store: Any) -> Any:
    """The FileStore under `store` (init_method='file://...', common under SLURM with a shared
    file system), which the guard opens again for itself (`clone`), or None."""
    import torch.distributed as dist

    store = _underlying(store)
    return store if isinstance(store, dist.FileStore) else None


def _start_for_group() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from ddpguard import guard

    size = dist.get_world_size()
    if size < 2 or guard.active() is not None:
        return
    rank = dist.get_rank()
    default = c10d._get_default_store()
    address = store_address(default)
    if address is not None:
        world = GroupWorld(rank, size, *address)
    else:
        shared = clonable_store(default)
        if shared is None:
            channel.write(f"ddpguard: rank {rank}: guard not started: the process group's store "
                          f"({type(default).__name__}) cannot be shared with the guard; use "
                          "init_method='env://', 'tcp://...' or 'file://...'")
            return
        world = GroupWorld(rank, size, "", 0, shared)
    g = guard.start(world)
    if g is not None and os.environ.get(AUTOGUARD_ENV) == "1":
        _install_exits()


_exits_installed: list[bool] = []


def _install_exits() -> None:
    """Without the bootstrap around the script: stop the guard at a normal exit, report an
    exception that reaches the top of the main thread."""
    if _exits_installed:
        return
    _exits_installed.append(True)
    from ddpguard import guard

    from .crash import install_excepthook

    atexit.register(guard.stop, "exited")
    install_excepthook()
    _note_sys_exit()
    _note_os_exit()


def _note_sys_exit() -> None:
    """sys.exit raises SystemExit, which leaves no traceback for atexit to read: note the
    caller's line first, so a rank that exits early is named at its `sys.exit`."""
    orig = sys.exit
    if getattr(orig, _MARK, False):
        return

    @functools.wraps(orig)
    def exit(*args: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            from .leaving import note_leave_site

            with contextlib.suppress(Exception):
                note_leave_site(sys._getframe(1))
        return orig(*args)

    setattr(exit, _MARK, True)
    sys.exit = exit


_os_exiting: list[bool] = []


def _note_os_exit() -> None:
    """os._exit ends the process at once (no atexit, no SystemExit; under mp.spawn a nonzero
    code makes the parent kill the other ranks before their guards can say anything). A rank
    that calls it leaves through the guard's stop first, as at a normal exit: its line noted,
    and a peer waiting for a collective it will never issue is a stop decided here."""
    orig = os._exit
    if getattr(orig, _MARK, False):
        return
    rank_pid = os.getpid()

    @functools.wraps(orig)
    def _exit(code: int) -> Any:
        caller = sys._getframe(1)
        # The guard's own os._exit (exit 17 after a report) and a second call go straight on,
        # and so does every forked child's (a DataLoader worker ends through os._exit in
        # multiprocessing: it is not the rank leaving).
        if (os.getpid() == rank_pid and not _os_exiting
                and "/ddpguard/" not in caller.f_code.co_filename.replace(os.sep, "/")):
            _os_exiting.append(True)
            with contextlib.suppress(BaseException):
                from ddpguard import guard

                from .leaving import note_leave_site

                note_leave_site(caller)
                guard.stop("exited")
        orig(code)

    setattr(_exit, _MARK, True)
    os._exit = _exit  # type: ignore[assignment]


def _hook_spawn(module: ModuleType) -> None:
    """torch's mp.spawn runs each rank's function inside `_wrap`, which catches the rank's
    exception and sends its traceback to the parent: report it first, and stop the guard when
    the function returns (a spawned rank may leave through os._exit, skipping atexit)."""
    orig = getattr(module, "_wrap", None)
    if orig is None or getattr(orig, _MARK, False):
        return

    @functools.wraps(orig)
    def _wrap(fn: Any, i: int, args: Any, *rest: Any, **kw: Any) -> Any:
        @functools.wraps(fn)
        def guarded(*a: Any, **k: Any) -> Any:
            from ddpguard import guard

            try:
                out = fn(*a, **k)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:
                if guard.active() is not None:
                    from .crash import report_until_settled

                    report_until_settled(exc)
                raise
            with contextlib.suppress(Exception):
                from .leaving import note_return_site

                note_return_site(fn)  # its frame is gone: its one early return names it
            guard.stop("exited")
            return out

        return orig(guarded, i, args, *rest, **kw)

    setattr(_wrap, _MARK, True)
    module._wrap = _wrap  # type: ignore[attr-defined]
