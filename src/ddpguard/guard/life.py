"""Signs of life of a rank, sampled from the guard thread.

A rank that keeps the others waiting is only hung if it shows no sign of life at all. Counted as
life of the training thread: batches, optimizer steps, DDP forward calls, completed collectives
(all fed in as one progress number), bytes the training thread reads or writes (a checkpoint
being written, a dataset being read), its Python stack moving between functions, and CPU time
spent while the stack sits still inside one call into C (a long kernel). Not counted: CPU time
while the Python stack stays in one function and runs its own bytecode (the guard thread finds
it at a loop's back-edge, never inside a call): that is a loop that never calls anything, the
signature of `while True: ...` spinning on one rank; nor the calls of a busy-wait poll's
condition (`while not cfg.get("ready"): pass`, polls.py): they move the stack, but a loop that
only evaluates its condition waits, and only what the rest of the rank does counts then.

While the training thread shows none of these, sits inside a call into C (waiting on a pool, a
subprocess, a future, a socket) and not in a collective, the work of the rest of the rank
counts too: its other threads, the processes below it and bytes on its own sockets
(rank_life.py, with thresholds that idle helpers never reach; looked at only then, so steady
training pays nothing for it). Not while it waits in a collective: then the rank is
blocked whatever its helpers do, and the job's own traffic (gloo, the store) must not make a
rank that waits for a dead or mismatched peer look alive; nor while it spins in bytecode: a
busy helper must not hide a training thread stuck in `while True:`.
"""

from __future__ import annotations

import dis
import linecache
import sys
import time
from typing import Any

from . import vitals
from .polls import poll_site
from .rank_life import RankLife
from .stacks import fmt_frame

__all__ = ["LifeSignals", "stack_signature"]


# Where a thread running pure Python bytecode stops for the guard thread (the interpreter
# hands over the GIL at loop back-edges and function entries); a thread inside a call into C
# sits on a call or operator instruction instead.
_PYTHON_LOOP_OPS = {"JUMP_ABSOLUTE", "RESUME"}  # plus every *BACKWARD* jump (3.11: also the
# conditional POP_JUMP_BACKWARD_IF_TRUE that closes a `while cond:` loop)


def _opname(frame: Any) -> str:
    try:
        return dis.opname[frame.f_code.co_code[frame.f_lasti]]
    except (IndexError, AttributeError, TypeError):
        return "?"


def stack_signature(frame: Any) -> tuple[tuple[tuple[str, str], ...], bool]:
    """((file, function) for every frame, innermost first), and whether the innermost frame
    sits inside a call into C (rather than spinning in its own bytecode). Line numbers are
    left out: a loop moving between lines of one function is not 'moving'."""
    funcs = []
    in_c = False
    f = frame
    if f is not None:
        op = _opname(f)
        in_c = op not in _PYTHON_LOOP_OPS and "BACKWARD" not in op
    while f is not None:
        funcs.append((f.f_code.co_filename, f.f_code.co_name))
        f = f.f_back
    return tuple(funcs), in_c


def _thread_io(native_id: int | None) -> int | None:
    """rchar + wchar of one thread (Linux); None where the kernel does not tell."""
    return vitals.task_io(native_id) if native_id is not None else None


def _thread_cpu(native_id: int | None) -> float | None:
    """User + system CPU seconds of one thread (Linux)."""
    return vitals.task_cpu(native_id) if native_id is not None else None


LOOKS = 5
LOOK_GAP = 0.002


class LifeSignals:
    """Call `sample(progress)` once per guard tick. It returns the kind of life seen since the
    previous sample, or None; `last_life` is the monotonic time of the latest sign."""

    def __init__(self, ident: int | None, native_id: int | None) -> None:
        self.ident = ident
        self.native_id = native_id
        now = time.monotonic()
        self.last_life = now
        self.last_kind = "start"
        self._progress = -1
        self._io = _thread_io(native_id)
        self._cpu = _thread_cpu(native_id)
        self._sig: tuple[Any, ...] | None = None
        self.spinning = False  # the latest sample found a loop burning CPU in its own bytecode
        self._poll: tuple[Any, ...] | None = None  # the busy-wait loop of the last sample
        self.poll_at: str | None = None  # 'file:line in func  `code`' of a stuck busy-wait
        self._at = now
        self.rank = RankLife(native_id, now)

    def sample(self, progress: int, now: float | None = None,
               waiting: bool = False) -> str | None:
        """`waiting`: the training thread waits in a collective (the ledger has one pending,
        or its stack is in one); only its own signs count then."""
        now = time.monotonic() if now is None else now
        kind = None
        if progress != self._progress:
            kind = "progress" if self._progress >= 0 else None
            self._progress = progress
        io = _thread_io(self.native_id)
        if io is not None and self._io is not None and io > self._io:
            kind = kind or "io"
        self._io = io
        # A few looks, a couple of milliseconds apart (the GIL is let go in between): a loop of
        # small tensor ops is caught inside one of them at least once in a while; a loop of
        # bare bytecode never is.
        sigs, in_c, running = [], False, 0
        for i in range(LOOKS):
            if i:
                time.sleep(LOOK_GAP)
            frame = sys._current_frames().get(self.ident) if self.ident is not None else None
            sig, c = stack_signature(frame) if frame is not None else ((), False)
            sigs.append(sig)
            in_c = in_c or c
            # Read at every look, not once: a kernel split over intra-op threads leaves its
            # caller asleep at the pool's barrier now and then. Two looks of five are asked
            # for: a thread that sleeps in a poll (`Popen.wait(timeout=...)`, a sleep loop) is
            # caught runnable at one look now and then, just as it wakes.
            if c and running < 2 and self.native_id is not None:
                running += vitals.task_runnable(self.native_id)
        runnable = running >= 2
        sig = sigs[-1]
        cpu = _thread_cpu(self.native_id)
        moved = self._sig is not None and any(s != self._sig for s in sigs)
        burning = (cpu is not None and self._cpu is not None and now > self._at
                   and (cpu - self._cpu) >= 0.2 * (now - self._at))
        # A busy-wait `while not ready(): pass` that has not left its loop since the last
        # sample: the calls of its condition move the stack, but they are no work.
        poll = None
        if kind is None and not waiting and self.ident is not None and (moved or in_c):
            try:  # a fresh look: a generator's frame seen earlier may have finished, cut loose
                poll = poll_site(sys._current_frames().get(self.ident))
            except Exception:  # another thread's frame, read while it runs
                poll = None
        polling = poll is not None and poll == self._poll
        self._poll = poll
        # Where a report must point: the loop's line, not the helper its condition calls.
        self.poll_at = (fmt_frame({"file": poll[2], "line": poll[3], "func": poll[1].co_name,
                                   "code": linecache.getline(poll[2], poll[3]).strip()})
                        if polling and poll is not None else None)
        # Burning CPU in its own bytecode in one function: a loop that calls nothing.
        self.spinning = bool(self._sig is not None and burning
                             and (polling or (not moved and not in_c)))
        if moved and not polling:
            kind = kind or "stack"
        elif not polling and self._sig is not None and in_c and (burning or runnable):
            # Still inside one call into C and burning CPU: a long kernel, not a wait. On a
            # machine with more runnable threads than cores the kernel may get less than a
            # fifth of one; runnable (state R) is still computing, where a wait sleeps.
            kind = kind or "cpu"
        # The rest of the rank, only when it can matter (and costs nothing in steady training):
        # a poll may wait for a thread or a child of the rank that works.
        if kind is None and (in_c or polling) and not waiting:
            reading = (self.native_id is not None
                       and vitals.task_syscall(self.native_id) in vitals.READ_WAITS)
            kind = self.rank.sample(now, reading=reading)
        else:
            self.rank.skip()
        self._sig, self._cpu, self._at = sig, cpu, now
        if kind is not None:
            self.last_life, self.last_kind = now, kind
        return kind

    def quiet_for(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.last_life
