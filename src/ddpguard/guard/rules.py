"""When the guard stops a job: pure decisions over every rank's latest heartbeat.

The rule: stop only on proof of a deadlock, or on a stall with no sign of life at all.

A view (one rank's heartbeat, as published) holds: rank, state ('running' | 'exited' |
'crashed'), gone (dead, exited or crashed: set by the caller from pids and silence), blocked
(waiting inside a collective with no sign of life since it started), blocked_for (s), pending
(the ledger entries it waits on; empty without the flight recorder), quiet (s since its last
sign of life), life (the kind of that sign), doing and where (what its training thread does),
loaders (each `for` site's current pass; uneven.py reads them).
Tested in one process at many ranks with made-up views.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from .heartbeat import PeerView
from .ledger import cross_wait, describe_entry, first_pending, pending_mismatch
from .uneven import uneven_proof

__all__ = ["Decision", "decide", "notice_due"]

View = PeerView


@dataclasses.dataclass(frozen=True)
class Decision:
    """Why to stop. `cause` keys the diagnosis; `proof` says whether it is proven (deadlock,
    desync, dead peer) or a judgement (no sign of life, user's hard limit)."""

    cause: str
    reason: str
    culprits: tuple[int, ...] = ()
    proof: bool = True


def _waits(v: View) -> str:
    first = first_pending(v.get("pending") or [])
    if first is not None:
        return f"waits in {describe_entry(first)}"
    return f"waits {v.get('doing') or 'in a collective'}"


def decide(views: Mapping[int, View], world_size: int, *, grace: float, no_life: float,
           hard_limit: float | None, fallback_deadlock: float,
           members: Mapping[str, Sequence[int]] | None = None) -> Decision | None:
    """The first rule that holds, in order of certainty; None means keep waiting."""
    members = members or {}
    running = {r: v for r, v in views.items() if not v.get("gone")}
    gone = sorted(r for r, v in views.items() if v.get("gone"))
    blocked = {r: v for r, v in running.items() if v.get("blocked")}

    # 0. A rank ran out of batches and will not join the collective a rank with more batches
    # waits in (uneven.py). It needs the same proof as the rules below (a gone peer, or two
    # ranks blocked where neither can move), so it only names the cause they would miss.
    uneven = uneven_proof(views, world_size, grace=grace, members=members)
    if uneven is not None:
        return Decision("uneven_batches", uneven.reason, uneven.finished)

    # 1. A rank waits in a collective that a peer can no longer join.
    settled = [r for r, v in blocked.items() if v.get("blocked_for", 0.0) >= grace]
    if gone and settled:
        what = "; ".join(f"rank {r} {views[r].get('state_text') or views[r].get('state')}"
                         for r in gone)
        waiting = "; ".join(f"rank {r} {_waits(views[r])}" for r in settled)
        return Decision("peer_gone", f"{what}, while {waiting}", tuple(gone))

    # 2. Two ranks pending on the same collective number with different ops or sizes.
    pend = {r: list(v.get("pending") or []) for r, v in blocked.items() if v.get("pending")}
    mm = pending_mismatch(pend)
    if mm is not None:
        ra, rb, ea, eb = mm
        return Decision("mismatch", f"rank {ra} waits in {describe_entry(ea)} at "
                        f"{views[ra].get('where', '?')}, rank {rb} in {describe_entry(eb)} at "
                        f"{views[rb].get('where', '?')}: the same collective number, different "
                        "operations, so neither can ever complete", (ra, rb))

    # 3. Every rank blocked, each on something another rank will never join.
    if len(pend) == world_size and not gone:
        cw = cross_wait(pend, members, world_size)
        if cw is not None:
            text = "; ".join(f"rank {r} waits in {describe_entry(e)} at "
                             f"{views[r].get('where', '?')}" for r, e in sorted(cw.items()))
            return Decision("deadlock", f"every rank is blocked and none can move: {text}",
                            tuple(sorted(cw)))

    # 4. Without the flight recorder: every rank blocked, silent, for a long time.
    if (len(blocked) == world_size and not pend
            and min(v.get("blocked_for", 0.0) for v in blocked.values()) >= fallback_deadlock):
        text = "; ".join(f"rank {r} {_waits(v)} at {v.get('where', '?')}"
                         for r, v in sorted(blocked.items()))
        return Decision("deadlock", f"every rank has waited in a collective for more than "
                        f"{fallback_deadlock:.0f} s with no sign of life (flight recorder "
                        f"unavailable, judged from stacks): {text}", tuple(sorted(blocked)))

    if not blocked:
        return None  # nobody waits for anybody: whatever a rank does, it is its own business

    # 5. The user's hard limit on waiting.
    longest = max(blocked, key=lambda r: blocked[r].get("blocked_for", 0.0))
    waited = blocked[longest].get("blocked_for", 0.0)
    busy = {r: v for r, v in running.items() if r not in blocked}
    if hard_limit is not None and waited >= hard_limit:
        names = ", ".join(f"rank {r} ({v.get('doing', '?')} at {v.get('where', '?')})"
                          for r, v in sorted(busy.items())) or "no other rank"
        return Decision("hard_limit", f"rank {longest} {_waits(blocked[longest])} for "
                        f"{waited:.0f} s, over the stall timeout of {hard_limit:.0f} s; it waits "
                        f"for {names}", tuple(sorted(busy)), proof=False)

    # 6. Others wait for a rank that shows no sign of life.
    dead_quiet = sorted(r for r, v in busy.items() if v.get("quiet", 0.0) >= no_life)
    if dead_quiet:
        r = dead_quiet[0]
        v = busy[r]
        return Decision("no_life", f"rank {r} has shown no sign of life for "
                        f"{v.get('quiet', 0.0):.0f} s ({v.get('doing', '?')} at "
                        f"{v.get('where', '?')}) while rank {longest} {_waits(blocked[longest])} "
                        f"for it ({waited:.0f} s)", tuple(dead_quiet), proof=False)
    if (not busy and len(pend) == len(blocked)
            and min(v.get("quiet", 0.0) for v in blocked.values()) >= no_life):
        text = "; ".join(f"rank {r} {_waits(v)}" for r, v in sorted(blocked.items()))
        return Decision("stuck_collective", f"every rank has waited in the same collective "
                        f"for {waited:.0f} s and it does not complete: {text}",
                        tuple(sorted(blocked)), proof=False)
    return None


def notice_due(waited: float, first: float, printed: int) -> bool:
    """Notices about a slow but working rank: after `first` seconds, then 2x, 4x, ..."""
    return waited >= first * (2 ** printed)
