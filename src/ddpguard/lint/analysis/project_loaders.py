"""Epoch loops over a loader that another function of the project builds or hands in (DDP001's
fifth and sixth styles): the loader comes back from a project function of any file
(`IteratorDataset = DatasetInstance.decoder_batch_features(...)`, `self.train_data,
self.train_loader = self._get_data(flag="train")`), or a caller in another file passes it to
the function the loop is in (`train(model, train_loader=train_dataloader, ...)` in
finetune/finetune_fully.py, the loop in models/pangu_sample.py). Either way the sampler is out
of the loop's sight, so a set_epoch on it could be anywhere: the style is reported only where
no file linted calls set_epoch at all."""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterator

from .bindings import stores
from .callgraph import is_generator, resolve
from .context import LoopRec, ModuleInfo, dotted, wraps_iterable
from .param_flow import is_parameter, passed
from .sharded_loaders import loop_source, returned_samplers

Shuffles = Callable[[ast.Call, ModuleInfo], bool]
Found = tuple[LoopRec, str]


def set_epoch_anywhere(info: ModuleInfo) -> bool:
    infos = getattr(info.file_set, "infos", None) or [info]
    return any(r.last == "set_epoch" for m in infos for r in m.calls)


def built_by_helper(info: ModuleInfo, shuffles: Shuffles,
                    evaluation: Callable[[str], bool]) -> Iterator[Found]:
    """An epoch loop over a loader that a project function returns, built with a shuffling
    DistributedSampler: bound in the loop's function (in each arm that binds it, from such a
    call) or, for `self.x`, in any method of the class, alone or unpacked from a tuple."""
    infos = getattr(info.file_set, "infos", None) or [info]
    if set_epoch_anywhere(info):
        return
    seen: set[int] = set()
    for lrec in info.loops:
        if isinstance(lrec.node, ast.While) or not lrec.loops or lrec.func is None \
                or id(lrec.loops[-1]) in seen:
            continue
        src = loop_source(lrec.node.iter)
        name = dotted(src) if isinstance(src, ast.Name | ast.Attribute) else None
        if name is None or evaluation(name.rsplit(".", 1)[-1]) or (
                "." in name and not name.startswith("self.")) or name.count(".") > 1:
            continue
        bound = _bindings(info, lrec, name)
        values = [v for v in bound if isinstance(v, ast.Call)]
        if not values or len(values) != len(bound):
            continue
        found = [x for v in values for x in _returned(info, infos, v, shuffles)]
        if not found:
            continue
        m, sampler = found[0]
        maker = info.callee_last(values[0])
        yield lrec, (
            f"the DistributedSampler created at {os.path.basename(m.path)}:{sampler.lineno} "
            f"(in {maker}(), which builds `{name}`) drives this epoch loop but set_epoch is "
            "never called: every epoch repeats the same order")
        seen.add(id(lrec.loops[-1]))


def handed_in(info: ModuleInfo, shuffles: Shuffles, evaluation: Callable[[str], bool]
              ) -> Iterator[tuple[LoopRec, str, ModuleInfo]]:
    """An epoch loop over a parameter of its function that a call in another file fills with
    a loader built on a shuffling DistributedSampler (this file's own callers are
    loop_samplers' part); with the caller's module."""
    file_set = info.file_set
    infos = getattr(file_set, "infos", None) or []
    if len(infos) < 2 or set_epoch_anywhere(info):
        return
    for lrec in info.loops:
        fn = lrec.func
        if isinstance(lrec.node, ast.While) or not lrec.loops or fn is None \
                or is_generator(info, fn):
            continue
        src = loop_source(lrec.node.iter)
        if not isinstance(src, ast.Name) or not is_parameter(fn, src.id) \
                or evaluation(src.id) or _rebound(fn, src.id):
            continue
        for m in infos:
            if m is info:
                continue
            for rec in m.calls_named(fn.name):
                hit = resolve(m, rec)
                arg = passed(fn, rec.node, src.id) if hit is not None and hit[1] is fn else None
                samplers = [s for s in m.samplers_of(arg) if shuffles(s, m)] \
                    if arg is not None else []
                if not samplers:
                    continue
                where = os.path.basename(m.path)
                yield lrec, (
                    f"the DistributedSampler created at {where}:{samplers[0].lineno} reaches "
                    f"this epoch loop as `{src.id}` through the call of {fn.name}() at "
                    f"{where}:{rec.node.lineno}, but set_epoch is never called: every epoch "
                    "repeats the same order"), m
                return


def _returned(info: ModuleInfo, infos: list[ModuleInfo], call: ast.Call,
              shuffles: Shuffles) -> list[tuple[ModuleInfo, ast.Call]]:
    """The shuffling DistributedSamplers of the loaders the project function `call` runs
    returns (not a wrapper that iterates what it is given): the one it resolves to (a method
    of the caller's class over its base's stub), or the one function of that name."""
    name = info.callee_last(call)
    if wraps_iterable(name) or name == "cycle":
        return []
    rec = info.call_rec(call)
    hit = resolve(info, rec) if rec is not None else None
    if hit is None and sum(len(m.funcs.get(name, [])) for m in infos) != 1:
        return []
    return [(m, v) for m, v in returned_samplers(infos, name, only=hit[1] if hit else None)
            if shuffles(v, m)]


def _bindings(info: ModuleInfo, lrec: LoopRec, name: str) -> list[ast.expr]:
    """What `name` is bound to before it is looped over: a plain name in the loop's function,
    `self.x` in the methods of the loop's class; a tuple target binds the whole value."""
    fn = lrec.func
    assert fn is not None
    scopes: list[ast.AST] = [fn]
    if name.startswith("self."):
        cls = info.classes.get(info.func_class.get(fn, ""))
        if cls is None:
            return []
        scopes = [cls]
    out: list[ast.expr] = []
    for scope in scopes:
        for n in ast.walk(scope):
            if isinstance(n, ast.Assign) and any(
                    dotted(t) == name or isinstance(t, ast.Tuple | ast.List)
                    and any(dotted(e) == name for e in t.elts) for t in n.targets):
                out.append(n.value)
    return out


def _rebound(fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    return stores(fn, name) > 0
