"""Life of the whole rank beyond its training thread: the rank's other threads, the processes
below it, and bytes moving on its sockets.

A training thread that waits on a `multiprocessing.Pool`, a subprocess, a future or a slow
download shows no life of its own; the work it waits for does. Each tick (`sample`) says which
of these kinds of work moved since the previous tick:

- "threads": another thread of the rank burnt at least THREAD_CPU of a core, or the other
  threads together read or wrote at least IO_BYTES (a ThreadPoolExecutor writing a file);
- "children": the processes below the rank (live ones, and those that exited and were
  waited for) burnt at least CHILD_CPU of a core together, or read or wrote IO_BYTES;
- "socket": bytes arrived on, or were acknowledged from, one of the rank's TCP sockets that is
  not the job's own (see below).

Thresholds, and why idle helpers never reach them: a waiting thread or process (pin-memory,
gloo's and NCCL's threads, a sleeping pool worker, a DataLoader worker waiting on its queue,
torch's idle thread pools) wakes now and then for microseconds; OpenMP workers spin at most
~200 ms after the last parallel region before they sleep. So threads and children count only
when they pass their threshold in two windows in a row (about a second of real work: one
OpenMP spin-down, or one burst of a peer's bytes, never does), and torch's own helper threads
(named pt_gloo*, pt_nccl*, pt_tcpstore*) are never looked at. Socket bytes count at once while
the training thread is itself blocked reading (a trickling download may deliver a chunk only
now and then, and each chunk is progress), otherwise also only when sustained.

The job's own traffic is not life: sockets open when the guard started (the process group's
gloo connections, the store clients), sockets to the same remote ends or accepted on the same
listening ports as those, and anything on MASTER_PORT. Whether any of this counts at all is
decided by the caller (life.py): not while the training thread waits in a collective, and not
while it spins in its own bytecode.
"""

from __future__ import annotations

import os
import threading
import time

from . import vitals

__all__ = ["RankLife", "THREAD_CPU", "CHILD_CPU", "IO_BYTES"]

THREAD_CPU = 0.25  # share of one core, one thread, in each of two windows in a row
CHILD_CPU = 0.25  # share of one core, all descendants together, two windows in a row
IO_BYTES = 32 * 1024  # bytes read + written per window (other threads, or descendants)
_TORCH_THREADS = ("pt_gloo", "pt_nccl", "pt_tcpstore")


def _master_port() -> int | None:
    try:
        return int(os.environ.get("MASTER_PORT", ""))
    except ValueError:
        return None


class RankLife:
    """Whole-rank signs of life. `train_tid` is the training thread's native id (it has its
    own signs in life.py); the thread calling `sample` (the guard's) is never counted."""

    def __init__(self, train_tid: int | None, now: float | None = None) -> None:
        self.train_tid = train_tid
        self._at = time.monotonic() if now is None else now
        self._cpu: dict[int, float] = {}
        self._tio: dict[int, int] = {}
        self._skip_tids: dict[int, bool] = {}
        self._kids_cpu: float | None = None
        self._kids_io: int | None = None
        self._was: set[str] = set()
        # Sockets: inode -> counted bytes, for sockets that are not the job's own; inodes
        # known to be the job's own or not TCP are skipped.
        self._socks: dict[int, int] = {}
        self._skip_socks: set[int] = set()
        self._job_remote: set[tuple[str, int]] = set()
        self._job_listen: set[int] = set()
        self._port = _master_port()
        self._mark_job_sockets()
        self._read_threads(first=True)
        self._kids_cpu, self._kids_io = self._read_children()
        self._read_sockets(first=True)

    # -- readers (each returns this window's amounts and updates the baselines) ---------------

    def _mark_job_sockets(self) -> None:
        for ino, fd in vitals.socket_fds().items():
            self._skip_socks.add(ino)
            local, remote = vitals.endpoints(fd)
            if remote is not None:
                self._job_remote.add(remote)
            elif local is not None:
                self._job_listen.add(local[1])

    def _is_job_socket(self, fd: int) -> bool:
        local, remote = vitals.endpoints(fd)
        ports = {p for p in (local and local[1], remote and remote[1]) if p}
        return (remote in self._job_remote or (local is not None and remote is not None
                                               and local[1] in self._job_listen)
                or (self._port is not None and self._port in ports))

    def _read_threads(self, first: bool = False) -> tuple[float, int]:
        """(the largest CPU seconds one other thread burnt, bytes all of them moved)."""
        me = threading.get_native_id()
        top, moved = 0.0, 0
        cpu: dict[int, float] = {}
        tio: dict[int, int] = {}
        tids = set(vitals.task_ids())
        self._skip_tids = {t: s for t, s in self._skip_tids.items() if t in tids}
        for tid in tids:
            if tid in (me, self.train_tid):
                continue
            skip = self._skip_tids.get(tid)
            if skip is None:
                skip = self._skip_tids[tid] = vitals.task_name(tid).startswith(_TORCH_THREADS)
            if skip:
                continue
            c, b = vitals.task_cpu(tid), vitals.task_io(tid)
            if c is not None:
                cpu[tid] = c
                # A thread first seen now started during this window: all it did is new.
                top = max(top, c - self._cpu.get(tid, 0.0 if not first else c))
            if b is not None:
                tio[tid] = b
                moved += max(0, b - self._tio.get(tid, 0 if not first else b))
        self._cpu, self._tio = cpu, tio
        return top, moved

    @staticmethod
    def _read_children() -> tuple[float, int]:
        """Totals over the processes below this one. CPU includes reaped children, so a
        child's seconds move from its own entry to the reaped total when it exits and the
        total only grows by what was burnt in the window."""
        cpu = vitals.reaped_cpu() or 0.0
        io = 0
        for pid in vitals.descendants():
            cpu += vitals.proc_cpu(pid) or 0.0
            io += vitals.proc_io(pid) or 0
        return cpu, io

    def _read_sockets(self, first: bool = False) -> int:
        """Bytes moved on sockets that are not the job's own."""
        moved = 0
        live: dict[int, int] = {}
        for ino, fd in vitals.socket_fds().items():
            if ino in self._skip_socks:
                continue
            n = vitals.tcp_bytes(fd)
            if n is None or (ino not in self._socks and self._is_job_socket(fd)):
                self._skip_socks.add(ino)
                continue
            live[ino] = n
            moved += max(0, n - self._socks.get(ino, n if first else 0))
        self._socks = live
        return moved

    # -- one tick ------------------------------------------------------------------------------

    def sample(self, now: float | None = None, reading: bool = False) -> str | None:
        """The kind of whole-rank life seen since the previous call, or None. `reading`: the
        training thread is blocked in a read or poll (socket bytes then count at once)."""
        now = time.monotonic() if now is None else now
        dt = max(now - self._at, 1e-3)
        self._at = now
        top, tmoved = self._read_threads()
        kcpu, kio = self._read_children()
        kids_cpu = max(0.0, kcpu - (self._kids_cpu if self._kids_cpu is not None else kcpu))
        kids_io = max(0, kio - (self._kids_io if self._kids_io is not None else kio))
        self._kids_cpu, self._kids_io = kcpu, kio
        smoved = self._read_sockets()
        active = set()
        if top >= THREAD_CPU * dt or tmoved >= IO_BYTES:
            active.add("threads")
        if kids_cpu >= CHILD_CPU * dt or kids_io >= IO_BYTES:
            active.add("children")
        if smoved > 0:
            active.add("socket")
        was, self._was = self._was, active
        if "socket" in active and reading:
            return "socket"
        for kind in ("children", "threads", "socket"):
            if kind in active and kind in was:
                return kind
        return None
