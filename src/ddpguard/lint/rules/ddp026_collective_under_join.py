"""DDP026 a collective of the program's own inside DDP's `join`.

`with model.join():` is how a loop says its ranks may run out of batches at different steps:
a rank that has finished shadows the collectives of DDP's own forward and backward (and of any
`Joinable` passed to `Join`) until the others finish too. It shadows nothing else. An
`all_reduce` of a logged accuracy, a `barrier` around a timed phase or a metric gathered after
the loop but still inside the block is issued only by the ranks that still hold batches, or by
the finished ranks while the others are still in a backward: the ranks wait in different
collectives and the job hangs (or, with equal shapes, sums the wrong tensors). The block exists
because the inputs are uneven, so the condition is the loop's normal case, not a corner.
Reported once per block and collective, at its first call from the block's first loop on
(directly or through a function of the file it calls); before the loop every rank is at the
same point. Not reported under `join(throw_on_early_termination=True)`,
where every rank leaves at the first one's end. Fix: issue the collective after the `with`
block, or make the extra ranks enter it too (a Joinable of your own).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import CallRec, Func, ModuleInfo, is_collective, kwarg
from ..analysis.provenance import dotted
from ..registry import Hit, rule


@rule('DDP026', 'collective-under-join', 'warning',
      "a collective of the program's own inside `with model.join():` (Join shadows only "
      "DDP's)",
      'issue it after the join block, or register it as a Joinable')
def ddp026(info: ModuleInfo) -> Iterator[Hit]:
    for join in info.calls_named("join", "Join"):
        block = _join_block(info, join)
        if block is None:
            continue
        # Before the block's first loop every rank is at the same point (a barrier that
        # starts a timed epoch): only from the loop on do the ranks' batches part them.
        loops = [n.lineno for n in ast.walk(block) if isinstance(n, ast.For | ast.While)]
        if not loops:
            continue
        lo, hi = min(loops), block.end_lineno or block.lineno
        seen: set[str] = set()
        for rec in info.calls:
            if rec.func is not join.func or not lo <= rec.node.lineno <= hi:
                continue
            name, line = _collective(info, rec)
            if name and name not in seen:
                seen.add(name)
                via = f" (inside {rec.last}(), line {line})" if line else ""
                yield rec.node, "DDP026", (
                    f"{name}(){via} runs inside `with {ast.unparse(join.node)}:` (line "
                    f"{join.node.lineno}): Join shadows DDP's own collectives for a rank that "
                    "has run out of batches, not this one; with uneven batches (why the "
                    "block is there) the ranks wait in different collectives")


def _join_block(info: ModuleInfo, join: CallRec) -> ast.With | None:
    """The `with` whose item is DDP's `model.join(...)` or torch's `Join([...])`, unless it
    throws at the first rank's end."""
    with_ = join.stmt
    if not isinstance(with_, ast.With | ast.AsyncWith) or \
            not any(item.context_expr is join.node for item in with_.items):
        return None
    f = join.node.func
    if join.last == "join":
        owner = dotted(f.value) if isinstance(f, ast.Attribute) else None
        if owner is None or not any(h in owner.lower() for h in ("model", "ddp", "net")):
            return None
    elif not (info.qualify(f) or "").endswith("join.Join"):
        return None
    throw = kwarg(join.node, "throw_on_early_termination")
    if isinstance(throw, ast.Constant) and throw.value is True:
        return None
    return with_  # type: ignore[return-value]


def _collective(info: ModuleInfo, rec: CallRec) -> tuple[str, int]:
    """(name, 0) for a collective of torch.distributed; (name, line) for one inside a function
    of this file that `rec` calls; ("", 0) otherwise."""
    if is_collective(rec):
        return rec.last, 0
    callees: list[Func] = info.local_callees(rec)
    for inner in info.calls:
        if inner.func in callees and is_collective(inner):
            return inner.last, inner.node.lineno
    return "", 0


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.distributed as dist

with model.join():
    for step, batch in enumerate(loader):
        model(batch).sum().backward()
        if step % 100 == 0:
            dist.all_reduce(acc)  # the ranks that ran out are not here
"""

RULE = ddp026
