"""The certain form of a collective on the leader alone (DDP034, DDP005's default part).

divergence.py finds that rank 0 (or local rank 0) reaches a collective and the other ranks
reach none in its place. That is certain, not a guess about run-time data, when nothing on
the way down to the collective could make rank 0 miss it either: inside the helpers it calls,
the collective is on every path (their tests decided by the literals the call passes or by
the program being distributed, never a loop that may run zero times), and in the compared
function the only tests between the rank test and the call are options, the same on every
rank, which the message names as what it assumes (`args.swa and epoch >= args.swa_start`).
"""

from __future__ import annotations

import ast

from .context import ModuleInfo, dotted
from .projection import Item, Seq
from .ranks import TRUE, RankClass, evaluate_test, splits


def certain(info: ModuleInfo, seq: Seq, target: Item, cls: RankClass) -> str | None:
    """What the path from the start of `seq` (the stretch `cls`, a leader class, reaches and
    the others do not) to the collective `target` assumes: the option tests it passes, as
    text ("" for none); None where it is not certain."""
    if target.ev is None or target.ev.text:
        return None  # a group of its own (`group=leaders`) may hold the leader alone
    path = _enclosing(seq, target)
    if path is None:
        return None
    assumed: list[str] = []
    called = False
    for it, arm in path:
        if it.kind == "call":
            called = True
            continue
        if it.kind == "loop" and (not called or _over_loader(it.test)):
            # the compared function's own loop (epochs, batches), or a helper's loop over a
            # data loader (vit-sr's rank-0 `validate()` all-reduces every batch): it runs
            continue
        if called or it.kind != "alt" or it.fallback or it.received or it.test is None:
            # A test or a loop inside a helper (it may run zero times), a test that
            # follows run-time data: the leader may miss the collective too.
            return None
        parts = _conjuncts(it.test) if arm == 0 else [it.test]
        for part in parts:
            if not splits(info, part):
                assumed.append(f"`{ast.unparse(part)}` is {'true' if arm == 0 else 'false'}")
            elif arm != 0 or evaluate_test(info, part, cls) != TRUE:
                # a rank test this class may fail, or per-rank data (`is_main and loss > 0`)
                return None
    return ", ".join(assumed)


def _conjuncts(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [c for v in test.values for c in _conjuncts(v)]
    return [test]


def _enclosing(seq: Seq, target: Item) -> list[tuple[Item, int]] | None:
    """The items (and which of their arms) that hold `target`, outermost first."""
    for it in seq:
        if it is target:
            return []
        for k, arm in enumerate(it.arms):
            inner = _enclosing(arm, target)
            if inner is not None:
                return [(it, k), *inner]
    return None


def _over_loader(it: ast.expr | None) -> bool:
    """`for batch in val_loader:` (or `enumerate(...)`, `tqdm(...)` of one): a loop over a
    data loader, which a non-empty dataset makes run at least once."""
    while isinstance(it, ast.Call) and it.args and isinstance(it.func, ast.Name) \
            and it.func.id in ("enumerate", "tqdm", "iter"):
        it = it.args[0]
    name = dotted(it) if it is not None else None
    return name is not None and "loader" in name.rsplit(".", 1)[-1].lower()
