"""An error a rank's training thread is unwinding when the job stops: raised in the loop, it
passes through `finally:` blocks and context managers' exits (torch's Join, a `finally:
dist.barrier()`), whose collectives pair with the peers' training collectives. Where the ranks
wait is then a consequence; the `raise` is the cause."""

from __future__ import annotations

import linecache
import sys
import traceback
from collections.abc import Sequence

from .findings import Finding, file_line
from .records import RankRecord
from .stacks import fmt_frame, is_library_file

__all__ = ["PEER_GONE_WORDS", "describe", "from_notes", "unwinding", "unwinding_error"]

# gloo/NCCL's words for "the other side went away": an error a rank unwinds because a peer
# ended, never the program's own.
PEER_GONE_WORDS = ("connection closed by peer", "connection reset by peer", "remote worker",
                   "broken pipe")


def unwinding(ident: int | None) -> str | None:
    """'ValueError: corrupt batch (raised at train.py:36 in worker  `raise ...`)' for the
    exception thread `ident` is handling (inside an `except`, a `finally` or an `__exit__`),
    where it was raised in the user's code; None otherwise."""
    if ident is None:
        return None
    info = sys._current_exceptions().get(ident)
    return describe(info[1] if isinstance(info, tuple) else info)


def describe(exc: object) -> str | None:
    """The same words for one exception; None for none, or one raised outside user code."""
    if not isinstance(exc, Exception):
        return None
    user = [fs for fs in traceback.extract_tb(exc.__traceback__)
            if not is_library_file(fs.filename)]
    if not user:
        return None
    fs = user[-1]
    code = (fs.line or linecache.getline(fs.filename, fs.lineno or 0)).strip()
    where = fmt_frame({"file": fs.filename, "line": fs.lineno or 0, "func": fs.name,
                       "code": code})
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}{': ' + text if text else ''} (raised at {where})"


def from_notes(notes: Sequence[tuple[str, str]]) -> str | None:
    """The error a rank was unwinding in the collective it died in, from its fault log's
    notes (issued.py writes them): its last such note, unless that collective completed
    ('-')."""
    last = next((t for k, t in reversed(notes) if k == "unwinding"), None)
    return None if last in (None, "-") else last


def unwinding_error(records: Sequence[RankRecord]) -> Finding | None:
    """A running rank that waits in a collective while it unwinds an error its own code
    raised: its cleanup's collective is not the one its peers issue."""
    for r in records:
        err = r.get("unwinding")
        # (A rank the transport aborted in that collective left the words in its fault log.)
        if not err or r.get("state") not in ("running", "dead"):
            continue
        if any(w in err.lower() for w in PEER_GONE_WORDS):
            continue  # its peer's end reached it: the cause is where that peer went
        rank = int(r["rank"])
        raised = err.rsplit("(raised at ", 1)[-1].rstrip(")")
        return Finding("crashed_rank", (
            f"rank {rank} is unwinding {err}: on its way out, a `finally:` or a context "
            "manager's exit (torch's Join, a barrier in cleanup) issued a collective that "
            "pairs with another one on the other ranks, which go on with training; the error "
            "is the cause, the collectives only where it was caught"), (rank,),
            file_line(raised.split("  `", 1)[0]))
    return None
