"""The samplers a loop iterates: through the loader it loops over, a progress bar or enumerate
around it, or a parameter of the function the loop is in (by name module-wide, or else what the
function's callers in this file pass for it: fcn-pytorch's `train_net(cfg, model,
train_dataloader)` whose epoch loop iterates its `data_loader`)."""

from __future__ import annotations

import ast

from .callgraph import file_callers
from .context import (
    Func,
    LoopRec,
    ModuleInfo,
    loader_samplers,
    orders_by_sampler,
    wraps_iterable,
)
from .param_flow import is_parameter, passed


def loop_samplers(info: ModuleInfo, lrec: LoopRec) -> list[ast.Call]:
    """The samplers behind a loop's iterable. Names are resolved module-wide, except that a
    plain name assigned in the loop's own function means that assignment (`evaluate()`'s
    `epoch_iterator = tqdm(eval_dataloader)`, not `train()`'s of the same name)."""
    fn, node = lrec.func, lrec.node
    if isinstance(node, ast.While):
        return []
    if fn is None:
        return info.samplers_of(node.iter)  # memoised: one list per name
    key = ("loop_samplers", id(node))
    hit = info._memo.get(key)
    if hit is None:
        # one entry per sampler: the paths to it through names and callers repeat it
        hit = info._memo[key] = list({id(s): s for s in _scoped(info, fn, node.iter, 0)}
                                     .values())
    return hit  # type: ignore[return-value]


def _scoped(info: ModuleInfo, fn: Func, node: ast.expr, depth: int) -> list[ast.Call]:
    while isinstance(node, ast.Call) and wraps_iterable(info.callee_last(node)) and node.args:
        node = node.args[0]
    if depth > 8:
        return []
    if isinstance(node, ast.Name):
        local = [v for line, v in info.assigns.get(node.id, [])
                 if fn.lineno <= line <= (fn.end_lineno or fn.lineno)]
        if not local:
            found = info.samplers_of(node)
            if not found and depth < 4:
                found = [s for caller, arg in _passed(info, fn, node.id)
                         for s in (_scoped(info, caller, arg, depth + 2) if caller is not None
                                   else info.samplers_of(arg))]
            return found
        return [s for v in local for s in _scoped(info, fn, v, depth + 1)]
    if isinstance(node, ast.IfExp):
        return [*_scoped(info, fn, node.body, depth + 1),
                *_scoped(info, fn, node.orelse, depth + 1)]
    if isinstance(node, ast.Call):
        last = info.callee_last(node)
        if orders_by_sampler(last):
            return [s for arg in loader_samplers(node, first_arg=last == "BatchSampler")
                    for s in _scoped(info, fn, arg, depth + 1)]
        return [node] if info.is_dist_sampler(node) else []
    return info.samplers_of(node)



def _passed(info: ModuleInfo, fn: Func, name: str) -> list[tuple[Func | None, ast.expr]]:
    """What each call of `fn` in this file passes for its parameter `name`, with the function
    the call is in."""
    if not is_parameter(fn, name) or _generator(fn):
        return []  # a generator's loops run at its consumer's pace (DDP001's endless cycle)
    return [(rec.func, arg) for rec in file_callers(info).get(id(fn), [])
            if (arg := passed(fn, rec.node, name)) is not None]


def _generator(fn: Func) -> bool:
    return any(isinstance(n, ast.Yield | ast.YieldFrom) for n in ast.walk(fn))
