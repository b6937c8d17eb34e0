"""A collective some ranks issue under a test of which rank they are (`if rank == 0:`), read
from the waiting ranks' lines and the calls that led to them. Pure."""

from __future__ import annotations

from .findings import Finding
from .loops import RANK_TEST
from .records import Position, RankRecord

__all__ = ["in_conditional", "conditional", "or_conditional", "loop_conditional",
           "guarded_call"]


def in_conditional(source: list[str] | None, line: int) -> bool:
    """Is `line` (1-based) nested under an `if ... rank ...:` in `source`?"""
    if not source or not 0 < line <= len(source):
        return False
    target = source[line - 1]
    indent = len(target) - len(target.lstrip())
    for prev in reversed(source[: line - 1]):
        stripped = prev.strip()
        if not stripped or stripped.startswith("#"):
            continue
        ind = len(prev) - len(prev.lstrip())
        if ind < indent:
            if RANK_TEST.search(stripped):
                return True
            indent = ind
            if ind == 0:
                break
    return bool(RANK_TEST.search(target))


def conditional(records: list[RankRecord], pos: dict[int, Position],
                sources: dict[str, list[str]]) -> tuple[str, int] | None:
    """The line of a waiting rank's collective (or of a call leading to it) that sits under
    `if ...rank...:` where not every rank stands; None when there is none."""
    for r in records:
        p = pos[r["rank"]]
        waits = p["pending"] or p["kind"].startswith("collective:")
        if not waits:
            continue
        lines = [p["user_line"]] if p["user_line"] else []
        lines += [c for c in p.get("callers", ()) if c not in lines]
        for where in lines:
            if in_conditional(sources.get(where[0]), where[1]):
                others = [o for o in records if where == pos[o["rank"]]["user_line"]
                          or where in pos[o["rank"]].get("callers", ())]
                if len(others) < len(records):
                    return (str(where[0]), int(where[1]))
    return None


def or_conditional(found: Finding, records: list[RankRecord], pos: dict[int, Position],
                   sources: dict[str, list[str]]) -> tuple[str, Finding]:
    """An extra collective whose line sits under `if ...rank...:` is the more specific
    conditional collective; so is a mismatch where a waiting rank's collective (or a call
    leading to it) sits under one and not every rank stands at that line. Where that is a
    call of a project helper, not the collective's own line, the finding names the call."""
    if found.cause not in ("extra_collective", "mismatch"):
        return found.cause, found
    if found.line and in_conditional(sources.get(found.line[0]), found.line[1]):
        return "conditional_collective", found
    where = conditional(records, pos, sources)
    if where is None:
        return found.cause, found
    if where == found.line:
        return "conditional_collective", found
    return "conditional_collective", Finding(
        found.cause, f"{found.text}; {_call_text(where, sources)}", found.culprits, found.line)


def guarded_call(where: tuple[str, int], records: list[RankRecord],
                 pos: dict[int, Position], sources: dict[str, list[str]]) -> Finding:
    """The finding for a conditional collective known only from the stacks: its call under
    the rank test, and the ranks that stand there."""
    there = tuple(int(r["rank"]) for r in records
                  if where == pos[r["rank"]]["user_line"]
                  or where in pos[r["rank"]].get("callers", ()))
    text = _call_text(where, sources)
    return Finding("conditional_collective", text[0].upper() + text[1:], there, where)


def _call_text(where: tuple[str, int], sources: dict[str, list[str]]) -> str:
    src = sources.get(where[0]) or []
    code = src[where[1] - 1].strip() if 0 < where[1] <= len(src) else ""
    return (f"the call under the rank test is {where[0]}:{where[1]}"
            + (f" `{code}`" if code else ""))


def loop_conditional(found: Finding, records: list[RankRecord], pos: dict[int, Position],
                      sources: dict[str, list[str]]) -> Finding | None:
    """A forward through the wrapper on one rank meets another rank's collective that its
    loop issued under a rank test (`if rank == 0: log(reduce(loss))`): the counters cannot
    tell which side is extra, the rank test can. The forward rank is only the first to
    reach the next forward every rank runs."""
    for r in records:
        rank = r["rank"]
        p = pos[rank]
        if rank in found.culprits or not p["pending"] or not p["kind"].startswith("collective:"):
            continue
        lines = [p["user_line"]] if p["user_line"] else []
        for where in lines + [c for c in p.get("callers", ()) if c not in lines]:
            if in_conditional(sources.get(where[0]), where[1]):
                return Finding("conditional_collective", (
                    f"rank {rank} waits in {p['pending']} issued from {where[0]}:{where[1]}, "
                    f"under a rank test, while rank {found.culprits[0]} went on to a forward "
                    "through the wrapper every rank runs: rank "
                    f"{rank}'s collective is the one the others never issue"), (rank,), where)
    return None
