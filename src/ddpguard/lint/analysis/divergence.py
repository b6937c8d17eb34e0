"""Compare the schedules of two rank classes (schedule.py) and say where they part.

For every function whose rank tests (its own or its callees') split the ranks, and for the
module's top level, the sequences of rank 0 and of the ranks > 0 (and, in multi-node code,
of local rank 0 on the other nodes) are aligned item by item. Matching collectives in the two
arms of a rank test (`if local_rank > 0: barrier()` ... `yield` ... `if local_rank == 0:
barrier()`; `gather(t, lst, dst)` / `gather(t, dst=dst)`) align and are no finding. What does
not align is a divergence, carrying both classes and both lines: a collective one class
reaches and the other does not (DDP005), a forward through the DDP wrapper (DDP006), or an
exit one class may take before a collective the other waits in (DDP019). A call made by both
classes whose callee then differs is left to the callee's own comparison (reported once).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher

from .callgraph import handed_away_under_rank_tests, hands_work_away, has_split, message_loop
from .consistent import marked, paths_agree
from .context import Func, ModuleInfo, dotted
from .leader_only import certain
from .projection import Item, Seq, bind_root, project
from .ranks import NODE_LEADERS, OTHERS, RANK0, RankClass
from .schedule_nodes import Ev
from .sequences import (
    _OPS,
    _colls,
    _early_exit,
    _ev_line,
    _first,
    _line,
    _no_grad,
    _no_yield,
    _op_events,
    _show,
    _v,
    _what,
    _who,
    ops,
)
from .statements import STUB

_EXIT_CODES = ("DDP019", "DDP022")


@dataclass(frozen=True)
class Divergence:
    code: str           # DDP005 collective, DDP006 DDP forward, DDP019 exit before collective,
                        # DDP022 an assert before a collective
    line: int
    message: str
    other_line: int
    other_site: int = 0   # where the compared function reaches other_line (itself, or a call)
    # DDP019: every collective the other class goes on to, in order, as (line, site, the
    # message with it); the first one the exit does not exclude is reported.
    partners: tuple[tuple[int, int, str], ...] = ()
    no_grad: bool = False   # DDP006: the forward runs under torch.no_grad()
    # DDP005 in its certain form (DDP034): the leader alone reaches the collective, the
    # others reach none in its place; what the path assumes (leader_only.certain), or None.
    leader: str | None = None
    # DDP005: the leader's stretch and the collective in it, for leader_only.certain
    lead: tuple[Seq, Item, RankClass] | None = field(default=None, compare=False, repr=False)


def divergences(info: ModuleInfo) -> list[Divergence]:
    hit = info._memo.get(("divergences", 0))
    if hit is not None:
        return hit  # type: ignore[return-value]
    out: list[Divergence] = []
    if not info.split_funcs:  # no rank test anywhere: every class runs the same code
        info._memo[("divergences", 0)] = out
        return out
    roots: list[Func | None] = [None, *(f for fns in info.funcs.values() for f in fns)]
    # Local rank 0 of another node is a class of its own only where the code tests the local
    # rank and can run on several nodes.
    pairs = [(RANK0, OTHERS)] + ([(NODE_LEADERS, OTHERS)] if info.multi_node
                                 and info.local_tests else [])
    for root in roots:
        if not has_split(info, root) or message_loop(info, root) or \
                hands_work_away(info, root) or (
                root is not None and handed_away_under_rank_tests(info, root)):
            continue
        for a, b in pairs:
            pa, pb = project(info, root, a), project(info, root, b)
            # A generator's own `yield` is where its caller's body runs: compare what each
            # class does around it as a whole (leader-goes-first context managers).
            sa, sb = _no_yield(pa.seq), _no_yield(pb.seq)
            handed = info.handed_params.get(id(root)) if root is not None else None
            if handed:
                sa, sb = bind_root(sa, handed), bind_root(sb, handed)
            found: list[Divergence] = []
            _diff(sa, sb, a, b, found, info.path)
            if found and paths_agree(sa, sb):
                # every path the two classes share reaches the same collectives in order
                continue
            if found and (marked(sa) or marked(sb)) and \
                    paths_agree(sa, sb, found_searches=True):
                # They part only where a search finds nothing (its fallback reaches a
                # collective): run-time data decides, the divergence is unproven.
                found = [d for d in found if d.code in _EXIT_CODES]
            if found and ops(sa) == ops(sb):
                # The same collectives in the same order, reached from different lines (the
                # leader-goes-first pair written as two plain `if`s): only an early exit of
                # one class can still leave the other waiting.
                found = [d for d in found if d.code in _EXIT_CODES]
            for d in found:
                if d.code not in _EXIT_CODES:
                    out.append(d if d.lead is None else
                               replace(d, leader=certain(info, *d.lead), lead=None))
                    continue
                # The first collective this exit does abandon (an exit under `not resume`
                # does not abandon a broadcast under `if resume:`, but the wrap after it).
                for line, site, message in d.partners or ((d.other_line, d.other_site,
                                                           d.message),):
                    if not _exclusive(info, root, d.line, site):
                        out.append(Divergence(d.code, d.line, message, line, site))
                        break
    info._memo[("divergences", 0)] = out
    return out


def _handler(ex: Ev) -> str:
    """Where an exit sits in an `except` handler: it leaves only when that error is caught."""
    if not ex.caught:
        return ""
    where = "a bare `except:`" if ex.caught == "except" else f"the `except {ex.caught}:`"
    return f", in {where} handler, when that error is caught there"


def _coarse(it: Item) -> tuple[object, ...]:
    """Alignment key: an event by what it is; a branch or loop by where it is; a call by
    the function it runs (the same helper called in both arms of a rank test aligns)."""
    if it.kind == "ev":
        return it.key
    return ("call", it.name, it.key[3]) if it.kind == "call" else (it.kind, it.site)


def _pairable(x: Item, y: Item) -> bool:
    """The same branch or loop as the two classes see it, or a call of the same function
    with the same literal arguments (from one site, or from the two arms of a rank test:
    `if rank == 0: training(rank) else: training(rank)`): what differs inside that callee is
    its own comparison's to report, once."""
    if x.kind != y.kind or x.kind == "ev":
        return False
    if x.kind == "call":
        return x.name == y.name and x.args == y.args
    return x.site == y.site


def _diff(sa: Seq, sb: Seq, ca: RankClass, cb: RankClass, out: list[Divergence],
          here: str = "", then_a: Seq = (), then_b: Seq = ()) -> None:
    """`then_a`/`then_b`: what each class runs once its sequence is done, as far as this
    comparison knows it (after a loop body: that body again, the next iteration). Only the
    forward-under-no_grad judgement reads them."""
    if [i.key for i in sa] == [i.key for i in sb]:
        return
    ka, kb = [_coarse(i) for i in sa], [_coarse(i) for i in sb]
    sm = SequenceMatcher(None, ka, kb, autojunk=False)

    def pair(i: int, j: int) -> None:
        x, y = sa[i], sb[j]
        if x.key == y.key or x.kind == "call" or len(x.arms) != len(y.arms):
            return  # a call both classes make: the callee's own comparison
        for ax, ay in zip(x.arms, y.arms, strict=True):
            na, nb = (ax, ay) if x.kind == "loop" else (sa[i + 1:] + then_a,
                                                         sb[j + 1:] + then_b)
            _diff(ax, ay, ca, cb, out, here, na, nb)

    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            for t in range(i2 - i1):
                pair(i1 + t, j1 + t)
            continue
        # The same branch, loop or call at either end of a changed stretch (a helper called
        # in both arms, then one more collective on one side) pairs up; what is left parts.
        while i1 < i2 and j1 < j2 and _pairable(sa[i1], sb[j1]):
            pair(i1, j1)
            i1, j1 = i1 + 1, j1 + 1
        while i1 < i2 and j1 < j2 and _pairable(sa[i2 - 1], sb[j2 - 1]):
            pair(i2 - 1, j2 - 1)
            i2, j2 = i2 - 1, j2 - 1
        if i2 - i1 + j2 - j1 == 1:
            i1, i2, j1, j2 = _slide(sa, sb, i1, i2, j1, j2)
        a, b = sa[i1:i2], sb[j1:j2]
        if a and b:
            _report(a, b, sa[i2:], sb[j2:], ca, cb, out, here, then_a, then_b)
            continue
        for k, it in enumerate(a or b):
            if a:
                _report((it,), (), sa[i1 + k + 1:], sb[j1:], ca, cb, out, here, then_a,
                        then_b)
            else:
                _report((), (it,), sa[i1:], sb[j1 + k + 1:], ca, cb, out, here, then_a,
                        then_b)


def _slide(sa: Seq, sb: Seq, i1: int, i2: int, j1: int,
           j2: int) -> tuple[int, int, int, int]:
    """One extra event on one side, the same kind of event right after it matched on the
    other: the match may be the wrong one of the two (rank 0's no_grad forward at line 13
    after the training forward at line 10, the others' forward at line 10). Pair the events of
    the same line, and report the other."""
    xs, ys, x, y = (sa, sb, i1, j2) if i2 > i1 else (sb, sa, j1, i2)
    while x + 1 < len(xs) and y < len(ys) and xs[x].key == xs[x + 1].key \
            and _ev_line(xs[x]) == _ev_line(ys[y]) != _ev_line(xs[x + 1]):
        x, y = x + 1, y + 1
    return (x, x + 1, y, y) if i2 > i1 else (y, y, x, x + 1)


def _retry(mine: Seq, theirs: Seq) -> bool:
    """A `while` loop's `continue` after which the leaving class's next collective is the
    very one the others wait in (metaseq's `if rank == 0: x = input(); if not x: continue`
    before the broadcast): it comes back to it, nothing is skipped. In a `for` loop over data
    the same `continue` drops that step's collectives, and the counts part."""
    a, b = _colls(mine), _colls(theirs)
    return bool(a and b) and a[0][0].ev is not None and b[0][0].ev is not None and \
        (a[0][0].ev.op, a[0][0].ev.line) == (b[0][0].ev.op, b[0][0].ev.line)


def _exclusive(info: ModuleInfo, root: Func | None, line: int, site: int) -> bool:
    """The exit at `line` and the collective reached at `site` sit behind tests on the same
    non-rank value (`if not fsdp_eval and not is_rank0: return` ... `if fsdp_eval:
    broadcast()`): when one class leaves, the other never reaches that collective. Judged
    within one function."""
    if not site:
        return False
    body = root.body if root is not None else info.tree.body
    exit_tests, coll_tests = _tests_around(body, line), _tests_around(body, site)
    # a test that holds both (`if __name__ == "__main__":`) parts neither from the other
    both = {id(t) for t in exit_tests} & {id(t) for t in coll_tests}
    mine = {n for t in exit_tests if id(t) not in both for part in _conjuncts(t)
            if not info.rank_level(part) for n in _names(part)}
    return bool(mine & {n for t in coll_tests for n in _names(t)})


def _tests_around(body: list[ast.stmt], line: int) -> list[ast.expr]:
    """The tests of the `if`/`while` statements (not functions) that hold `line`."""
    out: list[ast.expr] = []
    stmts = body
    while True:
        for s in stmts:
            if s.lineno <= line <= (s.end_lineno or s.lineno):
                break
        else:
            return out
        if isinstance(s, ast.If | ast.While):
            out.append(s.test)
            stmts = s.body if s.body and s.body[0].lineno <= line <= (
                s.body[-1].end_lineno or s.body[-1].lineno) else s.orelse
        elif isinstance(s, ast.For | ast.AsyncFor | ast.With | ast.AsyncWith | ast.Try):
            stmts = [*s.body, *getattr(s, "orelse", []), *getattr(s, "finalbody", []),
                     *(st for h in getattr(s, "handlers", []) for st in h.body)]
        else:
            return out


def _conjuncts(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [c for v in test.values for c in _conjuncts(v)]
    return [test]


def _names(test: ast.expr) -> set[str]:
    """The values a test reads, whole (`args.fsdp`, never its prefix `args`)."""
    out: set[str] = set()
    stack: list[ast.AST] = [test]
    while stack:
        n = stack.pop()
        d = dotted(n) if isinstance(n, ast.Name | ast.Attribute) else None
        if d is not None:
            out.add(d)
        else:
            stack.extend(ast.iter_child_nodes(n))
    return out


def _report(a: Seq, b: Seq, rest_a: Seq, rest_b: Seq, ca: RankClass, cb: RankClass,
            out: list[Divergence], here: str = "", then_a: Seq = (), then_b: Seq = ()) -> None:
    ea, eb = _first(a, _OPS), _first(b, _OPS)
    if (ea is None and eb is None) or ops(a) == ops(b):
        # Nothing to wait on, or the same collectives through different lines (the send and
        # receive sides of one broadcast in two arms): an exit before them is what can part.
        _exits(a, b, rest_a, rest_b, ca, cb, out, here, then_a, then_b)
        return
    # Past what both reach alike (a helper called from each arm, then one more collective on
    # one side): the finding is where they part, not the shared start.
    la, lb = _op_events(a), _op_events(b)
    k = 0
    while k < len(la) and k < len(lb) and la[k][0] == lb[k][0]:
        k += 1
    if k:
        ea = la[k][1] if k < len(la) else None
        eb = lb[k][1] if k < len(lb) else None
        rest_a, rest_b = (), ()
    if ea is None:
        ea, eb, a, b, rest_b, ca, cb = eb, None, b, a, rest_a, cb, ca
        then_b = then_a
    assert ea is not None
    it, via = ea
    ev = it.ev
    assert ev is not None
    code = "DDP005" if ev.kind == "coll" else "DDP006"
    if code == "DDP006" and _no_grad(a, it) and _pairs_with_a_forward(eb, b, rest_b, k,
                                                                       then_b):
        # A forward under no_grad syncs the buffers once at most (the flag it clears skips
        # that class's next sync), and the other ranks' next forward makes the same
        # broadcast: the counts meet. Only another collective on the other side hangs: the
        # one this class reaches after that forward (an evaluation that all-reduces its
        # metric, called on rank 0 alone).
        later = _colls(a) if eb is None and not k else []
        if not later:
            # The counts meet, but the class may still leave after its evaluation (rank 0's
            # early-stop `break` after its validation forwards through the wrapper).
            if eb is None and not k:
                _exits(a, b, rest_a, rest_b, ca, cb, out, here, then_a, then_b, True)
            return
        (it, via), code = later[0], "DDP005"
        ev = it.ev
        assert ev is not None
    lead: tuple[Seq, Item, RankClass] | None = None
    if eb is not None:
        other = f"{_who(cb, eb[0])} {_v(cb, 'reach')} {_what(*eb, here)} instead"
        other_line = _line(*eb)
    elif code == "DDP005" and ev.text and ca is OTHERS:
        # The ranks > 0 alone in a collective of a group of their own (`barrier(workers)`, a
        # new_group without the parameter server): rank 0 need not be in that group.
        return
    else:
        x = _early_exit(b) if not k else None
        nxt = _first(rest_b, _OPS)
        if x is not None and x[0].ev is not None and code == "DDP005" and \
                x[0].ev.op in ("raise", "assert"):
            # The other class fails first (`if rank != server: raise RuntimeError(...)`, a
            # role check): the launcher ends the job; no rank waits long (DDP022's part).
            return
        if x is not None and x[0].ev is not None:
            ev = x[0].ev
            other = f"{_who(cb, x[0])} {_v(cb, 'leave')} at line {ev.line} ({ev.op}) first"
            other_line = x[0].ev.line
        elif nxt is not None:
            other = f"{_who(cb, nxt[0])} {_v(cb, 'skip')} it and go on to {_what(*nxt, here)}"
            other_line = _line(*nxt)
        else:
            other = f"{cb.name} never {'reach' if _v(cb, 'reach') == 'reach' else 'reaches'} it"
            other_line = 0
        if code == "DDP005" and (x is None or x[0].ev is None) and ca in (RANK0, NODE_LEADERS):
            lead = (a, it, ca)
    # DDP006's consequence depends on the model's buffers, which the rule weighs: it adds the tail.
    tail = "; the ranks reach different collective sequences and wait on each other" \
        if code == "DDP005" else ""
    out.append(Divergence(code, _line(it, via),
                          f"{_who(ca, it)} {_v(ca, 'reach')} {_what(it, via, here)}, {other}{tail}",
                          other_line, no_grad=code == "DDP006" and _no_grad(a, it),
                          lead=lead))


def _exits(a: Seq, b: Seq, rest_a: Seq, rest_b: Seq, ca: RankClass, cb: RankClass,
           out: list[Divergence], here: str, then_a: Seq, then_b: Seq,
           past_no_grad: bool = False) -> None:
    """An exit one class takes where the other goes on to a collective: in its arm, after the
    branch, or (a `break`, an exit) in the loop's next iteration. `past_no_grad`: `a`'s
    forwards under no_grad pair with the other ranks' next forward; an exit after them
    counts."""
    for x, cx, side, rest, co, then, mine in (
            (_early_exit(a, past_no_grad=past_no_grad), ca, b, rest_b, cb, then_b, then_a),
            (_early_exit(b), cb, a, rest_a, ca, then_a, then_b)):
        if x is None or x[0].ev is None or x[0].ev.op in ("yield", STUB):
            continue
        ex = x[0].ev
        if ex.op == "continue" and ex.text == "while" and _retry(mine, (*side, *rest)):
            continue
        partners = []
        # A `break` leaves the loop the others go on with, an exit the program: their
        # next iteration's collectives wait too (early stopping decided on rank 0 alone),
        # and so does its training forward (the backward after it all-reduces).
        later = _colls(then, fwd=True) if ex.op in ("break", "exit") else []
        now = _colls((*side, *rest))
        for k, (it, via) in enumerate([*now, *later]):
            nx = it.ev
            assert nx is not None
            when = " in the loop's next iteration" if k >= len(now) else ""
            partners.append((nx.line, via[0] if via else nx.line, (
                f"{_who(cx, x[0])} can leave at line {ex.line} ({ex.op}{_handler(ex)}) while "
                f"{_who(co, it)} {_v(co, 'go')} on to {_what(it, via, here)}{when}: "
                "the ranks still in it wait for ranks that are gone")))
        if partners:
            line, site, message = partners[0]
            # An assert that can fire, or a `raise`, is a failure, not a rank leaving in
            # good order: torchrun (and torch.distributed.launch, mp.spawn) tears the
            # whole job down when one rank fails, so nothing waits for long; only
            # launchers that let the others run (srun without --kill-on-bad-exit) leave
            # them in the collective until the timeout. DDP022 (off by default), not
            # DDP019 (reviewers judged a rank-0 `raise` reported as DDP019 false).
            code = "DDP022" if ex.kind == "mayexit" or ex.op == "raise" else "DDP019"
            out.append(Divergence(code, _line(*x), message, line, site,
                                  tuple(partners)))


def _pairs_with_a_forward(eb: tuple[Item, tuple[int, ...]] | None, b: Seq, rest_b: Seq,
                          k: int, then_b: Seq) -> bool:
    """What the other class waits in next is a forward of the wrapper: in its own arm, after
    the branch, or at the start of the loop's next iteration. (After the last iteration the
    broadcast may find no partner; that is left to the guard at run time.)"""
    if eb is not None:
        nxt: tuple[Item, tuple[int, ...]] | None = eb
    else:
        nxt = (_first(b, _OPS) if not k else None) or _first(rest_b, _OPS) or \
            _first(then_b, _OPS)
    return nxt is not None and nxt[0].ev is not None and nxt[0].ev.kind == "fwd"


def explain(info: ModuleInfo, func: Func | None = None) -> str:
    """The schedules of each class for `func` (the module when None), one line per item:
    the reasoning behind a verdict, for tests and for `python -m`-style debugging."""
    lines = []
    for cls in (RANK0, OTHERS, NODE_LEADERS):
        lines.append(f"{cls.name}: " + "; ".join(_show(i) for i in project(info, func, cls).seq))
    return "\n".join(lines)


