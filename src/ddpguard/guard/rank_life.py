"""Life of the whole rank beyond its training thread: the rank's other threads, the processes
below it, and bytes moving on its sockets.

A training thread that waits on a `multiprocessing.Pool`, a subprocess, a future or a slow
download shows no life of its own; the work it waits for does. `sample` says which of these
kinds of work moved since the previous sample:

- "threads": the rank's other threads together burnt at least THREAD_CPU of a core, or read
  or wrote at least IO_RATE (a ThreadPoolExecutor writing a file);
- "children": the processes below the rank (live ones, and those that exited and were
  waited for) burnt at least CHILD_CPU of a core together, or read or wrote IO_RATE;
- "socket": bytes arrived on, or were acknowledged from, one of the rank's TCP sockets that is
  not the job's own (see below).

Thresholds, and why idle helpers never reach them: a waiting thread or process (pin-memory,
a sleeping pool worker, a DataLoader worker waiting on its queue, torch's idle thread pools)
wakes now and then for microseconds; OpenMP workers spin at most ~200 ms after the last
parallel region before they sleep. So threads and children count only when they pass their
threshold in two samples in a row (about a second of real work: one burst of a peer's bytes
does not), never in the first sample after the training thread's own last sign (which spans
its last op and the OpenMP spin-down after it), and torch's own helper threads, which carry
the job's collectives and store traffic (named pt_gloo*, pt_nccl*, pt_tcpstore*: the store server in
rank 0 answers every rank's guard), are subtracted. Socket bytes count at once while the
training thread is itself blocked reading (a trickling download may deliver a chunk only now
and then, and each chunk is progress), otherwise also only when sustained.

The job's own traffic is not life: sockets open when the guard started (the process group's
gloo connections, the store clients), sockets to the same remote ends or accepted on the same
listening ports as those, and anything on MASTER_PORT. Whether any of this is looked at is
decided by the caller (life.py): only while the training thread shows no life of its own,
sits inside a call into C and does not wait in a collective. Between those times `skip()` is
called instead; the next sample then measures rates over the longer span since the last one.
"""

from __future__ import annotations

import os
import threading
import time

from . import vitals

__all__ = ["RankLife", "THREAD_CPU", "CHILD_CPU", "IO_RATE"]

# CPU shares are low on purpose: on a crowded machine a busy pool may get a fraction of a core,
# while idle helpers stay at a clock tick (10 ms) now and then.
THREAD_CPU = 0.10  # share of one core, other threads together, two samples in a row
CHILD_CPU = 0.10  # share of one core, all descendants together, two samples in a row
IO_RATE = 64 * 1024  # bytes read + written per second (other threads, or descendants)
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
        self._stale = False
        self._was: set[str] = set()
        # tid -> is it one of torch's own threads; their last (cpu, io), and what exited ones
        # had (it stays in the process's totals, so it stays subtracted).
        self._torch_tid: dict[int, bool] = {}
        self._torch_last: dict[int, tuple[float, int]] = {}
        self._torch_gone = (0.0, 0)
        self._threads = self._read_threads()
        self._kids = self._read_children()
        # Sockets: inode -> bytes, for sockets that are not the job's own; inodes known to be
        # the job's own, or not TCP, are skipped.
        self._socks: dict[int, int] = {}
        self._skip_socks: set[int] = set()
        self._job_remote: set[tuple[str, int]] = set()
        self._job_listen: set[int] = set()
        self._port = _master_port()
        self._mark_job_sockets()

    # -- readers --------------------------------------------------------------------------------

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

    def _read_threads(self) -> tuple[float, int]:
        """(CPU seconds, bytes) of the process less the training thread, the guard's thread
        and torch's own threads: a few reads, however many threads the rank has."""
        cpu, io = vitals.own_cpu() or 0.0, vitals.own_io() or 0
        tids = set(vitals.task_ids())
        for tid in list(self._torch_tid):
            if tid not in tids:
                del self._torch_tid[tid]
                c, b = self._torch_last.pop(tid, (0.0, 0))
                self._torch_gone = (self._torch_gone[0] + c, self._torch_gone[1] + b)
        # (a set: at construction the caller may be the training thread itself)
        minus = {threading.get_native_id()} | ({self.train_tid} if self.train_tid else set())
        for tid in tids:
            known = self._torch_tid.get(tid)
            if known is None:
                known = self._torch_tid[tid] = vitals.task_name(tid).startswith(_TORCH_THREADS)
            if known:
                minus.add(tid)
        for tid in minus:
            c, b = vitals.task_cpu(tid) or 0.0, vitals.task_io(tid) or 0
            if tid in self._torch_last or self._torch_tid.get(tid):
                self._torch_last[tid] = (c, b)
            cpu, io = cpu - c, io - b
        return cpu - self._torch_gone[0], io - self._torch_gone[1]

    @staticmethod
    def _read_children() -> tuple[float, int]:
        """Totals over the processes below this one. CPU includes reaped children, so a
        child's seconds move from its own entry to the reaped total when it exits and the
        total only grows by what was burnt in between."""
        cpu = vitals.reaped_cpu() or 0.0
        io = 0
        for pid in vitals.descendants():
            cpu += vitals.proc_cpu(pid) or 0.0
            io += vitals.proc_io(pid) or 0
        return cpu, io

    def _read_sockets(self, count_new: bool) -> int:
        """Bytes moved on sockets that are not the job's own. A socket first seen now counts
        from zero (it opened since the last look) unless looks were skipped."""
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
            moved += max(0, n - self._socks.get(ino, 0 if count_new else n))
        self._socks = live
        return moved

    # -- one tick ---------------------------------------------------------------------------

    def skip(self) -> None:
        """This tick is not sampled (the training thread shows life of its own, or waits in
        a collective): the next sample spans the gap."""
        self._stale = True

    def sample(self, now: float | None = None, reading: bool = False) -> str | None:
        """The kind of whole-rank life seen since the previous sample, or None. `reading`: the
        training thread is blocked in a read or poll (socket bytes then count at once)."""
        now = time.monotonic() if now is None else now
        dt = max(now - self._at, 1e-3)
        stale, self._stale, self._at = self._stale, False, now
        threads, kids = self._read_threads(), self._read_children()
        active = set()
        if (threads[0] - self._threads[0] >= THREAD_CPU * dt
                or threads[1] - self._threads[1] >= IO_RATE * dt):
            active.add("threads")
        if kids[0] - self._kids[0] >= CHILD_CPU * dt or kids[1] - self._kids[1] >= IO_RATE * dt:
            active.add("children")
        self._threads, self._kids = threads, kids
        if self._read_sockets(count_new=not stale) > 0:
            active.add("socket")
        # A sample after a gap spans the training thread's own last work (and the OpenMP
        # spin-down after its last op): it neither counts nor serves as the first of two.
        was = set() if stale else self._was
        self._was = set() if stale else active
        if "socket" in active and reading and not stale:
            return "socket"
        for kind in ("children", "threads", "socket"):
            if kind in active and kind in was:
                return kind
        return None
