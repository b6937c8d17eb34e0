"""A training loop that stops on the rank's own clock (DDP004's wall-clock form).

    start = time.time()
    for batch in loader:
        loss.backward()                              # DDP's all-reduce, every step
        if time.time() - start > budget: break       # each rank reads its own clock

Every rank reads its clock at its own moment, so the ranks cross the budget at different
steps: the one that leaves first is missing from the next step's all-reduce, where the others
wait for it. Reported at the `if` when its test reads a clock (`time.time()`,
`time.perf_counter()`, `time.monotonic()`, `datetime.now()`), directly or through a name the
function assigns from one (`used = time.time() - t0`), the arm leaves the loop (`break`,
`return`), and the loop reaches a collective or a backward each turn; not where that name
goes through a collective in the function (an agreed value), and not under a rank test. A
backward counts as a sync only where the program keeps a DDP wrapper (a wrapper built and
thrown away syncs nothing: DDP039).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from .collective_reach import reaches_collective
from .context import Func, Loop, ModuleInfo, dotted, is_collective

_CLOCKS = {"time.time", "time.perf_counter", "time.monotonic", "time.time_ns",
           "datetime.datetime.now", "datetime.now"}


_CLOCK_LASTS = {q.rsplit(".", 1)[-1] for q in _CLOCKS}


def clock_exits(info: ModuleInfo, syncs: frozenset[str]) -> Iterator[tuple[ast.If, str]]:
    """(the `if`, its test as written) for each exit of a syncing loop on the rank's clock."""
    if not _CLOCK_LASTS.intersection(info.call_lasts()):
        return   # no clock read in the module: the common case, one set lookup
    tables: dict[int, set[str]] = {}
    for lrec in info.loops:
        loop, fn = lrec.node, lrec.func
        if lrec.guard or fn is None:
            continue
        exits = [s for s in loop.body if isinstance(s, ast.If) and any(
            isinstance(b, ast.Break | ast.Return) for b in s.body)]
        if not exits:
            continue
        timed = tables.get(id(fn))
        if timed is None:
            timed = tables[id(fn)] = _clock_names(info, fn)
        hits = [s for s in exits if _reads_clock(info, s.test, timed)]
        # a backward syncs only through a DDP wrapper the program keeps
        if not hits or not _syncs(info, loop, syncs if kept_wrapper(info) else frozenset()):
            continue
        for s in hits:
            yield s, ast.unparse(s.test)


def _clock_names(info: ModuleInfo, fn: Func) -> set[str]:
    """Names (and `self.` attributes) the function assigns from a clock reading, unless one
    of them goes through a collective there (an agreed value)."""
    out: set[str] = set()
    for _ in range(2):   # `t = time.time()`, then `used = t - start`
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and _reads_clock(info, n.value, out):
                out |= {d for t in n.targets if (d := dotted(t)) is not None}
    shared = {d for r in info.calls if r.func is fn and is_collective(r)
              for a in r.node.args for x in ast.walk(a) if (d := dotted(x)) in out}
    return out - shared


def _reads_clock(info: ModuleInfo, node: ast.AST, names: set[str]) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and (info.qualify(n.func) or "") in _CLOCKS:
            return True
        if isinstance(n, ast.Name | ast.Attribute) and dotted(n) in names:
            return True
    return False


def kept_wrapper(info: ModuleInfo) -> bool:
    """Some file linted with this one builds a DDP wrapper and keeps it (not a statement of
    its own, DDP039's)."""
    infos = getattr(info.file_set, "infos", None) or [info]
    return any(m.is_ddp_call(r.node) and not (isinstance(r.stmt, ast.Expr)
                                             and r.stmt.value is r.node)
               for m in infos if m.wraps_ddp for r in m.calls)


def _syncs(info: ModuleInfo, loop: Loop, syncs: frozenset[str]) -> bool:
    """Some call in the loop reaches a collective or DDP's backward each turn (not under a
    rank test)."""
    return any(loop in r.loops and not r.guard and reaches_collective(info, r, syncs)
               for r in info.calls)
