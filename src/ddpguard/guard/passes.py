"""Which passes over a DataLoader a rank left before their end, read from its heartbeat's
loader states (progress.LoaderState): a `break` out of the training loop, told apart from a
one-batch peek, a cap every rank shares, and a pass that ran to its end."""

from __future__ import annotations

import linecache
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .conditional import in_conditional
from .findings import Finding, file_line
from .loops import inside_loop, is_loop_head, skip_before, way_out
from .records import Position, RankRecord
from .stacks import is_library_file

__all__ = ["unfinished_pass", "in_pass", "left_then_died", "left_outer_loop",
           "left_before_a_shared_forward"]


def unfinished_pass(rec: RankRecord, positions: Mapping[int, Position],
                     sources: Mapping[str, list[str]],
                     peers: Sequence[Mapping[str, Any]] = ()) -> tuple[str, int, str] | None:
    """(site, batches drawn, 'its pass over the DataLoader at f:l ended after 6 of 32
    batches') when the rank stopped iterating a loader before its end and is no longer
    inside that loop."""
    hb = rec.get("hb") or {}
    pos = positions.get(int(rec["rank"])) or {}
    callers = [(c[0], c[1]) for c in pos.get("callers") or []]  # JSON gives lists
    for site, st in (hb.get("loaders") or {}).items():
        n, total = st.get("batches"), st.get("len")
        if total is None or n is None or st.get("end") == "stop":
            continue
        if n >= total and not (st.get("end") == "drop" and _later_pass(site, st, peers)):
            # (A pass left by `break` at its last batch while a peer went on to a later
            # pass at the same loop: a `while` around one-batch passes, left.)
            continue
        path, _, num = str(site).rpartition(":")
        if not num.isdigit():
            continue
        src = sources.get(path)
        if _peek(src, int(num), st) or _cut_alike(site, st, peers):
            continue
        if rec.get("state") == "running":
            if src is None:
                continue
            if any(f == path and inside_loop(src, int(num), ln) for f, ln in callers):
                continue
        return (str(site), int(n),
                f"its pass over the DataLoader iterated at {site} ended after {n} of {total} "
                "batches")
    if rec.get("state") in ("exited", "dead", "crashed"):
        return _short_pass(hb, peers)
    return None


def _peek(src: list[str] | None, line: int, st: Mapping[str, Any]) -> bool:
    """A look at one batch (`next(iter(loader))`, the batch-size peek of pytorch/examples'
    DDP tutorials), not a loop: at most one batch drawn, at a line that is no loop head."""
    if int(st.get("batches") or 0) > 1 or src is None or not 0 < line <= len(src):
        return False
    return not is_loop_head(src[line - 1])


def _later_pass(site: str, st: Mapping[str, Any], peers: Sequence[Mapping[str, Any]]) -> bool:
    """Has a peer begun a later pass at this loop than this rank's last one?"""
    mine = int(st.get("epoch") or 0)
    return any(int(((p.get("loaders") or {}).get(site) or {}).get("epoch", -1)) > mine
               for p in peers)


def _cut_alike(site: str, st: Mapping[str, Any], peers: Sequence[Mapping[str, Any]]) -> bool:
    """Every peer ended the same pass at the same batch: a cap the program puts on every
    rank, not a rank that left."""
    if not peers or not st.get("end") or not st.get("key"):
        return False
    theirs = [(p.get("loaders") or {}).get(site) or {} for p in peers]
    return all(t.get("key") == st.get("key") and t.get("end")
               and t.get("batches") == st.get("batches") for t in theirs)


def _short_pass(hb: Mapping[str, Any], peers: Sequence[Mapping[str, Any]]
                ) -> tuple[str, int, str] | None:
    """A rank that is gone and whose every last pass ran to its end may still have left one
    pass early, epochs ago (a `break`): then the ranks paired shifted steps until it ran out
    of epochs and left. Only a short pass no peer has (a loop capped at N batches on every
    rank is not one)."""
    for site, st in (hb.get("loaders") or {}).items():
        short = st.get("short")
        if not short:
            continue
        if any(((p.get("loaders") or {}).get(site) or {}).get("short") == short for p in peers):
            continue
        k, n, total = short
        return (str(site), int(n),
                f"its pass {k + 1} over the DataLoader iterated at {site} ended after {n} of "
                f"{total} batches (left before its end; its later passes ran to the end)")
    return None


def in_pass(rec: RankRecord, site: str, drawn: int) -> bool:
    """Is the rank still in its pass over the loader iterated at `site`, having drawn at
    least `drawn` batches of it?"""
    st = ((rec.get("hb") or {}).get("loaders") or {}).get(site)
    return st is not None and not st.get("end") and int(st.get("batches") or 0) >= drawn


def left_then_died(records: Sequence[RankRecord], positions: Mapping[int, Position],
                   sources: Mapping[str, list[str]]) -> Finding | None:
    """A rank that died (gloo aborted it) at a line after the training loop, in the loop's
    own file, while a peer waits in a collective inside that loop with batches of its pass
    still to come: the dead rank left the loop early (its last heartbeat may predate the
    `break`), and what killed it was only the next collective it met outside."""
    for d in records:
        if d.get("state") not in ("dead", "crashed"):
            continue
        dl = (positions.get(int(d["rank"])) or {}).get("user_line")
        if not dl:
            continue
        for w in records:
            wl = (positions.get(int(w["rank"])) or {}).get("user_line")
            if w.get("state") != "running" or not wl or wl[0] != dl[0]:
                continue
            src = sources.get(wl[0])
            if src is None:
                continue
            for site, st in ((w.get("hb") or {}).get("loaders") or {}).items():
                path, _, num = str(site).rpartition(":")
                n, total = st.get("batches"), st.get("len")
                if (path != wl[0] or not num.isdigit() or total is None or n is None
                        or n >= total or not inside_loop(src, int(num), int(wl[1]))
                        or inside_loop(src, int(num), int(dl[1])) or int(dl[1]) <= int(num)):
                    continue
                mine: Mapping[str, Any] = ((d.get("hb") or {}).get("loaders") or {}).get(site) or {}
                if _pass_no(mine.get("key")) < _pass_no(st.get("key")):
                    # The dead rank never began the pass its peer is in (it is behind: a
                    # rank-0-only evaluation after its last pass): it did not leave that loop.
                    continue
                out = way_out(sources, str(site))
                return Finding("left_early", (
                    f"rank {d['rank']} left its training loop early: it died at "
                    f"{dl[0]}:{dl[1]}, after the loop over the DataLoader iterated at {site}, "
                    f"while rank {w['rank']} is still in that loop (batch {n} of {total}) at "
                    f"{wl[0]}:{wl[1]}" + (f" (the loop's way out: {out})" if out else "")),
                    (int(d["rank"]),), file_line(out.split(" ", 1)[0]) if out else None)
    return None


def skipped_then_died(records: Sequence[RankRecord], positions: Mapping[int, Position],
                      sources: Mapping[str, list[str]]) -> Finding | None:
    """From the stacks alone (a report composed from the fault logs: no counters): a rank
    that died (gloo aborted it) in a collective after a loop, while a peer is in the backward
    inside that loop, and the loop has exactly one `continue` before that backward. The rank
    that died ran past the backward once and went on one collective ahead of its peer."""
    for d in records:
        if d.get("state") != "dead":
            continue
        dl = (positions.get(int(d["rank"])) or {}).get("user_line")
        for w in records:
            wp = positions.get(int(w["rank"])) or {}
            wl = wp.get("user_line")
            if (not dl or not wl or w.get("state") != "running"
                    or wl[0] != dl[0] or int(wl[1]) >= int(dl[1])):
                continue
            src = sources.get(wl[0]) or []
            # In the backward (or ended inside ddpguard's crash handling, its failed
            # all-reduce's line shown: the backward's).
            if wp.get("kind") != "backward" and not (
                    0 < int(wl[1]) <= len(src) and ".backward(" in src[int(wl[1]) - 1]):
                continue
            # Past the loop, or further on in the same loop (its collective after the step):
            # not under a rank test (that collective would be the cause).
            head = _loop_left(src, int(wl[1]), int(dl[1])) or _innermost_loop(
                src, int(wl[1]), int(dl[1]))
            skip = skip_before(sources, (str(wl[0]), int(wl[1])))
            if (head is None or not skip or not re.search(r"`[^`]*\bcontinue\b", skip)
                    or in_conditional(src, int(dl[1]))):
                continue
            return Finding("skipped_backward", (
                f"rank {d['rank']} died at {dl[0]}:{dl[1]}, further on than rank {w['rank']}, "
                f"which is in the backward at {wl[0]}:{wl[1]} of the loop at {wl[0]}:{head}: the "
                f"loop has one way past the backward before it, {skip}; a rank that took it is "
                "one collective ahead of its peers from there on"), (int(d["rank"]),),
                file_line(skip.split(" ", 1)[0]))
    return None


def _innermost_loop(src: list[str], inner: int, later: int) -> int | None:
    """The head of the innermost loop around line `inner` that also holds the later line
    `later`."""
    for head in range(inner - 1, 0, -1):
        if (src[head - 1].lstrip().startswith(("for ", "while ", "async for "))
                and inside_loop(src, head, inner)):
            return head if inside_loop(src, head, later) else None
    return None


def _pass_no(key: object) -> int:
    """The pass number of a loader key ('93b87c2de83f#0/2' -> 2); a large number where the
    key says none (no evidence that a rank is behind)."""
    tail = str(key or "").rpartition("/")[2]
    return int(tail) if tail.isdigit() else 1 << 30


def left_outer_loop(records: Sequence[RankRecord], positions: Mapping[int, Position],
                    sources: Mapping[str, list[str]]) -> Finding | None:
    """A rank that exited from a line after a loop of its function, while a peer waits at a
    line inside that loop: it left the loop (an epoch loop left on a rank-0 early stop, say)
    and the peer is in an iteration it will never share. Names the loop's one way out when its
    lines leave no choice. (A rank that crashed after the loop may have finished it: a crash
    is told as such.)"""
    for d in records:
        if d.get("state") != "exited":
            continue
        # A rank that exited has no stacks left; its last heartbeat says where it was.
        dl = ((positions.get(int(d["rank"])) or {}).get("user_line")
              or file_line(str((d.get("hb") or {}).get("where") or "")))
        for w in records:
            if not dl or w.get("state") != "running":
                continue
            # The waiting rank's innermost user line, then its callers' (it may wait in a
            # function the loop calls: `train()` called from the epoch loop that was left).
            main = next(iter((w.get("stacks") or {}).values()), [])
            lines = [(positions.get(int(w["rank"])) or {}).get("user_line")] + [
                (str(f["file"]), int(f["line"])) for f in main
                if not is_library_file(str(f["file"]))]
            head, wl = None, None
            for cand in lines:
                if (not cand or not _same_file(str(cand[0]), str(dl[0]))
                        or int(cand[1]) >= int(dl[1])):
                    continue
                src = sources.get(cand[0]) or linecache.getlines(cand[0])
                head = _loop_left(src, int(cand[1]), int(dl[1])) if src else None
                if head is not None:
                    wl = cand
                    break
            if head is None or wl is None:
                continue
            out = way_out({**sources, wl[0]: src}, f"{wl[0]}:{head}")
            return Finding("left_early", (
                f"rank {d['rank']} left the loop at {wl[0]}:{head} early: it exited at "
                f"{dl[0]}:{dl[1]}, after that loop, while rank {w['rank']} waits inside it at "
                f"{wl[0]}:{wl[1]}" + (f" (the loop's way out: {out})" if out else "")),
                (int(d["rank"]),), file_line(out.split(" ", 1)[0]) if out else None)
    return None


def _loop_left(src: list[str], inner: int, after: int) -> int | None:
    """The innermost loop head around line `inner` that line `after` (later, same function)
    is past: the loop one rank is still in and the other has left."""
    for head in range(inner - 1, 0, -1):
        text = src[head - 1]
        stripped = text.lstrip()
        if stripped.startswith(("def ", "async def ", "class ")) and \
                len(text) - len(stripped) < _indent(src[inner - 1]):
            return None  # reached the function's own line: no loop of it was left
        if not (stripped.startswith(("for ", "while ", "async for ")) and
                inside_loop(src, head, inner)):
            continue
        if not inside_loop(src, head, after) and _same_function(src, head, after):
            return head
    return None


def _same_file(full: str, told: str) -> bool:
    """A heartbeat's `where` names its file relative to the rank's directory, stacks in full."""
    return full == told or full.endswith("/" + told.lstrip("./"))


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


def _same_function(src: list[str], head: int, line: int) -> bool:
    """No line between the loop head and `line` is indented less than the head (we are still
    in the body that holds the loop)."""
    base = _indent(src[head - 1])
    return all(_indent(src[n - 1]) >= base for n in range(head + 1, line + 1)
               if src[n - 1].strip() and not src[n - 1].lstrip().startswith("#"))


def left_before_a_shared_forward(found: Finding, records: Sequence[RankRecord],
                                 sources: Mapping[str, list[str]]) -> Finding:
    """"A forward on some ranks only" where the rank without it exited and no line of the
    waiting rank's stack is under a rank test: the forward is one every rank runs (a test()
    after training), and the rank that exited left the program before it."""
    if found.cause != "forward_on_some_ranks":
        return found
    if found.line and in_conditional(sources.get(found.line[0]), found.line[1]):
        return found  # the extra forward the finding names is under a rank test
    gone = [r for r in records if r.get("state") == "exited"]
    if not gone:
        return found
    for w in records:
        main = next(iter((w.get("stacks") or {}).values()), [])
        if w.get("state") != "running" or not main:
            continue
        users = [f for f in main if not is_library_file(str(f["file"]))]
        if not users or any(sources.get(str(f["file"])) is None
                            or in_conditional(sources[str(f["file"])], int(f["line"]))
                            for f in users):
            return found  # a rank test leads to it (or a line is unknown): rank 0's forward
        where = str((gone[0].get("hb") or {}).get("where") or "")
        return Finding("left_early", (
            f"rank {gone[0]['rank']} exited" + (f" at {where}" if where and where != "?" else "")
            + f" while rank {w['rank']} runs a forward through the DDP wrapper that no rank test "
            f"keeps from any rank ({users[-1]['file']}:{users[-1]['line']}): rank "
            f"{gone[0]['rank']} left the program before it"), (int(gone[0]["rank"]),),
            file_line(where) if where and where != "?" else None)
    return found
