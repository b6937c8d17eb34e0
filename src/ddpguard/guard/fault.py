"""A rank's last words when native code kills it.

gloo aborts the process on a size mismatch ("Received data size doesn't match expected size"),
a CUDA or NCCL error can segfault it: the Python process never gets to say where it was. While
the guard runs, `faulthandler` writes every thread's Python stack to a small per-rank file on
SIGABRT, SIGSEGV, SIGFPE, SIGBUS and SIGILL; a surviving rank on the same host (or the report)
reads from it the thread that stood in a collective (the training thread, or a second thread
whose collective the backend paired with another rank's) and its user line. The file is
removed when the rank leaves normally. A script that enabled faulthandler itself keeps its own
setting. The log also starts the note of which loader each DataLoader worker serves
(workers.py): the other post-mortem a rank cannot write once the error has unwound its stack.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import json
import linecache
import os
import re
import signal
import tempfile
import threading
from dataclasses import dataclass
from typing import IO, Any

from . import workers
from .stacks import Frame, is_library_file

__all__ = ["FaultLog", "FaultThread", "last_words", "parse_fault", "read_fault", "fault_stacks",
           "fault_meta", "fault_notes", "fault_seen", "side_collectives", "HEADER"]

# Every line of ours starts so (faulthandler's never do). The first says who wrote the log, so
# that `ddpguard run` can read a dead job's logs without any rank alive to tell it
# (launch/postmortem.py); notes follow (FaultLog.note).
OURS = "# ddpguard "
HEADER = "# ddpguard fault log"
# The second line: where the rank last stood, rewritten in place (one pwrite, only when it
# moved) at each heartbeat. A rank SIGKILLed leaves no dump; this line says where it was seen
# last, and under mp.spawn, whose parent ends the survivors at once, no survivor can say it.
_SEEN = OURS + "seen: "
_SEEN_WIDTH = 640
_SEEN_KEYS = ("where", "epoch", "steps", "steps_epoch", "batches")
_SIGTERM_OWNER: list[int] = []  # the pid that registered the SIGTERM dump (forks drop it)

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_COLLECTIVES = frozenset({
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather",
    "scatter", "barrier", "all_gather_object", "broadcast_object_list", "gather_object",
    "scatter_object_list", "monitored_barrier"})
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')


class FaultLog:
    def __init__(self) -> None:
        self.path: str | None = None
        self._fh: IO[str] | None = None
        self._lock = threading.Lock()
        self._hook: Any = None
        # Collectives that failed in a thread other than the training thread: (thread,
        # collective, 'file:line in func', error). The stop path reads them (failing.py).
        self.side: list[tuple[str, str, str, str]] = []
        self._seen_at: int | None = None  # byte offset of the seen line
        self._seen_last: tuple[Any, ...] = ()

    def start(self, directory: str | None, run_id: str, rank: int, world_size: int = 0,
              main_ident: int | None = None, launch_id: str | None = None) -> str | None:
        workers.install()
        if faulthandler.is_enabled():
            return None  # the script's own choice
        try:
            folder = directory or tempfile.gettempdir()
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"ddpguard-fault-{run_id}-rank{rank}-{os.getpid()}.txt")
            self._fh = open(path, "w")  # noqa: SIM115 (kept open for the signal handler)
            main = main_ident if main_ident is not None else threading.main_thread().ident
            header = (f"{HEADER} rank={rank} world={world_size} pid={os.getpid()} "
                      f"main=0x{main or 0:016x} launch={launch_id or '-'}\n")
            self._fh.write(header + _SEEN.ljust(_SEEN_WIDTH - 1) + "\n")
            self._fh.flush()
            self._seen_at = len(header.encode())
            faulthandler.enable(self._fh, all_threads=True)
            self._dump_on_sigterm()
        except (OSError, ValueError, RuntimeError):
            return None
        self.path = path
        self._watch_threads()
        atexit.register(self.stop)  # a normal exit leaves nothing behind
        return path

    def _dump_on_sigterm(self) -> None:
        """A launcher ends the surviving ranks with SIGTERM the moment one rank dies (mp.spawn
        within milliseconds, torchrun's agent within 0.1 s): too soon for their guards to
        write a report. Their stacks at that moment, dumped by faulthandler's C handler
        before the default action ends the process, are what `ddpguard run` composes the
        report from. Only where nothing handles SIGTERM yet: a handler of the script's own
        (or one it installs later) keeps the signal."""
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL or self._fh is None:
            return
        faulthandler.register(signal.SIGTERM, self._fh, all_threads=True, chain=True)
        _SIGTERM_OWNER[:] = [os.getpid()]
        if not hasattr(os, "register_at_fork"):
            return
        if not getattr(_after_fork, "registered", False):
            os.register_at_fork(after_in_child=_after_fork)
            _after_fork.registered = True  # type: ignore[attr-defined]

    def seen(self, hb: Any) -> None:
        """Rewrite the seen line from this rank's heartbeat, if it moved since the last one."""
        fh, at = self._fh, self._seen_at
        if fh is None or at is None:
            return
        now = tuple(hb.get(k) for k in _SEEN_KEYS)
        if now == self._seen_last:
            return
        self._seen_last = now
        data = dict(zip(_SEEN_KEYS, now, strict=True), t=round(float(hb.get("t") or 0.0), 2))
        text = _SEEN + json.dumps(data, separators=(",", ":"))  # ASCII: bytes == characters
        if len(text) >= _SEEN_WIDTH:
            data["where"] = str(data["where"]).split("  `", 1)[0]  # drop the code text
            text = _SEEN + json.dumps(data, separators=(",", ":"))
        if len(text) >= _SEEN_WIDTH:
            return
        with contextlib.suppress(OSError, ValueError):
            os.pwrite(fh.fileno(), (text.ljust(_SEEN_WIDTH - 1) + "\n").encode(), at)

    def note(self, kind: str, text: str) -> None:
        """One line of ours in the log: what Python knew that a stack dump at the end cannot
        show (the error a rank is handling, a thread's failed collective). It stays if the
        rank is then ended by a signal."""
        fh = self._fh
        if fh is None:
            return
        with self._lock, contextlib.suppress(OSError, ValueError):
            fh.write(f"{OURS}{kind}: {' '.join(text.split())}\n")
            fh.flush()

    def _watch_threads(self) -> None:
        """A collective issued from a second thread fails there when the transport aborts the
        peer it was paired with, and the thread ends before any dump can show it: note it."""
        previous = threading.excepthook

        def hook(args: Any) -> None:
            try:
                if args.thread is not threading.main_thread() and args.exc_traceback:
                    site = _collective_site(args.exc_traceback)
                    if site is not None:
                        name = args.thread.name if args.thread is not None else "?"
                        error = f"{args.exc_type.__name__}: {args.exc_value}"
                        self.side.append((name, site[0], site[1], error))
                        self.note("thread-error", f"{name}|{site[0]}|{site[1]}|{error}")
            finally:
                previous(args)

        self._hook = (hook, previous)
        threading.excepthook = hook

    def stop(self) -> None:
        """Stop listening and remove the file, unless a fatal signal already wrote into it
        (then it is the dead rank's last words, for the report)."""
        workers.uninstall()
        if self._hook is not None:
            if threading.excepthook is self._hook[0]:
                threading.excepthook = self._hook[1]
            self._hook = None
        if self._fh is None:
            return
        with contextlib.suppress(Exception):
            faulthandler.disable()
        if [os.getpid()] == _SIGTERM_OWNER:
            with contextlib.suppress(Exception):
                faulthandler.unregister(signal.SIGTERM)
            _SIGTERM_OWNER.clear()
        with contextlib.suppress(OSError):
            self._fh.close()
        if self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self._fh, self.path = None, None


def _after_fork() -> None:
    """A forked child (a DataLoader worker) ended by SIGTERM must not dump its stacks into
    its rank's log, through the descriptor they share."""
    if _SIGTERM_OWNER and _SIGTERM_OWNER[0] != os.getpid():
        with contextlib.suppress(Exception):
            faulthandler.unregister(signal.SIGTERM)


def _collective_site(tb: Any) -> tuple[str, str] | None:
    """(collective, 'file:line in func') of a traceback that passes through a
    torch.distributed collective called from the user's code. Walks the frames itself:
    `traceback.extract_tb` reads every source line, too slow for a rank its launcher is
    about to end."""
    frames = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((code.co_filename, tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    name = next((fn for path, _, fn in frames if "torch/distributed/" in path.replace(os.sep, "/")
                 and fn in _COLLECTIVES), None)
    users = [f for f in frames if not is_library_file(f[0])]
    if name is None or not users:
        return None
    return name, f"{users[-1][0]}:{users[-1][1]} in {users[-1][2]}"


def fault_notes(text: str) -> list[tuple[str, str]]:
    """(kind, text) of each note of ours in a log. Pure."""
    out = []
    for line in text.splitlines():
        if line.startswith(OURS) and not line.startswith((HEADER, _SEEN)) and ": " in line:
            kind, _, rest = line[len(OURS):].partition(": ")
            out.append((kind, rest))
    return out


def fault_seen(text: str) -> dict[str, Any]:
    """Where the log's rank was last seen (its seen line), {} when it never moved. Pure."""
    for line in text.splitlines()[1:3]:
        if line.startswith(_SEEN) and line[len(_SEEN):].strip():
            with contextlib.suppress(ValueError):
                got = json.loads(line[len(_SEEN):])
                return got if isinstance(got, dict) else {}
    return {}


def side_collectives(text: str, main_ident: int | None) -> list[tuple[str, str, str]]:
    """(thread, collective, 'file:line in func') of every thread other than the training
    thread that stood in a collective in the dump, or failed in one (its note). Pure."""
    _, threads = parse_fault(text, main_ident)
    out = [(t.ident, *found) for t in threads if not t.main
           for found in [_collective(t)] if found is not None]
    for kind, rest in fault_notes(text):
        parts = rest.split("|")
        if kind == "thread-error" and len(parts) >= 3:
            out.append((parts[0], parts[1], parts[2]))
    return out


def fault_meta(text: str) -> dict[str, str]:
    """The header's fields (rank, world, pid, main, launch), {} for a log without one. Pure."""
    first = text.split("\n", 1)[0]
    if not first.startswith(HEADER):
        return {}
    return dict(kv.split("=", 1) for kv in first[len(HEADER):].split() if "=" in kv)


@dataclass(frozen=True)
class FaultThread:
    """One thread of a fault dump: its id, whether it is the training (main) thread, and its
    frames innermost first (file, line, function), as faulthandler writes them."""

    ident: str
    main: bool
    frames: tuple[tuple[str, int, str], ...]


def parse_fault(text: str, main_ident: int | None) -> tuple[str, list[FaultThread]]:
    """(first line, threads) of a faulthandler dump. Pure. The first line is the fatal
    error ('Fatal Python error: Aborted'); '' for a dump without one (the stacks a SIGTERM
    left: the rank was ended, it did not fail)."""
    lines = [ln for ln in text.strip().splitlines() if not ln.startswith(OURS)]
    head = lines[0].strip() if lines and not _THREAD.match(lines[0]) else ""
    want = f"0x{main_ident:016x}" if main_ident else None
    threads: list[FaultThread] = []
    current: str | None = None
    frames: list[tuple[str, int, str]] = []

    def close() -> None:
        if current is not None:
            threads.append(FaultThread(current, current == want, tuple(frames)))

    for line in lines:
        m = _THREAD.match(line)
        if m:
            close()
            current, frames = m.group(1).lower(), []
            continue
        f = _FRAME.match(line)
        if f and current is not None:
            frames.append((f.group(1), int(f.group(2)), f.group(3)))
    close()
    return head, threads


def _collective(t: FaultThread) -> tuple[str, str] | None:
    """(collective, 'file:line in func[, called from ...]') when the thread stands in a
    torch.distributed collective called from the user's code."""
    name = next((fn for path, _, fn in t.frames
                 if "torch/distributed/" in path and fn in _COLLECTIVES), None)
    users = [f"{path}:{line} in {fn}" for path, line, fn in t.frames
             if not is_library_file(path)]
    if name is None or not users:
        return None
    # A helper (an AverageMeter's all_reduce) is rarely the line to change: its caller, the
    # one under the rank condition, is named too.
    return name, users[0] + (f", called from {users[1]}" if len(users) > 1 else "")


def _training_line(t: FaultThread | None) -> str | None:
    if t is None:
        return None
    return next((f"{path}:{line} in {fn}" for path, line, fn in t.frames
                 if not is_library_file(path)), None)


def read_fault(path: str | None) -> str:
    if not path:
        return ""
    try:
        with open(path, errors="replace") as fh:
            return fh.read(65536)
    except OSError:
        return ""


def fault_stacks(path: str | None, main_ident: int | None,
                 text: str | None = None) -> dict[str, list[Frame]]:
    """A dead rank's stacks from its fault log, in the report's format (outermost first,
    'name (ident)' keys): the thread that stood in a collective first, since that is the
    one the report must name, then the training thread, then the rest."""
    head, threads = parse_fault(read_fault(path) if text is None else text, main_ident)
    if not threads:
        return {}
    order = sorted(threads, key=lambda t: (_collective(t) is None, not t.main))
    out: dict[str, list[Frame]] = {}
    for t in order:
        name = "MainThread" if t.main else "thread"
        out[f"{name} ({t.ident}) at {head or 'its end (ended by SIGTERM)'}"] = [
            {"file": p, "line": ln, "func": fn, "code": linecache.getline(p, ln).strip()}
            for p, ln, fn in reversed(t.frames)]
    return out


def last_words(path: str | None, main_ident: int | None, text: str | None = None) -> str:
    """' (it died of a fatal signal: ...; its training thread was at f:l in g)', or '' when
    there is nothing (no file, or the rank did not die of a fatal signal). A thread inside a
    torch.distributed collective is named with its line (the training thread's, or another
    thread's, said so: a collective from a second thread is paired by the backend with
    whatever the other ranks issue next); when the process aborted there, a collective the
    other ranks did not match is the usual cause (gloo aborts on a size mismatch)."""
    head, threads = parse_fault(read_fault(path) if text is None else text, main_ident)
    if not head:
        return ""
    main = next((t for t in threads if t.main), None)
    if main is None and main_ident is None and threads:
        main = threads[-1]  # faulthandler lists the oldest thread (the main one) last
    hint = (": a collective the other ranks did not match is the usual cause"
            if "Abort" in head else "")
    found = _collective(main) if main is not None else None
    if found:
        return (f" (it died of a fatal signal ({head}) inside torch.distributed.{found[0]} "
                f"called at {found[1]}{hint})")
    other = next(((t, c) for t in threads if t is not main
                  for c in [_collective(t)] if c is not None), None)
    at = _training_line(main)
    train = f"; its training thread was at {at}" if at else ""
    if other is not None:
        return (f" (it died of a fatal signal ({head}) inside torch.distributed.{other[1][0]} "
                f"called from a second thread (not the training thread) at {other[1][1]}"
                f"{train}{hint})")
    return f" (it died of a fatal signal: {head}{train})"
