"""What a rank checks as it leaves (destroys its group or exits): a desync that did not hang,
and a peer that already waits in a collective this rank never issued. The second is proof
that this rank left early, and this rank is the one that knows it first: under srun its own
launcher would otherwise see it exit 0 while the job hangs or dies behind it."""

from __future__ import annotations

import ast
import inspect
import linecache
import logging
import textwrap
import time
from collections.abc import Mapping
from typing import Any, cast

from .heartbeat import Heartbeat
from .ledger import describe_entry
from .records import Trigger
from .rules import Decision
from .stacks import fmt_frame, is_library_file

__all__ = ["waiting_for", "on_leave", "note_leave_site", "site_of_frame"]

log = logging.getLogger("ddpguard.guard")


def site_of_frame(frame: Any) -> str | None:
    """'train.py:88 in main  `sys.exit(0)`' for the innermost frame of user code at or
    above `frame` (a Python frame object); None when there is none."""
    while frame is not None and is_library_file(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return None
    path = frame.f_code.co_filename
    return fmt_frame({"file": path, "line": frame.f_lineno, "func": frame.f_code.co_name,
                      "code": linecache.getline(path, frame.f_lineno).strip()})


def note_leave_site(frame: Any) -> None:
    """Remember where this rank is leaving (the caller of sys.exit or of
    destroy_process_group): its exit heartbeat then names that line, not '?' (the stacks
    are gone by the time atexit runs)."""
    from ddpguard import guard

    g = guard.active()
    if g is not None and g.leave_site is None:
        g.leave_site = site_of_frame(frame)


def note_return_site(fn: Any) -> None:
    """A rank's function returned (mp.spawn's worker): its frame is gone, so name the one
    early `return` of its source, where it has exactly one, or else its last statement (the
    line it left from, after its loops: where a loop was left early, the report finds the
    loop's way out from there)."""
    from ddpguard import guard

    g = guard.active()
    if g is None or g.leave_site is not None:
        return
    line = early_return_line(fn)
    if line is None:
        line = last_statement_line(fn)
    path = inspect.getsourcefile(fn) if line is not None else None
    if line is not None and path:
        g.leave_site = fmt_frame({"file": path, "line": line, "func": fn.__name__,
                                  "code": linecache.getline(path, line).strip()})


def _function_tree(fn: Any) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, int] | None:
    """(the def's syntax tree, its first line) from `fn`'s source; None where it cannot be
    read."""
    try:
        lines, start = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None
    top = tree.body[0] if tree.body else None
    if not isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)) or not top.body:
        return None
    return top, start


def early_return_line(fn: Any) -> int | None:
    """The line of the one `return` of `fn` that is not its last statement (inside a loop or
    under an `if`), or None where it has none or several (nested functions' returns are
    theirs). Pure but for reading the source."""
    found = _function_tree(fn)
    if found is None:
        return None
    top, start = found
    nested = {id(n) for inner in ast.walk(top) if inner is not top
              and isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
              for n in ast.walk(inner)}
    early = [n for n in ast.walk(top) if isinstance(n, ast.Return)
             and n is not top.body[-1] and id(n) not in nested]
    return start + early[0].lineno - 1 if len(early) == 1 else None


def last_statement_line(fn: Any) -> int | None:
    """The line of `fn`'s last statement where it is a simple one (the last line a call that
    ran to its end executed); None for a compound one (a loop or `with` that ends it) or where
    the source cannot be read. Pure but for reading the source."""
    found = _function_tree(fn)
    if found is None:
        return None
    top, start = found
    last = top.body[-1]
    if isinstance(last, (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith,
                         ast.Try, ast.Match, ast.FunctionDef, ast.AsyncFunctionDef,
                         ast.ClassDef)):
        return None
    return start + last.lineno - 1


def waiting_for(me: int, status: Mapping[str, Any], peers: Mapping[int, Heartbeat]
                ) -> list[tuple[int, str, int]]:
    """(rank, 'all_reduce #104 (group 0) ...', 103) for each peer still running that waits in
    a collective numbered past the last one this rank issued in that group (one of its
    groups; that last number third): a collective this rank, leaving, will never join. Pure."""
    out = []
    for r, hb in sorted(peers.items()):
        if r == me or hb.get("state") != "running":
            continue
        for e in hb.get("pending") or []:
            g, seq = str(e[0]), int(e[1])
            if g in status and seq > int(status[g][0]):
                out.append((r, describe_entry(e), int(status[g][0])))
                break
    return out


def on_leave(g: Any, wait: float | None = None) -> Decision | Trigger | None:
    """The checks at a clean leave: another rank's stop already under way (this rank follows
    it: its launcher must not see exit 0 while the job is being stopped), a peer waiting in a
    collective this rank never issued (the decision to stop), then a desync that did not
    hang. Waits at most `wait` seconds (default: the peers' grace after a rank left, and 2 s
    more) for a peer's heartbeat to show it waiting or for its stop, and only while a peer
    still runs (a job whose ranks all left pays nothing)."""
    if wait is None:
        wait = float(g.config.grace) + 2.0
    try:
        status = g.ledger.status() if g.ledger.available else {}
        deadline = time.monotonic() + wait
        while True:
            trigger = g.store_get_many(["trigger"]).get("trigger")
            if trigger:
                return cast(Trigger, trigger)
            peers = g.read_peers()
            waiting = waiting_for(g.rank, status, peers)
            if waiting:
                r, what, last = waiting[0]
                return Decision("peer_gone", (
                    f"rank {g.rank} left (it destroyed its process group or exited) after its "
                    f"collective #{last} there, while rank {r} waits in {what}, a collective "
                    f"rank {g.rank} never issued"), (g.rank,))
            if not status or time.monotonic() > deadline or not any(
                    hb.get("state") == "running" for r, hb in peers.items() if r != g.rank):
                break
            time.sleep(0.2)
    except Exception as exc:  # the store may be gone with the peer that hosted it
        log.debug("leave check failed: %s", exc)
        return None
    try:
        found = g.exchange.at_exit()
    except Exception as exc:
        log.debug("final desync check failed: %s", exc)
        return None
    return Decision("desync", found) if found else None
