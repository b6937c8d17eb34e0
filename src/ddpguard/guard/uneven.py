"""Proof that unequal loaders hang the job, from the ranks' states alone. Pure.

Unequal loader lengths are legal when the program handles them: under torch's Join the ranks
that ran out shadow the others' collectives, and a loop whose ranks agree on when to stop
(an all_reduce of "I still have data" each step) makes every rank leave together. In both,
nobody stays blocked. The proof therefore needs all of:

- a rank W blocked (the monitor's notion: pending in a collective, sitting still) for at least
  `grace` seconds, in a collective it issued during an open pass over a DataLoader (its number
  is past the ledger's position when the pass began; without the ledger: W has drawn a batch
  of the pass);
- a rank F whose pass over the same loader (same creation, same pass number) ended with
  StopIteration and was shorter than W's (fewer batches by length, or by count where the
  loader has no length);
- F will not join W's collective: F left (exited, or destroyed its process group), or F is
  blocked itself in a collective that cannot pair with W's: the same number with a different
  operation or size, or one of a group W belongs to that W is not in (also if it died there).
  A rank that crashed, or died while working, is left to the other rules: its own end is the
  cause to name.

A rank that ran out and is still working (a slow step before its agreement all_reduce, Join's
shadow loop between two collectives) is never proof: it may yet join.

A view is one rank's heartbeat as rules.py reads it (blocked, blocked_for, pending, gone,
state_text, where, loaders: {site: {key, len, batches, at, end, seq0, done}}).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from .heartbeat import LoaderInfo, PeerView
from .ledger import Entry, describe_entry, first_pending, signature
from .loops import inside_loop
from .stacks import short_path

__all__ = ["UnevenProof", "uneven_proof", "uneven_in_records", "left_a_longer_pass",
           "counts_text", "short_path_of"]

View = PeerView


@dataclasses.dataclass(frozen=True)
class UnevenProof:
    reason: str
    finished: tuple[int, ...]  # the ranks that ran out and will not join


@dataclasses.dataclass(frozen=True)
class _Ended:
    length: int | None
    batches: int
    site: str
    at: str | None


def counts_text(lengths: Sequence[int | None]) -> str:
    """'rank 0: 8, rank 1: 7' (at most 8 ranks), else grouped: '8 on ranks 0-5, 7; 7 on ...'."""
    if len(lengths) <= 8:
        return ", ".join(f"rank {r}: {n if n is not None else '?'}"
                         for r, n in enumerate(lengths))
    by: dict[int | None, list[int]] = {}
    for r, n in enumerate(lengths):
        by.setdefault(n, []).append(r)
    parts = []
    for n, ranks in sorted(by.items(), key=lambda kv: (-len(kv[1]), str(kv[0]))):
        parts.append(f"{n if n is not None else '?'} on {_ranges(ranks)}")
    return "; ".join(parts)


def _ranges(ranks: list[int]) -> str:
    out: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(out)


def short_path_of(site: str) -> str:
    """'file:line' with the file as the user knows it."""
    path, _, line = site.rpartition(":")
    return f"{short_path(path)}:{line}" if path else site


def _site(text: str | None) -> str:
    return short_path_of(text) if text else "?"


def _open_passes(v: View) -> list[tuple[str, LoaderInfo]]:
    return [(site, info) for site, info in sorted((v.get("loaders") or {}).items())
            if info.get("key") and not info.get("end")]


def _all_ended(v: View) -> list[tuple[str, _Ended]]:
    """The passes rank v ended by running out (StopIteration), by key."""
    return [(str(done[0]), _Ended(done[1], int(done[2]), site, info.get("at")))
            for site, info in (v.get("loaders") or {}).items()
            for done in info.get("done") or []]


def _ended(v: View, key: str) -> _Ended | None:
    return next((e for k, e in _all_ended(v) if k == key), None)


def _issued_in_pass(info: LoaderInfo, first: Entry | None) -> bool:
    seq0 = info.get("seq0") or {}
    if first is None or not seq0:
        return int(info.get("batches") or 0) >= 1
    if first[1] < 0:
        return False  # a process-group set-up wait, not a collective of the loop
    return bool(first[1] > seq0.get(first[0], -1))


def _longer(info: LoaderInfo, ended: _Ended) -> bool:
    length = info.get("len")
    if length is not None and ended.length is not None:
        return int(length) > ended.length
    return int(info.get("batches") or 0) > ended.batches


def _left(f: View) -> bool:
    """Rank f left the job on purpose (exited, destroyed its process group). One that crashed
    or died is not counted: its own end is the cause the report must name."""
    return bool(f.get("gone")) and f.get("state") == "exited"


def _wont_join(f: View, first: Entry | None, w: int, w_pending: Sequence[Entry],
               members: Mapping[str, Sequence[int]], world_size: int) -> bool:
    """Rank f can never join the collective `first` that rank w waits in."""
    if _left(f):
        return True
    if first is None:
        return False  # without the ledger only a rank that is gone is proof
    mine = [e for e in f.get("pending") or [] if e[1] >= 0]
    for e in mine:
        if (e[0], e[1]) == (first[0], first[1]):
            # It issued the same number: a proof only if they cannot pair.
            return signature(e) != signature(first)
    ef = first_pending(mine)
    if ef is None:
        return False
    if w not in (members.get(ef[0]) or range(world_size)):
        return False  # it waits for other ranks, who may release it
    # It waits for w in a collective w is not in: each waits for the other.
    return not any((p[0], p[1]) == (ef[0], ef[1]) and signature(p) == signature(ef)
                   for p in w_pending)


def _how(f: View) -> str:
    if _left(f):
        return str(f.get("state_text") or "exited")
    first = first_pending(f.get("pending") or [])
    what = describe_entry(first) if first else "a collective"
    return f"waits in {what} at {f.get('where', '?')}"


def uneven_proof(views: Mapping[int, View], world_size: int, *, grace: float,
                 members: Mapping[str, Sequence[int]] | None = None) -> UnevenProof | None:
    """The first waiting rank (lowest) for which the proof holds, with every rank that ran out
    and will not join; None means no proof. Linear in the ranks until a proof is near: only
    ranks that ran out and are gone or blocked are compared with the waiting ones."""
    members = members or {}
    out_of: dict[str, list[tuple[int, _Ended]]] = {}
    for f in sorted(views):
        vf = views[f]
        # A rank that ran out and is still working may yet join (Join's shadow loop between
        # two collectives, a rank closing its files before its agreement all_reduce).
        # One that died while blocked still shows where it could not pair (gloo aborts a
        # rank whose barrier meets a peer's all_reduce); one that crashed has its own cause.
        if _left(vf) or (vf.get("blocked") and vf.get("state") != "crashed"):
            for key, ended in _all_ended(vf):
                out_of.setdefault(key, []).append((f, ended))
    if not out_of:
        return None
    for w in sorted(views):
        vw = views[w]
        if vw.get("gone") or not vw.get("blocked") or vw.get("blocked_for", 0.0) < grace:
            continue
        pending = list(vw.get("pending") or [])
        first = first_pending(pending)
        for site, info in _open_passes(vw):
            key = str(info["key"])
            if key not in out_of or not _issued_in_pass(info, first):
                continue
            finished = [(f, ended) for f, ended in out_of[key]
                        if f != w and _longer(info, ended)
                        and _wont_join(views[f], first, w, pending, members, world_size)]
            if finished:
                return UnevenProof(_reason(views, w, site, info, first, finished),
                                   tuple(f for f, _ in finished))
    return None


def _reason(views: Mapping[int, View], w: int, site: str, info: LoaderInfo,
            first: Entry | None, finished: list[tuple[int, _Ended]]) -> str:
    f, ended = finished[0]
    at = info.get("at") or ended.at
    loader = (f"the DataLoader created at {_site(at)} (`for` at {_site(site)})" if at
              else f"the DataLoader iterated at {_site(site)}")
    others = [r for r, _ in finished[1:]]
    also = f" (so did {_ranges(others)})" if others else ""
    what = f"{describe_entry(first)}" if first else "a collective"
    of = f" of {info['len']}" if info.get("len") is not None else ""
    key = str(info["key"])
    counts: list[int | None] = []
    for r in range(max(views) + 1):
        e = _ended(views[r], key) if r in views else None
        if e is not None:
            counts.append(e.length if e.length is not None else e.batches)
            continue
        cur = next((i for _, i in _open_passes(views[r]) if i.get("key") == key), None) \
            if r in views else None
        counts.append(None if cur is None else cur.get("len"))
    return (f"rank {f} ran out of batches in {loader} after {ended.batches} batches and "
            f"{_how(views[f])}{also}, while rank {w}, at batch {info.get('batches')}{of} of "
            f"the same pass, waits in {what} issued during the pass at "
            f"{views[w].get('where', '?')}, which rank {f} will never join. Batches per rank: "
            f"{counts_text(counts)}")


def uneven_in_records(records: Sequence[Mapping[str, object]]) -> UnevenProof | None:
    """The same proof from the ranks' last heartbeats in a report (the decision may have been
    taken first by another rule: the rank that ran out, leaving, saw its peer wait). A pass
    ended by StopIteration shorter than the one a peer still waits in is certain whoever
    decided; no grace is needed, the decision was already taken."""
    views: dict[int, View] = {}
    for rec in records:
        hb = rec.get("hb")
        if not isinstance(hb, Mapping):
            continue
        state = str(rec.get("state") or hb.get("state") or "running")
        views[int(str(rec.get("rank")))] = {**hb, "state": state,
                                            "gone": state != "running"}
    if len(views) < 2:
        return None
    return uneven_proof(views, max(views) + 1, grace=0.0)


def left_a_longer_pass(records: Sequence[Mapping[str, object]],
                       sources: Mapping[str, list[str]]) -> UnevenProof | None:
    """A rank that died or waits outside a loader's loop, whose pass over that loader (same
    creation, same epoch) is shorter than the batches a peer has already drawn from it inside
    the loop: it ran out and went on to what follows the loop (a validation, the next
    collective), where it paired with the peer's training collectives. Read from lengths and
    stacks, for when its last heartbeat came before it ran out (it died within a second of
    leaving: gloo aborts a rank whose collective meets a peer's of another size)."""
    views = {int(str(r.get("rank"))): r for r in records}
    for w, rw in sorted(views.items()):
        if rw.get("state") != "running":
            continue
        # Open, or left by the error the peer's end raised in it ("drop"): the stack at the
        # error still stands inside the loop.
        for site, info in sorted((_hb(rw).get("loaders") or {}).items()):
            file, _, line = site.rpartition(":")
            if not info.get("key") or info.get("end") == "stop":
                continue
            if not line.isdigit() or not _stack_inside(rw, sources.get(file), file, int(line)):
                continue
            drawn = int(info.get("batches") or 0)
            shorter = []
            for f, rf in sorted(views.items()):
                other = next((i for s2, i in (_hb(rf).get("loaders") or {}).items()
                              if s2 == site and i.get("key") == info.get("key")
                              and i.get("epoch") == info.get("epoch")), None)
                length = None if other is None else other.get("len")
                if (f == w or length is None or drawn <= int(length) or not rf.get("stacks")
                        or _stack_inside(rf, sources.get(file), file, int(line))):
                    continue
                shorter.append((f, int(length)))
            if shorter:
                f, length = shorter[0]
                counts = [_length(views[r], site) if r in views else None
                          for r in range(max(views) + 1)]
                at = info.get("at")
                loader = (f"the DataLoader created at {_site(at)} (`for` at {_site(site)})"
                          if at else f"the DataLoader iterated at {_site(site)}")
                return UnevenProof(
                    f"rank {f}'s pass over {loader} has {length} batches, rank {w}'s "
                    f"{info.get('len')}: rank {w} has drawn {drawn} of the pass and is still "
                    f"inside the loop, while rank {f} has left it (its stack is past the loop), "
                    f"so it ran out and issued what follows the loop against rank {w}'s "
                    f"training collectives. Batches per rank: {counts_text(counts)}",
                    tuple(r for r, _ in shorter))
    return None


def _length(rec: Mapping[str, object], site: str) -> int | None:
    info = (_hb(rec).get("loaders") or {}).get(site)
    return None if info is None or info.get("len") is None else int(info.get("len") or 0)


def _hb(rec: Mapping[str, object]) -> View:
    hb = rec.get("hb")
    return hb if isinstance(hb, Mapping) else {}  # type: ignore[return-value]


def _stack_inside(rec: Mapping[str, object], source: list[str] | None, file: str,
                  for_line: int) -> bool:
    """Does any thread's stack of the record stand inside the body of the `for` at
    file:for_line (or on it)?"""
    stacks = rec.get("stacks")
    if not isinstance(stacks, Mapping) or source is None:
        return False
    return any(fr.get("file") == file and (fr.get("line") == for_line or inside_loop(
        source, for_line, int(fr.get("line") or 0)))
        for frames in stacks.values() for fr in frames or [])
