"""The guard's own output channel: a duplicate of file descriptor 2 taken when the guard is
loaded, written with `os.write`.

Training scripts routinely silence their workers: they replace `builtins.print` with a
function that takes only `*args` (DINO, MoCo, DeiT's `setup_for_distributed`), assign
`sys.stdout = sys.stderr = open(os.devnull, "w")`, `os.dup2` /dev/null onto fd 2, or disable
`logging`. Anything the guard said through those objects was lost, or worse, raised inside the
guard (`print(..., file=...)` -> TypeError). Nothing here goes through an object the script can
replace: the descriptor is ours, taken before the script runs (`ddpguard run`) or when
`ddpguard.init()` loads the guard, so a later `dup2` onto fd 2 does not reach it.
"""

from __future__ import annotations

import contextlib
import os
import sys

__all__ = ["open_channel", "write", "write_bytes", "flush_user_streams", "under_launcher",
           "LAUNCHER_ENV"]

# Set by `ddpguard run` for its ranks: the launcher prints the verdict, the ranks only say
# one line each (docs/guard.md, "Where the verdict appears").
LAUNCHER_ENV = "DDPGUARD_LAUNCHER"
# Where the launch's sitecustomize left its early duplicate of fd 2 (launch/site/).
SITE_FD_ENV = "DDPGUARD_CHANNEL_FD"

_fd: int | None = None


def open_channel() -> int | None:
    """Take the duplicate of fd 2 once (idempotent); None when fd 2 is not open."""
    global _fd
    if _fd is None:
        _fd = _inherited()
    if _fd is None:
        try:
            # os.dup makes a non-inheritable descriptor: DataLoader workers and subprocesses
            # of the script do not keep it open.
            _fd = os.dup(2)
        except OSError:
            _fd = None
    return _fd


def _inherited() -> int | None:
    """The duplicate `ddpguard run -- COMMAND`'s sitecustomize took at this process's
    start-up, before the script could touch fd 2 (`pid:fd`; a child that inherited the
    variable has another pid and takes its own)."""
    pid, _, fd = os.environ.get(SITE_FD_ENV, "").partition(":")
    if pid != str(os.getpid()) or not fd.isdigit():
        return None
    try:
        os.fstat(int(fd))
    except OSError:
        return None
    return int(fd)


def write(text: str) -> None:
    """Write `text` plus a newline, whole, to the guard's descriptor. Never raises: the guard
    must not fail because its output cannot be written."""
    write_bytes((text if text.endswith("\n") else text + "\n").encode("utf-8", "replace"))


def write_bytes(data: bytes) -> None:
    """Write `data` whole (os.write may write less than asked); never raises."""
    fd = open_channel()
    for target in ((fd,) if fd is not None else ()) + (2,):
        try:
            view = memoryview(data)
            while view:
                n = os.write(target, view)
                view = view[n:]
            return
        except OSError:
            continue  # our duplicate was closed (a script closing every fd): try fd 2


def flush_user_streams() -> None:
    """Flush whatever the script printed before the process ends with os._exit; the
    script's stream objects may be anything, so every failure is ignored."""
    for name in ("stdout", "stderr"):
        with contextlib.suppress(Exception):
            getattr(sys, name).flush()


def under_launcher() -> bool:
    return bool(os.environ.get(LAUNCHER_ENV))


open_channel()
