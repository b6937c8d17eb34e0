"""Tests of a function's schedule that no rank class decides, read for what they mean: a
DataLoader worker's arm (no rank takes it), a value a collective just delivered (the sender
chose it), and a search's fallback (run-time data). schedule.py marks them on the tree;
consistent.py and projection.py weigh them."""

from __future__ import annotations

import ast

from .callgraph import calls_by_func, is_collective, params_of
from .context import Func, ModuleInfo, dotted
from .ranks import FALSE, TRUE, UNKNOWN


def in_a_rank(test: ast.expr) -> int:
    """A test of whether the code runs in a DataLoader worker (`get_worker_info() is None`,
    omnivore's `not is_torch_dataloader_worker()`), decided for a rank: the ranks are the
    main processes, and the workers make no collectives (the worker's arm is no rank's
    path). TRUE/FALSE, or UNKNOWN for any other test."""
    neg = False
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, neg = test.operand, not neg
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and \
            isinstance(test.ops[0], ast.Is | ast.IsNot) and \
            isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None:
        call, value = test.left, isinstance(test.ops[0], ast.Is)
    else:
        call, value = test, False
    if not isinstance(call, ast.Call):
        return UNKNOWN
    name = (dotted(call.func) or "").rsplit(".", 1)[-1].lower()
    if name != "get_worker_info" and not ("worker" in name and "dataloader" in name):
        return UNKNOWN
    return TRUE if value != neg else FALSE


def received(info: ModuleInfo, func: Func | None, test: ast.expr) -> bool:
    """The test reads a value a collective of this function delivered before it (`size =
    tensor_size.item()` after `broadcast(tensor_size, src)`, then `if size == 0:`): it is
    the sender's decision, the same on every receiver (verl's and sglang's
    `broadcast_pyobj`: the source sends a size and, unless it is 0, the payload)."""
    if func is None:
        return False
    memo: dict[int, list[tuple[int, str]]] = info._memo.setdefault(  # type: ignore[assignment]
        ("received", 0), {})
    sent = memo.get(id(func))
    if sent is None:
        sent = memo[id(func)] = [
            (r.node.lineno, d) for r in calls_by_func(info).get(id(func), ())
            if is_collective(r) and r.node.args for d in [dotted(r.node.args[0])]
            if d is not None]
    bufs = {d for line, d in sent if line < test.lineno}
    if not bufs:
        return False
    first = func.lineno

    def reads(node: ast.AST, depth: int) -> bool:
        for n in ast.walk(node):
            d = dotted(n) if isinstance(n, ast.Name | ast.Attribute) else None
            if d is None:
                continue
            if d in bufs:
                return True
            if depth < 2 and isinstance(n, ast.Name) and any(
                    first <= line < test.lineno and reads(v, depth + 1)
                    for line, v in info.assigns.get(n.id, [])):
                return True
        return False
    return reads(test, 0)


def fallback(info: ModuleInfo, func: Func | None, test: ast.expr) -> bool:
    """`if dir_name is None:` / `if not found:` on a local name the function set to a
    placeholder and then, maybe, to a value (a search over handlers, files, candidates): the
    arm is the fallback when the search found nothing, which depends on run-time data the
    text does not show (PixelRec's and MicroLens's `get_tensorboard`, whose fallback alone
    reaches a barrier)."""
    if func is None:
        return False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        name = test.operand
    elif isinstance(test, ast.Compare) and len(test.ops) == 1 and \
            isinstance(test.ops[0], ast.Is) and isinstance(test.comparators[0], ast.Constant) \
            and test.comparators[0].value is None:
        name = test.left
    else:
        return False
    if not isinstance(name, ast.Name) or name.id in params_of(func):
        return False
    first, last = func.lineno, test.lineno
    sets = [v for line, v in info.assigns.get(name.id, []) if first <= line < last]
    return len(sets) >= 2 and isinstance(sets[0], ast.Constant) and \
        sets[0].value in (None, False, "", 0) and \
        any(not isinstance(v, ast.Constant) for v in sets[1:])
