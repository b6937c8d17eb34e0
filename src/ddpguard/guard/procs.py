"""Processes, read from /proc: a job's descendants (so nothing outlives a stopped job), whether a
pid is alive, and whether the kernel's OOM killer struck. Linux; elsewhere every function
degrades to 'do not know'."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

__all__ = ["pid_alive", "children", "descendants", "kill_tree", "oom_kills",
           "become_subreaper"]


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited: it only waits for its parent to read its status.
    return _state(pid) != b"Z"


def _state(pid: int) -> bytes | None:
    """The one-letter state of `pid` from /proc (R, S, D, T, t, Z, ...), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return stat[stat.rindex(b")") + 2:][:1]
    except (OSError, ValueError):
        return None


def _ppids() -> dict[int, int]:
    out: dict[int, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes()
            fields = stat[stat.rindex(b")") + 2:].split()
            if fields[0] != b"Z":
                out[int(name)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


def children(pid: int) -> list[int]:
    return sorted(p for p, pp in _ppids().items() if pp == pid)


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, parents before children."""
    table = _ppids()
    out: list[int] = []
    frontier = [pid]
    while frontier:
        nxt = [p for p, pp in table.items() if pp in frontier and p not in out]
        out.extend(sorted(nxt))
        frontier = nxt
    return out


def stopped(pid: int) -> bool:
    """Is `pid` stopped (SIGSTOP, a debugger): state T or t in /proc (Linux)."""
    return _state(pid) in (b"T", b"t")


def kill_tree(pid: int, include_self: bool = False, wait: float = 2.0) -> list[int]:
    """SIGKILL every descendant of `pid` (and `pid` itself if asked); returns who was sent it.
    Only pids found below the given one are touched: never anything by name."""
    victims = descendants(pid)
    if include_self:
        victims.append(pid)
    for p in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and any(pid_alive(p) for p in victims if p != os.getpid()):
        time.sleep(0.02)
    return victims


OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def oom_kills(paths: tuple[str, ...] = OOM_FILES) -> int | None:
    """How many processes the OOM killer has killed in this cgroup so far (v2, then v1);
    None where the machine cannot tell."""
    for path in paths:
        try:
            for line in Path(path).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def become_subreaper() -> bool:
    """Orphans below this process are re-parented to it instead of init, so a launcher can
    find and end grandchildren whose parent died (DataLoader workers of a killed rank)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False
