"""The ranks' collective sequences side by side, and what they show. Pure.

Each rank's report record carries its recent collectives (sequence.py), each placed in its
training loop: the batch, the DDP forwards (all, and those in training mode with gradients on)
and backwards and the optimizer steps counted when it was issued, whether it was issued inside
a forward through the DDP wrapper, inside a backward or by the loop's own code, and the thread
that issued it. A rank that waits in a collective is placed at that collective; a rank that
does not (computing, blocked elsewhere, gone) at its last counters. Comparing those places
across ranks names the cause, each with the facts that prove it:

- a collective issued from a second thread (paired with another rank's training thread);
- a step whose backward some ranks skipped (as many training forwards, fewer backwards);
- a forward through the wrapper on some ranks only (more evaluation forwards, waiting in one);
- a rank that left its loop early (its pass over the loader unfinished, its stack out of the
  loop, or gone, while others went on to later batches);
- an extra collective on some ranks (issued by the loop's own code where the others are in
  DDP's forward or backward);
- failing all of these, the first number where the sequences part (parting.py).
Nothing is named where the places do not show it: the caller keeps the guard's decision.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from .findings import Finding
from .findings import file_line as _file_line
from .findings import phase_words as _phase_words
from .loops import left_at, skip_before, way_out
from .parting import parted, second_thread
from .passes import in_pass, unfinished_pass
from .records import Position, RankRecord, SeqEntry

__all__ = ["Spot", "spots", "explain"]


@dataclasses.dataclass(frozen=True)
class Spot:
    """Where one rank stands in the aligned sequences."""

    rank: int
    state: str                 # running | exited | crashed | dead | missing
    waits: SeqEntry | None     # the collective it waits in, placed in its loop
    phase: str                 # forward | backward | loop | gone
    batches: int
    fwd: int
    tfwd: int
    bwd: int
    user_line: tuple[str, int] | None
    lines: Mapping[str, int] = dataclasses.field(default_factory=dict)  # forwards per line

    @property
    def evals(self) -> int:
        return self.fwd - self.tfwd


_PHASE_OF_KIND = {"ddp_forward": "forward", "backward": "backward"}


def spots(records: Sequence[RankRecord], positions: Mapping[int, Position]
          ) -> dict[int, Spot]:
    """Each rank's place; ranks whose heartbeat predates the counters are left out."""
    out: dict[int, Spot] = {}
    for rec in records:
        hb = rec.get("hb") or {}
        if "backwards" not in hb:
            continue
        r = int(rec["rank"])
        pos = positions.get(r) or {}
        seq: list[SeqEntry] = list(rec.get("sequence") or [])
        pend = [e for e in hb.get("pending") or [] if int(e[1]) >= 0]
        # The recorder's status can lag its entries: one it lists as pending may be retired
        # already (done, here or in this rank's dump); the rank waits in the first that is not.
        done = {(e["g"], e["seq"]) for e in seq if e["done"]}
        pend = [e for e in pend if not (len(e) > 5 and e[5])
                and (str(e[0]), int(e[1])) not in done] or pend
        waits: SeqEntry | None = None
        if pend and rec.get("state") == "running":
            first = min(pend, key=lambda e: (int(e[1]), str(e[0])))
            waits = next((e for e in seq if (e["g"], e["seq"]) == (str(first[0]),
                                                                    int(first[1]))), None)
            if waits is None:  # no dump from this rank: its counters stood still since
                waits = {"g": str(first[0]), "seq": int(first[1]), "op": str(first[2]),
                         "sig": "", "desc": pos.get("pending") or str(first[2]), "done": False,
                         "phase": _PHASE_OF_KIND.get(str(pos.get("kind")), "loop"),
                         "epoch": int(hb.get("epoch", 0)), "batches": int(hb.get("batches", 0)),
                         "fwd": int(hb.get("forwards", 0)),
                         "tfwd": int(hb.get("train_forwards", 0)),
                         "bwd": int(hb.get("backwards", 0)), "steps": int(hb.get("steps", 0)),
                         "thread": "", "line": None}
        gone = rec.get("state") not in (None, "running")
        lines = dict(hb.get("forward_lines") or {})
        if waits is not None:
            out[r] = Spot(r, str(rec.get("state")), waits, waits["phase"], waits["batches"],
                          waits["fwd"], waits["tfwd"], waits["bwd"], pos.get("user_line"),
                          lines)
        else:
            phase = "gone" if gone else _PHASE_OF_KIND.get(str(pos.get("kind")), "loop")
            out[r] = Spot(r, str(rec.get("state")), None, phase, int(hb.get("batches", 0)),
                          int(hb.get("forwards", 0)), int(hb.get("train_forwards", 0)),
                          int(hb.get("backwards", 0)), pos.get("user_line"), lines)
    return out


def _where(s: Spot, pos: Position) -> str:
    return str(pos.get("user") or (s.waits["line"] if s.waits else None) or "?")


def skipped_backward(sp: Mapping[int, Spot], positions: Mapping[int, Position],
                     sources: Mapping[str, list[str]]) -> Finding | None:
    """Rank b ran as many training forwards as rank a but fewer backwards, and a waits in a
    collective (or b left): b skipped the backward of a step that a is in."""
    for a in sorted(sp):
        for b in sorted(sp):
            sa, sb = sp[a], sp[b]
            if a == b or not (sb.tfwd >= sa.tfwd and sb.bwd < sa.bwd):
                continue
            if sa.waits is None and not (sb.state in ("dead", "exited")
                                         and sa.phase == "backward"):
                # (A rank in its backward whose peer died or left need not be seen waiting:
                # the transport may have failed its all-reduce already, as gloo does when the
                # gone rank died in a collective that paired with it. One that crashed on its
                # own error is told as such.)
                continue
            if sb.waits is not None and sb.phase == "forward" and sb.batches <= sa.batches:
                # b is still inside the forward of the same batch (a collective of the
                # model's own code there, as a Lightning training_step issues): b has not
                # reached its backward yet, so it cannot have skipped it.
                continue
            batch = sa.batches
            waits = sa.waits["desc"] if sa.waits else "its gradient all-reduce"
            now = (f"already in {sb.waits['desc']} ({_phase_words(sb.phase)}, batch "
                   f"{sb.batches})" if sb.waits else
                   ("gone" if sb.phase == "gone" else f"at batch {sb.batches}"))
            text = (f"rank {b} skipped the backward of batch {batch}: it ran {sb.tfwd} training "
                    f"forwards and {sb.bwd} backwards, rank {a} {sa.tfwd} and {sa.bwd}; rank "
                    f"{a} waits in {waits} ({_phase_words(sa.phase)} of batch "
                    f"{batch}) while rank {b} is {now}")
            left = None
            if sb.phase == "forward" and sa.phase == "backward":
                left = left_at(sources, sb.user_line, sa.user_line)
            if left:
                text += f". Between the forward and the backward, rank {b} left the step at {left}"
            elif sa.phase == "backward":
                # b's stack no longer shows where it left the step (it went on, or it is
                # gone): the loop itself may have one way past the backward.
                skip = skip_before(sources, sa.user_line)
                if skip:
                    text += (f". The loop has one way past the backward before {_at(sa)}: "
                             f"{skip}")
                    if sb.phase == "gone" and _LEAVES.search(skip):
                        # Its way past the backward left the loop, and the rank is gone: it
                        # left early (the backward it skipped is only the first of many).
                        return Finding("left_early", (
                            f"rank {b} left its training loop before the backward of batch "
                            f"{batch} and is gone, while rank {a} waits in "
                            f"{waits} ({_phase_words(sa.phase)} of batch {batch}): "
                            f"it ran {sb.tfwd} training forwards and {sb.bwd} backwards, rank "
                            f"{a} {sa.tfwd} and {sa.bwd}. The loop's one way out before "
                            f"{_at(sa)}: {skip}"), (b,), _file_line(skip.split(" ", 1)[0]))
            return Finding("skipped_backward", text, (b,))
    return _ran_ahead_past_a_backward(sp, sources)


# A way past the backward that leaves the loop, as skip_before quotes it (`return x`,
# `if bad: break`).
_LEAVES = re.compile(r"`\s*(?:(?:if|elif|else)\b[^`#]*:\s*)?"
                     r"(?:return|break|raise|sys\.exit|exit|os\._exit)\b")


def _deficit(s: Spot) -> int:
    """Training forwards with no backward yet, less the one in flight."""
    return s.tfwd - s.bwd - (1 if s.phase == "forward" else 0)


def _ran_ahead_past_a_backward(sp: Mapping[int, Spot], sources: Mapping[str, list[str]]
                               ) -> Finding | None:
    """Rank b skipped a backward and ran ahead (it skipped the step's later collectives too,
    as with two models and a second group): b is in a backward, further on in batches than
    rank a, with one training forward more that never got its backward, and the loop has one
    `continue` before a backward."""
    for a in sorted(sp):
        for b in sorted(sp):
            sa, sb = sp[a], sp[b]
            if (a == b or sa.waits is None or sb.phase != "backward"
                    or sb.batches <= sa.batches
                    # More forwards without backward for its training forwards (a program
                    # with two forwards per backward has a deficit that grows alike).
                    or _deficit(sb) * max(sa.tfwd, 1) <= _deficit(sa) * max(sb.tfwd, 1)):
                continue
            skip = skip_before(sources, sb.user_line, anywhere=True)
            if not skip:
                continue
            now = f"in {sb.waits['desc']} (" if sb.waits else "("
            return Finding("skipped_backward", (
                f"rank {b} skipped a backward and ran ahead: it ran {sb.tfwd} training "
                f"forwards and {sb.bwd} backwards, rank {a} {sa.tfwd} and {sa.bwd}; rank {b} "
                f"is {now}{_phase_words(sb.phase)}, batch {sb.batches}) while rank {a} waits in "
                f"{sa.waits['desc']} (batch {sa.batches}). The loop has one way past a "
                f"backward: {skip}"), (b,), _file_line(skip.split(" ", 1)[0]))
    return None


def _at(s: Spot) -> str:
    return f"{s.user_line[0]}:{s.user_line[1]}" if s.user_line else "it"


def forward_on_some_ranks(sp: Mapping[int, Spot]) -> Finding | None:
    """Rank a waits in a collective inside a forward through the wrapper and has run more
    forwards outside training (evaluation) than rank b, which is not in that forward."""
    for a in sorted(sp):
        sa = sp[a]
        if sa.waits is None or sa.phase != "forward":
            continue
        for b in sorted(sp):
            sb = sp[b]
            if b == a or sb.evals >= sa.evals:
                continue
            if sb.waits is not None and sb.phase == "forward" and sb.evals == sa.evals:
                continue
            where = _doing(sb)
            extra = _extra_line(sa, sb)
            return Finding("forward_on_some_ranks", (
                f"rank {a} waits in {sa.waits['desc']}, DDP's buffer broadcast inside a "
                f"forward through the wrapper that is not a training step ({sa.evals} such "
                f"forwards on rank {a}, {sb.evals} on rank {b}); rank {b} is {where}"
                + (f"; rank {a} ran {_times(extra[1])} at {extra[0]}, rank {b} "
                   f"{_times(extra[2])}"
                   if extra else "")), (a,), _file_line(extra[0]) if extra else None)
    return _extra_training_forward(sp)


def _extra_training_forward(sp: Mapping[int, Spot]) -> Finding | None:
    """Rank a waits inside a forward and has run more forwards per batch drawn than rank b,
    at a line where b ran fewer: a forward with gradients on and no backward after it (a look
    at the predictions on one rank) whose buffer broadcast shifted the sequences."""
    for a in sorted(sp):
        sa = sp[a]
        if sa.waits is None or sa.phase != "forward" or sa.batches <= 0:
            continue
        for b in sorted(sp):
            sb = sp[b]
            if b == a or sb.batches <= 0 or sa.fwd * sb.batches <= sb.fwd * sa.batches:
                continue
            extra = _extra_line(sa, sb)
            if extra is None:
                continue
            where = _doing(sb)
            return Finding("forward_on_some_ranks", (
                f"rank {a} ran {_times(extra[1])} through the wrapper at {extra[0]} and rank "
                f"{b} {_times(extra[2])} ({sa.fwd} forwards for {sa.batches} batches on rank {a}, "
                f"{sb.fwd} for {sb.batches} on rank {b}): each forward broadcasts the model's "
                f"buffers, so rank {a} waits in {sa.waits['desc']} "
                f"({_phase_words(sa.phase)}) while rank {b} is {where}"), (a,),
                _file_line(extra[0]))
    return None


def extra_forward_and_backward(sp: Mapping[int, Spot]) -> Finding | None:
    """Rank a ran more backwards than rank b but no more training forwards, and as many more
    forwards at a line b never ran (a check of the gradients on one batch, on rank 0 only):
    the extra backward's gradient all-reduce took a number b gave to its next step. Read as
    counters alone, the same facts say "b skipped a backward"; the line b never ran says whose
    step was the extra one."""
    for a in sorted(sp):
        sa = sp[a]
        if sa.waits is None:
            continue
        for b in sorted(sp):
            sb = sp[b]
            # Not behind b in training forwards: a's surplus of backwards is not a training
            # step b has yet to run.
            if b == a or sa.bwd <= sb.bwd or sa.tfwd > sb.tfwd:
                continue
            now = f"{sa.user_line[0]}:{sa.user_line[1]}" if sa.user_line else None
            only = [(n, line) for line, n in sa.lines.items()
                    if line != now and sb.lines.get(line, 0) == 0]
            if not only or sum(n for n, _ in only) < sa.bwd - sb.bwd:
                continue
            n, line = min(only)
            return Finding("forward_on_some_ranks", (
                f"rank {a} ran {_times(n)} through the wrapper at {line}, a line rank {b} never "
                f"ran, and {sa.bwd} backwards to rank {b}'s {sb.bwd}: its extra forward and "
                f"backward took collective numbers rank {b} gives to its next step, so rank {a} "
                f"waits in {sa.waits['desc']} ({_phase_words(sa.phase)}, batch {sa.batches}) "
                f"while rank {b} is {_doing(sb)}"), (a,), _file_line(line))
    return None


def _extra_line(sa: Spot, sb: Spot) -> tuple[str, int, int] | None:
    """(file:line, forwards of a there, of b there): the rarest line where rank a ran more
    forwards than rank b, other than the forward a is in now."""
    now = f"{sa.user_line[0]}:{sa.user_line[1]}" if sa.user_line else None
    found = [(n, line) for line, n in sa.lines.items()
             if line != now and n > sb.lines.get(line, 0)]
    if not found:
        return None
    n, line = min(found)
    return line, n, sb.lines.get(line, 0)


def _doing(s: Spot) -> str:
    """What a rank that is not in the waiting rank's forward is doing."""
    if s.waits:
        return f"in {s.waits['desc']} ({_phase_words(s.phase)})"
    return "gone" if s.phase == "gone" else "not in a collective"


def _times(n: int) -> str:
    return f"{n} forward{'' if n == 1 else 's'}"


def left_early(records: Sequence[RankRecord], sp: Mapping[int, Spot],
               positions: Mapping[int, Position],
               sources: Mapping[str, list[str]]) -> Finding | None:
    """Rank b stopped its pass over a loader before its end and is out of that loop (or
    gone), while rank a went on to a later batch and waits."""
    recs = {int(r["rank"]): r for r in records}
    for b in sorted(sp):
        sb = sp[b]
        if sb.phase not in ("loop", "gone"):
            continue
        left = unfinished_pass(recs[b], positions, sources,
                                [r.get("hb") or {} for k, r in recs.items() if k != b])
        if left is None:
            continue
        site, drawn, why = left
        # Ahead: a later batch, or the same batch drawn and its forward begun (a `break`
        # right after the batch was drawn); or, where b went on to another loader (an
        # evaluation after a `break`), still in the pass b left, at or past b's last batch.
        ahead = [a for a in sorted(sp) if a != b and sp[a].waits is not None
                 and ((sp[a].batches, sp[a].tfwd) > (sb.batches, sb.tfwd)
                      or in_pass(recs[a], site, drawn))]
        if not ahead:
            continue
        a = ahead[0]
        now = (f"waits in {sb.waits['desc']} at {_where(sb, positions.get(b) or {})}"
               if sb.waits else f"{sb.state}" if sb.phase == "gone" else "is out of the loop")
        out = way_out(sources, site)
        if out:
            why += f" (the loop's way out: {out})"
        return Finding("left_early", (
            f"rank {b} left its training loop early: {why}; it {now}, while rank {a} went on "
            f"to batch {sp[a].batches} and waits in {sp[a].waits['desc']}"  # type: ignore[index]
        ), (b,))
    return None


def extra_collective(sp: Mapping[int, Spot], positions: Mapping[int, Position]
                     ) -> Finding | None:
    """Rank a waits in a collective its loop's own code issued where rank b, at the same
    number, is in a collective of DDP's forward or backward: a collective b does not issue
    there."""
    for a in sorted(sp):
        sa = sp[a]
        if sa.waits is None or sa.phase != "loop" or sa.waits["thread"]:
            continue
        for b in sorted(sp):
            sb = sp[b]
            if b == a or sb.waits is None or sb.phase not in ("forward", "backward"):
                continue
            if (sb.waits["g"], sb.waits["seq"]) != (sa.waits["g"], sa.waits["seq"]):
                continue
            return Finding("extra_collective", (
                f"rank {a} issued {sa.waits['desc']} at {_where(sa, positions.get(a) or {})} "
                f"from its loop's own code (batch {sa.batches}); at that number rank {b} is "
                f"in {sb.waits['desc']} {_phase_words(sb.phase)} (batch {sb.batches}): rank "
                f"{b} does not issue that collective there"), (a,),
                sa.user_line or _file_line(sa.waits.get("line")))
    return None


def explain(records: Sequence[RankRecord], positions: Mapping[int, Position],
            sources: Mapping[str, list[str]]) -> Finding | None:
    """The strongest cause the aligned sequences show, or None."""
    found = second_thread(records)
    if found:
        return found
    sp = spots(records, positions)
    if len(sp) < 2:
        return None
    # A forward through the wrapper that is not a training step takes a collective number the
    # others give to their next training collective: from there on, a training forward can
    # meet a peer's backward, and the counters would read like a skipped backward. So the
    # evaluation forwards are compared first.
    return (forward_on_some_ranks(sp) or extra_forward_and_backward(sp)
            or skipped_backward(sp, positions, sources)
            or left_early(records, sp, positions, sources) or extra_collective(sp, positions)
            or parted(records, sources))
