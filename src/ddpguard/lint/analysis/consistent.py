"""Path by path: two rank classes that take the same arm of every test that does not split
the ranks (a flag, a config value: the same on every rank) and then reach the same collectives
in the same order do not diverge, whatever the structural alignment says (OpenMatch's
`if only_load_in_master: if not is_first_worker(): barrier(); return` ... `barrier()`: one
barrier per rank on every path)."""

from __future__ import annotations

from itertools import product

from .projection import Seq

_LIMIT = 8   # tests enumerated at most (2**8 paths); beyond, the alignment's answer stands


def paths_agree(sa: Seq, sb: Seq, found_searches: bool = False) -> bool:
    """`found_searches`: every search's fallback arm (runtime_tests.fallback) is left untaken,
    as when the searches find what they look for, and a test of a value a collective
    delivered (runtime_tests.received) takes the arm that matches the sender's own choice."""
    sites: list[int] = []
    if not (_sites(sa, sites) and _sites(sb, sites)) or len(sites) > _LIMIT:
        return False
    fallbacks: set[int] = set()
    received: set[int] = set()
    if found_searches:
        _marked(sa, "fallback", fallbacks)
        _marked(sb, "fallback", fallbacks)
        _marked(sa, "received", received)
        _marked(sb, "received", received)
    free = [s for s in sites if s in received and s not in fallbacks]
    sites = [s for s in sites if s not in fallbacks and s not in received]
    for bits in product((0, 1), repeat=len(sites)):
        choice = dict(zip(sites, bits, strict=True))
        choice.update((s, 1) for s in fallbacks)
        if not any(_linear(sa, c)[0] == _linear(sb, c)[0] for c in (
                {**choice, **dict(zip(free, more, strict=True))}
                for more in product((0, 1), repeat=len(free)))):
            return False
    return True


def _sites(seq: Seq, out: list[int]) -> bool:
    """The non-splitting tests of `seq`, in `out`; False if some test may differ per rank."""
    for it in seq:
        if it.kind == "alt":
            if it.split or len(it.arms) != 2:
                return False
            if it.site not in out:
                out.append(it.site)
        if not all(_sites(a, out) for a in it.arms):
            return False
    return True


def marked(seq: Seq) -> bool:
    """`seq` holds a test that runtime_tests read (a search's fallback, a delivered value)."""
    return any(it.kind == "alt" and (it.fallback or it.received) or any(marked(a) for a in it.arms)
               for it in seq)


def _marked(seq: Seq, flag: str, out: set[int]) -> None:
    for it in seq:
        if it.kind == "alt" and getattr(it, flag):
            out.add(it.site)
        for a in it.arms:
            _marked(a, flag, out)


def _linear(seq: Seq, choice: dict[int, int]) -> tuple[list[object], str]:
    """The collectives and forwards of one path, and how it ends: "" (falls through),
    "end" (leaves the function), "break" or "continue" (leaves the loop body)."""
    out: list[object] = []
    for it in seq:
        ev = it.ev
        if ev is not None:
            if ev.kind in ("coll", "fwd"):
                out.append(it.key)
            elif ev.kind == "exit":
                return out, ev.op if ev.op in ("break", "continue") else "end"
            continue
        if it.kind == "alt":
            got, how = _linear(it.arms[choice[it.site]], choice)
        elif it.kind == "loop":
            # A `break` on this path ends the loop (the iterations that follow are gone), a
            # `return` the function.
            body, end = _linear(it.arms[0], choice)
            # A loop that reaches no collective on this path is nothing to the other ranks.
            got = [("loop", it.site, tuple(body), end)] if body else []
            how = "end" if end == "end" else ""
        else:  # a call: its own return ends only the callee
            got, how = _linear(it.arms[0], choice) if it.arms else ([], "")
            how = "" if how == "end" and it.kind == "call" else how
        out.extend(got)
        if how:
            return out, how
    return out, ""
