"""A rank whose own code raised: `handle_exception(exc) -> exit code` says what happened and,
where the guard can explain the end, stops the job with its report (exit 17).

Callable from anywhere on the rank's main thread once the exception is caught: the bootstrap
around `runpy` (`ddpguard run script.py`), a `sys.excepthook` (`ddpguard.init()`, and the
launch of `ddpguard run -- COMMAND`), a wrapper around an `mp.spawn` rank's function.

- a collective that failed on the process group's own timeout: the report names the timeout,
  what each peer was doing then (alive and working at a line, or itself blocked) and the
  setting to change;
- a DataLoader worker that was killed: the line that iterates its loader, the signal, and
  whether the cgroup's OOM killer struck;
- a collective that failed because a peer died (gloo aborted it inside a collective the
  others did not match, a segfault, the OOM killer): the peer's last words from its fault log
  against this rank's collective and line;
- anything else: the traceback and one line, and the peers that wait for this rank write
  the report.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import runpy
import signal
import sys
import threading
import time
import traceback
from typing import Any

from . import channel, procs
from .crash_ends import timed_out, worker_death_of, worker_killed
from .ends import (
    timeout_ms,
    worker_death,
)
from .fault import last_words
from .handles import GuardHandle
from .ledger import describe_entry, first_pending
from .rules import Decision
from .stacks import Frame, is_library_file, short_path
from .unwinding import PEER_GONE_WORDS

__all__ = ["handle_exception", "report_exception", "report_until_settled", "settle",
           "install_excepthook", "await_report", "explained_end", "crash_text",
           "waiting_on", "peer_failures", "peer_error"]

_HOOK_MARK = "__ddpguard_crash_hook__"
_REPORTED = "__ddpguard_reported__"

log = logging.getLogger("ddpguard.guard")


def await_report(g: GuardHandle, wait: float) -> None:
    """After this rank crashed: give the ranks that wait for it up to `wait` seconds to
    notice and write the report (where everyone was), before this process exits and the
    launcher or the transport cuts them off. Returns as soon as the report is written."""
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline:
            if "reported" in g.store_get_many(["reported"]):
                return
            time.sleep(0.1)
    except Exception as exc:  # the store may be gone: leave
        log.debug("no report awaited: %s", exc)

def waiting_on(g: GuardHandle) -> str:
    """' while in all_reduce #57 (group 0) ...': the collective this rank had pending, or
    its latest one (a collective that failed counts as completed)."""
    try:
        status = g.ledger.status() if g.ledger.available else {}
        entries = g.ledger.entries() if status else []
    except Exception:
        return ""
    pend = [e for e in entries if e[0] in status
            and status[e[0]][1] < e[1] <= status[e[0]][0]]
    last = [e for e in entries if e[0] in status and e[1] == status[e[0]][0]]
    first = first_pending(pend) or (max(last, key=lambda e: e[1]) if last else None)
    return f" in {describe_entry(first)}" if first else ""

def peer_failures(g: GuardHandle, wait: float = 1.5) -> list[str]:
    """Which other ranks crashed, died or left, for a rank whose own collective just failed
    with a connection error that blames nobody in particular."""
    deadline = time.monotonic() + wait
    while True:
        found = []
        try:
            peers = g.read_peers()
        except Exception:
            peers = {}
        now = time.monotonic()
        for r, hb in sorted(peers.items()):
            if r == g.rank:
                continue
            if hb.get("state") == "crashed":
                found.append(f"rank {r} crashed ({hb.get('error')})")
            elif hb.get("state") == "exited":
                # It destroyed its group or left the program on purpose while this rank's
                # collective still needed it: the transport's "connection closed" is its echo.
                found.append(f"rank {r} exited (left the job or destroyed its process group)")
            elif hb.get("host") == g.host and not procs.pid_alive(int(hb.get("pid", 0))):
                found.append(f"rank {r} died (process {hb.get('pid')} is gone"
                             f"{g.peers.oom_text()}){last_words(hb.get('fault'), hb.get('main'))}")
        if found or now > deadline:
            return found
        time.sleep(0.1)


def crash_text(exc: BaseException) -> str:
    """'ValueError: bad batch at train.py:95 in step': the error and its innermost user line,
    from the traceback's frames alone."""
    where = _innermost_user(exc)
    at = f" at {short_path(where.rsplit(':', 1)[0])}:{where.rsplit(':', 1)[1]}" if where else ""
    return f"{type(exc).__name__}: {exc}{at}"


def explained_end(exc: BaseException) -> bool:
    """Is `exc` an end the guard explains from the peers (a peer gone, the group's timeout, a
    killed loader worker), not the program's own error?"""
    text = str(exc)
    return (peer_error(exc) or timeout_ms(text, None) is not None
            or worker_death(text) is not None)


def peer_error(exc: BaseException) -> bool:
    """gloo/NCCL errors that mean 'the other side went away', not a bug on this rank."""
    low = str(exc).lower()
    return any(s in low for s in PEER_GONE_WORDS)


def _user_tb(exc: BaseException) -> Any:
    """The traceback from the script's first frame on: the bootstrap's and runpy's frames are
    ours, not the user's (Python run directly would not show them)."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename == runpy.__file__
                              or "runpy" in tb.tb_frame.f_code.co_filename
                              or tb.tb_frame.f_code.co_filename.endswith(
                                  os.path.join("ddpguard", "guard", "bootstrap.py"))):
        tb = tb.tb_next
    return tb or exc.__traceback__


def _frames(exc: BaseException) -> list[Frame]:
    """The error's traceback as report frames, outermost first (as captured stacks are)."""
    return [{"file": f.filename, "line": f.lineno or 0, "func": f.name,
             "code": (f.line or "").strip()}
            for f in traceback.extract_tb(_user_tb(exc))]


def handle_exception(exc: BaseException) -> int:
    """This rank's own code raised `exc` (caught on the main thread): say where, name the end
    when the guard can explain it (then the job stops with the report and exit 17, and this
    call does not return), else let the waiting ranks report. Returns the exit code."""
    from ddpguard import guard

    _quiet_sigchld()
    if getattr(exc, _REPORTED, False):
        return 1  # told already (on its way through destroy_process_group)
    with contextlib.suppress(Exception):
        setattr(exc, _REPORTED, True)
    g: Any = guard.active()
    if g is not None:
        # First of all, before any store request: its launcher may end this rank at any
        # moment once a peer died (mp.spawn within milliseconds), and then this note is what
        # `ddpguard run` reads (launch/postmortem.py), the stack at the SIGTERM being ours,
        # not the script's. From here the rank's end is told by its exception.
        g.fault_log.note("error", f"{_innermost_user(exc)}|{type(exc).__name__}: {exc}")
    if g is not None and (g.failure.active or g.store_get_many(["trigger"])):
        # The guard is stopping the job and this error is its echo (a peer left the
        # collective): let the guard thread finish its report and exit.
        time.sleep(30)
    frames = _frames(exc)
    user = next((f for f in reversed(frames) if not is_library_file(f["file"])),
                frames[-1] if frames else None)
    place = f"{short_path(user['file'])}:{user['line']} in {user['func']}" if user else ""
    at = f" at {short_path(user['file'])}:{user['line']}" if user else ""
    text = f"{type(exc).__name__}: {exc}{at}"
    rank = os.environ.get("RANK", "?") if g is None else str(g.rank)
    # The traceback Python would have printed, through our descriptor: the script's own
    # sys.stderr may be /dev/null on this rank.
    channel.write("".join(traceback.format_exception(type(exc), exc, _user_tb(exc))).rstrip())
    waiting = waiting_on(g) if g is not None else ""
    if g is not None:
        ms = timeout_ms(str(exc), _group_timeout_ms())
        if ms is not None:
            return timed_out(g, ms, waiting, place, text, frames)
        death = worker_death_of(exc, frames)
        if death is not None:
            return worker_killed(g, death, place, text, frames)
    others = peer_failures(g) if g is not None and peer_error(exc) else []
    cause = g.exchange.on_crash() if g is not None and not others else None
    if others:
        text = f"{type(exc).__name__} because {'; '.join(others)}"
        channel.write(f"ddpguard: rank {rank} stopped{at}{waiting}: a peer failed first: "
                      f"{'; '.join(others)}")
    elif cause:
        text = f"{type(exc).__name__} after a desync: {cause}"
        channel.write(f"ddpguard: rank {rank} crashed: {type(exc).__name__}: {exc}{at}\n"
                      f"ddpguard: the real cause: {cause}")
    else:
        channel.write(f"ddpguard: rank {rank} crashed: {text}")
    if g is not None and others:
        # A peer died and took this rank's collective with it: the guard's proof ("a peer
        # gone while this rank waits"), reported as such, with exit 17 and the JSON report.
        culprits = tuple(sorted({int(m) for m in re.findall(r"rank (\d+)", "; ".join(others))}
                                - {g.rank}))
        line = f" issued at {place}" + (f" (`{user['code']}`)" if user and user["code"] else "")
        g.failure.crashed(frames)
        g.failure.fail(Decision("peer_gone", f"{'; '.join(others)}, while rank {g.rank} "
                                f"waited{waiting or ' in a collective'}{line if user else ''}",
                                culprits), g.read_peers())
    guard.stop("crashed", text)
    if g is not None and not others:
        await_report(g, g.config.grace + 3.0)
    return 1


def _group_timeout_ms() -> int | None:
    """The default process group's timeout (its backend's options), or None."""
    try:
        import torch
        import torch.distributed as dist

        pg = dist.distributed_c10d._get_default_group()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return int(pg._get_backend(device).options._timeout.total_seconds() * 1000)
    except Exception:  # torch changed, or no group: the report says the timeout without it
        return None


def _innermost_user(exc: BaseException) -> str:
    """'file:line in func' of the error's innermost frame in the user's code, read from the
    traceback's frames alone (no source lines: this must take microseconds)."""
    tb, found = exc.__traceback__, ""
    while tb is not None:
        code = tb.tb_frame.f_code
        if not is_library_file(code.co_filename):
            found = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"
        tb = tb.tb_next
    return found


def _quiet_sigchld() -> None:
    """torch's DataLoader raises a dead worker's error from a SIGCHLD handler, at the main
    thread's next bytecode, and again at every SIGCHLD while that worker is registered: one
    arriving during this crash path (a late one, or the failure path ending child processes)
    would cut the report short. The rank is ending: its SIGCHLD goes back to the default."""
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def report_exception(exc: BaseException, earlier: BaseException | None = None) -> int:
    """handle_exception, and one line instead of a traceback of ours if our own handling
    fails: nothing of ddpguard may end a rank with an error of its own. `earlier`: the
    rank's first error, where `exc` was raised while the caller handled it (settle)."""
    if earlier is not None and earlier is not exc:
        exc = _later(earlier, exc)
    exc = settle(exc)
    try:
        return handle_exception(exc)
    except BaseException as inner:
        channel.write(f"ddpguard: rank {os.environ.get('RANK', '?')} crashed: "
                      f"{type(exc).__name__}: {exc} (and the guard could not report it: "
                      f"{type(inner).__name__}: {inner})")
        return 1


def settle(exc: BaseException) -> BaseException:
    """The error to report once torch's SIGCHLD handler is quiet. A DataLoader worker that
    dies while sending a batch ends the rank's read with a connection reset, and its SIGCHLD
    arrives with it: torch's handler raises the worker's own error at whatever call runs
    next (runpy's, ours). That later error names the worker and the signal, so it is the one
    reported, at the place of the error it interrupted."""
    for _ in range(_SETTLE_TRIES):
        try:
            _quiet_sigchld()
            break
        except Exception as late:
            exc = _later(exc, late)
    return _placed(exc)


_SETTLE_TRIES = 4


def _later(exc: BaseException, late: BaseException) -> BaseException:
    """`late`, raised while `exc` was being handled, chained to it."""
    if late is not exc and late.__context__ is None:
        late.__context__ = exc
    return late


def _placed(exc: BaseException) -> BaseException:
    """A dead worker's error raised while another error was being handled is told at that
    error's place (where the rank stood: its read of the batch), not where torch's handler
    happened to run."""
    ctx = exc.__context__
    if ctx is not None and worker_death(str(exc)) and _innermost_user(ctx):
        # (A context caught inside torch, as its own polling does, holds no line of the
        # script: the error's own traceback does.)
        return exc.with_traceback(ctx.__traceback__)
    return exc


def report_until_settled(exc: BaseException) -> int:
    """report_exception, for a caller that has `exc` in hand (an excepthook, a wrapper): an
    error torch's SIGCHLD handler raises at the call itself is reported in its place instead
    of escaping the caller with no report at all."""
    earlier = exc
    for _ in range(_SETTLE_TRIES):
        try:
            return report_exception(exc, earlier)
        except Exception as late:
            exc = late
    return report_exception(exc, earlier)


def install_excepthook() -> None:
    """Where nothing wraps the script (`ddpguard.init()`, `ddpguard run -- COMMAND`): an
    exception that reaches the top of the main thread goes through handle_exception while the
    guard runs. A plain crash still ends as Python would (exit 1, atexit handlers run); an end
    the guard explains ends with its report and exit 17. Idempotent."""
    previous = sys.excepthook
    if getattr(previous, _HOOK_MARK, False):
        return

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        from ddpguard import guard

        if guard.active() is None or not isinstance(exc, Exception):
            previous(kind, exc, tb)
            return
        code = report_until_settled(exc)
        if code != 1:
            os._exit(code)

    setattr(hook, _HOOK_MARK, True)
    sys.excepthook = hook
