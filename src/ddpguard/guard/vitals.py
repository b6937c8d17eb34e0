"""Readers for the whole rank's vital signs, from /proc and the rank's own sockets (Linux).

Everything here is read by the guard thread about a process it lives in: the other threads of
the rank, the processes below it (pools, subprocesses, DataLoader workers) and its TCP
sockets. Each reader is one small file read or one system call, and degrades to "do not know"
(None, or nothing) where the kernel does not tell; none of them can raise into the guard.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import socket
import struct

__all__ = ["task_ids", "task_cpu", "task_io", "task_name", "task_syscall", "descendants",
           "proc_cpu", "proc_io", "own_cpu", "own_io", "reaped_cpu", "socket_fds", "tcp_bytes",
           "endpoints", "READ_WAITS"]

try:
    _TICKS = float(os.sysconf("SC_CLK_TCK"))
except (AttributeError, ValueError, OSError):  # not POSIX
    _TICKS = 100.0


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _stat_fields(path: str) -> list[bytes] | None:
    """The fields of a /proc stat file after the command name (which may hold spaces)."""
    data = _read(path)
    if not data:
        return None
    try:
        return data[data.rindex(b")") + 2:].split()
    except ValueError:
        return None


def task_ids() -> list[int]:
    """Thread ids (native) of this process."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        return []


def task_cpu(tid: int) -> float | None:
    """User + system CPU seconds of one thread of this process."""
    f = _stat_fields(f"/proc/self/task/{tid}/stat")
    try:
        return (int(f[11]) + int(f[12])) / _TICKS if f else None
    except (IndexError, ValueError):
        return None


def task_runnable(tid: int) -> bool:
    """The thread is running or waiting only for a CPU (state R): a blocked one sleeps (S, D)."""
    f = _stat_fields(f"/proc/self/task/{tid}/stat")
    return f is not None and bool(f) and f[0] == b"R"


def _io_total(data: bytes | None) -> int | None:
    """rchar + wchar from an io file: bytes passed to read()/write() and their kin (files,
    pipes, and sockets only when read() or write() is used on them, never recv()/send())."""
    if not data:
        return None
    total = 0
    for line in data.splitlines():
        if line.startswith((b"rchar:", b"wchar:")):
            with contextlib.suppress(IndexError, ValueError):
                total += int(line.split()[1])
    return total


def task_io(tid: int) -> int | None:
    return _io_total(_read(f"/proc/self/task/{tid}/io"))


def task_name(tid: int) -> str:
    data = _read(f"/proc/self/task/{tid}/comm")
    return data.decode(errors="replace").strip() if data else ""


def task_syscall(tid: int) -> int | None:
    """The system call a thread of this process is blocked in; None while it runs (or where
    the kernel does not say)."""
    data = _read(f"/proc/self/task/{tid}/syscall")
    if not data or not data[:1].isdigit():
        return None
    try:
        return int(data.split()[0])
    except ValueError:
        return None


# System calls a thread sits in while it waits for bytes from a socket (or a pipe): a blocking
# read, or a poll before a read with a timeout. Numbers differ per architecture; elsewhere the
# set is empty and socket bytes need to be sustained to count (see life.py).
_READ_WAITS = {
    # read, poll, readv, select, recvfrom, recvmsg, epoll_wait, pselect6, ppoll, epoll_pwait,
    # recvmmsg, epoll_pwait2
    "x86_64": {0, 7, 19, 23, 45, 47, 232, 270, 271, 281, 299, 441},
    # read, readv, pselect6, ppoll, recvfrom, recvmsg, epoll_pwait, recvmmsg, epoll_pwait2
    "aarch64": {63, 65, 72, 73, 207, 212, 22, 243, 441},
}
READ_WAITS: frozenset[int] = frozenset(_READ_WAITS.get(platform.machine(), set()))


def _children_of(pid: str) -> list[int]:
    """Live children of every thread of process `pid` ('self' or a number): a child belongs to
    the thread that forked it, so a subprocess started from a worker thread is found too."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        data = _read(f"/proc/{pid}/task/{tid}/children")
        if data:
            out.extend(int(c) for c in data.split() if c.isdigit())
    return out


def descendants(limit: int = 256) -> list[int]:
    """Every process below this one, parents first (at most `limit`: a fork bomb must not make
    the guard slow)."""
    out: list[int] = []
    seen: set[int] = set()
    frontier = _children_of("self")
    while frontier and len(out) < limit:
        nxt: list[int] = []
        for pid in frontier:
            if pid in seen:
                continue
            seen.add(pid)
            out.append(pid)
            nxt.extend(_children_of(str(pid)))
        frontier = nxt
    return out[:limit]


def proc_cpu(pid: int) -> float | None:
    """CPU seconds of a process, its threads and the children it has reaped (a shell pipeline's
    short-lived commands land there once they exit)."""
    f = _stat_fields(f"/proc/{pid}/stat")
    try:
        return sum(int(x) for x in f[11:15]) / _TICKS if f else None
    except (IndexError, ValueError):
        return None


def proc_io(pid: int) -> int | None:
    return _io_total(_read(f"/proc/{pid}/io"))


def own_cpu() -> float | None:
    """CPU seconds of every thread of this process, live or exited (not of its children)."""
    f = _stat_fields("/proc/self/stat")
    try:
        return (int(f[11]) + int(f[12])) / _TICKS if f else None
    except (IndexError, ValueError):
        return None


def own_io() -> int | None:
    """rchar + wchar of this process: its threads, live or exited, and its reaped children."""
    return _io_total(_read("/proc/self/io"))


def reaped_cpu() -> float | None:
    """CPU seconds of this process's children that have exited and been waited for."""
    f = _stat_fields("/proc/self/stat")
    try:
        return (int(f[13]) + int(f[14])) / _TICKS if f else None
    except (IndexError, ValueError):
        return None


def socket_fds() -> dict[int, int]:
    """socket inode -> fd, for every socket this process holds open."""
    out: dict[int, int] = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            with contextlib.suppress(ValueError):
                out[int(target[8:-1])] = int(name)
    return out


# getsockopt / getsockname / getpeername straight on the fd number: a Python socket object
# built on a borrowed fd would switch it to non-blocking when the application has set a
# default timeout, and would close it when collected.
try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - not a Unix libc
    _libc = None
_SOL_TCP, _TCP_INFO = 6, 11
# struct tcp_info: __u64 tcpi_bytes_acked at offset 120, tcpi_bytes_received at 128 (Linux 4.2+)
_INFO_LEN = 136


def tcp_bytes(fd: int) -> int | None:
    """Bytes this TCP socket has received plus bytes of its own the peer acknowledged; None for
    anything that is not a TCP socket (a Unix socket, a pipe, a closed fd) or an old kernel."""
    if _libc is None:
        return None
    buf = ctypes.create_string_buffer(_INFO_LEN)
    size = ctypes.c_uint32(_INFO_LEN)
    if _libc.getsockopt(fd, _SOL_TCP, _TCP_INFO, buf, ctypes.byref(size)) != 0:
        return None
    if size.value < _INFO_LEN:
        return None
    acked, received = struct.unpack_from("=QQ", buf.raw, 120)
    return int(acked) + int(received)


def _sockaddr(fn: str, fd: int) -> tuple[str, int] | None:
    if _libc is None:
        return None
    buf = ctypes.create_string_buffer(128)
    size = ctypes.c_uint32(128)
    if getattr(_libc, fn)(fd, buf, ctypes.byref(size)) != 0:
        return None
    family = struct.unpack_from("=H", buf.raw, 0)[0]
    port = struct.unpack_from("!H", buf.raw, 2)[0]
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, buf.raw[4:8]), port
    if family == socket.AF_INET6:
        return socket.inet_ntop(socket.AF_INET6, buf.raw[8:24]), port
    return None


def endpoints(fd: int) -> tuple[tuple[str, int] | None, tuple[str, int] | None]:
    """(local, remote) address of a socket; remote is None for a listener."""
    return _sockaddr("getsockname", fd), _sockaddr("getpeername", fd)
