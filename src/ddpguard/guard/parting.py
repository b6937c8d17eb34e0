"""Where the ranks' collective sequences part, read from the sequences alone (no places in
the loop needed). Pure.

- a collective issued by a thread other than the training thread, paired by the group with
  another rank's training collective (the group numbers collectives in issue order);
- the first number at which two ranks issued different collectives, and which of the two is
  new to its rank's loop (the extra one); before it, the same collective issued from different
  lines, one under a rank test: the collective that rank added (it paired with the peer's
  next one, and the sequences part from there);
- a survivor's new collective just before a peer died inside its own (the transport aborted
  on the difference).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .conditional import in_conditional
from .findings import Finding
from .findings import file_line as _file_line
from .findings import phase_words as _phase_words
from .records import Position, RankRecord, SeqEntry
from .stacks import is_library_file

__all__ = ["second_thread", "parted", "extra_before_death"]


def second_thread(records: Sequence[RankRecord]) -> Finding | None:
    """An entry issued by a thread other than the training thread, where another rank's
    training thread issued the entry of the same number: the group numbers collectives in the
    order a rank issues them, whatever the thread, so they pair across threads."""
    by_key: dict[tuple[str, int], list[tuple[int, SeqEntry]]] = {}
    for rec in records:
        for e in rec.get("sequence") or []:
            by_key.setdefault((e["g"], e["seq"]), []).append((int(rec["rank"]), e))
    for key in sorted(by_key, key=lambda k: (k[1], k[0])):
        items = by_key[key]
        side = [(r, e) for r, e in items if e["thread"]]
        main = [(r, e) for r, e in items if not e["thread"]]
        if side and main:
            (r, e), (o, f) = side[0], main[0]
            line = e.get("line") or _thread_line(records, r, e["thread"])
            at = f" at {line}" if line else ""
            return Finding("second_thread", (
                f"rank {r}'s thread '{e['thread']}' issued {e['desc']}{at}, while rank {o}'s "
                f"training thread issued {f['desc']} under the same number (batch "
                f"{f['batches']}, {_phase_words(f['phase'])}): collectives are numbered in the "
                "order a rank issues them, whatever the thread, so the two threads' "
                "collectives pair with the wrong ones on the other ranks"), (r,),
                _file_line(line))
    return None


def _thread_line(records: Sequence[RankRecord], rank: int, thread: str) -> str | None:
    """'file:line in func' where the named thread of `rank` stands in the user's code, from
    the rank's dump (the thread still waits in its collective: its stack says where)."""
    rec = next((r for r in records if int(r["rank"]) == rank), None)
    for key, frames in ((rec or {}).get("stacks") or {}).items():
        if key == thread or key.startswith(f"{thread} ("):
            user = next((f for f in reversed(frames) if not is_library_file(f["file"])), None)
            if user is not None:
                return f"{user['file']}:{user['line']} in {user['func']}"
    return None


def parted(records: Sequence[RankRecord],
           sources: Mapping[str, list[str]] | None = None) -> Finding | None:
    """The first number at which two ranks' training threads issued different collectives
    (operation, sizes or types): from there on every collective pairs with the wrong one, so
    where the ranks wait now is a consequence. Of the two, the one its rank never issued at
    that place of its loop before (a phase and signature its earlier batches do not show)
    is the extra one; where neither or both are new, it is a plain mismatch."""
    seqs = {int(r["rank"]): [e for e in r.get("sequence") or [] if not e["thread"]]
            for r in records}
    by_key: dict[tuple[str, int], dict[int, SeqEntry]] = {}
    for r, seq in seqs.items():
        for e in seq:
            by_key.setdefault((e["g"], e["seq"]), {})[r] = e
    keys = sorted(by_key, key=lambda k: (k[1], k[0]))
    found = _added_under_a_rank_test([by_key[k] for k in keys], sources or {})
    if found:
        return found
    for key in keys:
        side = by_key[key]
        if len(side) < 2 or len({e["sig"] for e in side.values()}) < 2:
            continue
        (a, ea), (b, eb) = sorted(side.items())[:2]
        new_a, new_b = _new_here(seqs[a], ea), _new_here(seqs[b], eb)
        if new_a != new_b:
            x, ex, y, ey = (a, ea, b, eb) if new_a else (b, eb, a, ea)
            return Finding("extra_collective", (
                f"the ranks' collectives part at number {ex['seq']} (group {ex['g']}): rank "
                f"{x} issued {ex['desc']}{_at(ex)} ({_phase_words(ex['phase'])}, batch "
                f"{ex['batches']}), a collective its earlier batches never issued there; rank "
                f"{y} issued {ey['desc']} ({_phase_words(ey['phase'])}, batch {ey['batches']}), "
                "its usual one. Every later collective pairs with the wrong one"), (x,),
                _file_line(ex.get("line")))
        return Finding("mismatch", (
            f"the ranks' collectives part at number {ea['seq']} (group {ea['g']}): rank {a} "
            f"issued {ea['desc']}{_at(ea)} ({_phase_words(ea['phase'])}, batch "
            f"{ea['batches']}), rank {b} {eb['desc']}{_at(eb)} ({_phase_words(eb['phase'])}, "
            f"batch {eb['batches']})"), (a, b), _file_line(ea.get("line")))
    return None


def _added_under_a_rank_test(numbers: Sequence[Mapping[int, SeqEntry]],
                             sources: Mapping[str, list[str]]) -> Finding | None:
    """Before the first number where the ranks' collectives differ, one where they are the
    same operation issued from different lines, exactly one of them under a rank test: that
    rank added it (`if rank == 0: dist.barrier()`), and it paired with the peer's next one."""
    parts = next((i for i, side in enumerate(numbers)
                  if len(side) > 1 and len({e["sig"] for e in side.values()}) > 1), None)
    if parts is None:
        return None
    for side in numbers[:parts]:
        lines = {r: e.get("line") for r, e in side.items()}
        if len(side) < 2 or None in lines.values() or len(set(lines.values())) < 2:
            continue
        under = [r for r, where in lines.items() if _under_rank_test(where, sources)]
        if len(under) != 1:
            continue
        r = under[0]
        e = side[r]
        o, eo = next((o, eo) for o, eo in sorted(side.items()) if o != r)
        return Finding("conditional_collective", (
            f"rank {r} issued {e['desc']} at {e['line']}, under a rank test, where rank {o} "
            f"issued its {eo['desc'].split(' #')[0]} from another line ({eo['line']}); the two "
            f"paired, and from number {numbers[parts][r]['seq'] if r in numbers[parts] else '?'}"
            " on every collective pairs with the wrong one"), (r,), _file_line(e["line"]))
    return None


def _under_rank_test(where: str | None, sources: Mapping[str, list[str]]) -> bool:
    at = _file_line(where)
    return at is not None and in_conditional(sources.get(at[0]), at[1])


def _at(e: SeqEntry) -> str:
    return f" at {e['line']}" if e.get("line") else ""


def _new_here(seq: Sequence[SeqEntry], e: SeqEntry) -> bool:
    """Did this rank issue `e`'s kind of collective (phase and signature) for the first time
    at `e`, after earlier batches that issued collectives?"""
    before = [f for f in seq if f["seq"] < e["seq"] and f["g"] == e["g"]]
    earlier = [f for f in before if f["batches"] < e["batches"]]
    return bool(earlier) and (e["phase"], e["sig"]) not in {(f["phase"], f["sig"])
                                                           for f in before}


def extra_before_death(records: Sequence[RankRecord],
                       positions: Mapping[int, Position]) -> Finding | None:
    """A rank died inside a collective (its fault log puts it in one: the transport aborted
    it) just after a survivor's loop issued a collective its earlier batches never issued:
    the ranks had run the same collectives batch after batch, so the dead rank's collective
    of that number was its usual one, and the survivor's was extra."""
    dead = [int(r["rank"]) for r in records if r.get("state") in ("dead", "crashed")
            and (str((positions.get(int(r["rank"])) or {}).get("kind", "")) in
                 ("ddp_forward", "backward")
                 or str((positions.get(int(r["rank"])) or {}).get("kind", ""))
                 .startswith("collective:"))]
    if not dead:
        return None
    for rec in records:
        seq = [e for e in rec.get("sequence") or [] if not e["thread"]]
        if rec.get("state") != "running" or len(seq) < 4:
            continue
        last = seq[-1]["batches"]
        for e in seq:  # the first odd one of the last two batches
            if e["batches"] < last - 1 or e["phase"] != "loop":
                continue
            before = [f for f in seq if f["batches"] < e["batches"]]
            if (any(f["phase"] != "loop" for f in before)
                    and (e["phase"], e["sig"]) not in {(f["phase"], f["sig"]) for f in before}):
                r, d = int(rec["rank"]), dead[0]
                dpos = positions.get(d) or {}
                at = f" at {e['line']}" if e.get("line") else ""
                return Finding("extra_collective", (
                    f"rank {r} issued {e['desc']}{at} from its loop's own code in batch "
                    f"{e['batches']}, a collective none of its earlier batches issued; rank "
                    f"{d} died inside its own collective of that point ({dpos.get('doing', '?')} "
                    f"at {dpos.get('user', '?')}): the two were paired, and the transport "
                    "aborted on the difference"), (r,), _file_line(e.get("line")))
    return None
