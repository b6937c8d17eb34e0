"""DDP001 set_epoch missing.

A shuffling DistributedSampler feeds a loop over epochs (directly, or through a helper such as
`train_one_epoch(loader)` that iterates that parameter) and nothing in that loop calls
`set_epoch` on it: every epoch repeats the same order. A `shuffle=False` (validation) sampler
needs none; a helper called inside the batch loop (`adjust_lr(loader, step)`) is no epoch. Nor
reported: a set_epoch in a method the epoch loop calls by name on another object (a hook's
`before_epoch`, `for h in self.hooks: h.before_epoch(epoch)`), a sampler made afresh each epoch
with a seed that is not a constant (`DistributedSampler(ds, seed=epoch)`), and a sampler class
of the file that moves its own epoch on (`self.epoch += 1` in `__iter__`). Also not: a loop over
datasets that makes a fresh sampler over its own item (`for subset in dsets:
DistributedSampler(subset)`), a fresh sampler each epoch over data the same loop rebuilt with
`shuffle=True`, a batch loop that only computes under no_grad and never steps (features for a
linear probe: the order changes nothing), and a `__main__` script that calls nothing that could
form a process group (its DistributedSampler raises before the first epoch). Also reported:
a loader re-iterated endlessly (`dl_iter = cycle(dataloader)`, then `next(dl_iter)` per step)
where nothing in the files linted with it calls set_epoch at all, and an epoch loop over a loader
a project function of any file returns, built with a shuffling DistributedSampler
(`dataset = data_loader.load_data()`; bound in each arm from such a function, or unpacked onto
`self` from the tuple a method returns, the method the call resolves to), or over a parameter
that a call in another file fills with such a loader (`train(model, train_loader=loader)`),
on the same condition. A sampler named for
evaluation (`val_`, `test_`, `eval_`, `dev_`) is left alone: the order of evaluation does not
change a metric. Pitfall in [pitfalls.md](pitfalls.md). Fix: `sampler.set_epoch(epoch)` first
in each epoch.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ..analysis.context import (
    EVAL_HINTS,
    CallRec,
    Func,
    Loop,
    LoopRec,
    ModuleInfo,
    dotted,
    is_true,
    kwarg,
)
from ..analysis.crossfile import EXTERNAL, imported_function
from ..analysis.group_setup import never_forms_a_group
from ..analysis.loop_samplers import loop_samplers
from ..analysis.project_loaders import built_by_helper, handed_in, set_epoch_anywhere
from ..registry import Hit, rule


def _set_epoch_recs(info: ModuleInfo, sampler: ast.Call) -> list[CallRec]:
    key = ("set_epoch_recs", id(sampler))
    hit = info._memo.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    index = info._memo.get(("set_epoch_index", 0))
    if index is None:
        index = info._memo[("set_epoch_index", 0)] = [
            (rec, {id(s) for s in info.samplers_of(rec.node.func.value)})
            for rec in info.calls
            if rec.last == "set_epoch" and isinstance(rec.node.func, ast.Attribute)]
    # An unresolved receiver (a parameter, a helper's result) gets the benefit of the doubt.
    out = [rec for rec, found in index  # type: ignore[attr-defined]
           if not found or id(sampler) in found]
    info._memo[key] = out
    return out


def _reaches_cached(info: ModuleInfo, loop: Loop, targets: list[CallRec]) -> bool:
    """`_reaches`, once per loop and target set: class-heavy modules resolve
    `self.loader` to every class's sampler, all sharing one list of set_epoch calls."""
    key = ("reaches", id(loop), *map(id, targets))
    hit = info._memo.get(key)
    if hit is None:
        hit = info._memo[key] = _reaches(info, loop, targets)
    return hit  # type: ignore[return-value]


def _reaches(info: ModuleInfo, loop: Loop, targets: list[CallRec], depth: int = 2) -> bool:
    """True when one of `targets` runs inside `loop`, directly or through local calls."""
    funcs = {t.func for t in targets}
    if any(loop in t.loops for t in targets):
        return True
    if depth == 0:
        return False
    for rec in info.calls:
        if loop in rec.loops:
            for fn in info.local_callees(rec):
                if fn in funcs or _func_reaches(info, fn, targets, depth - 1):
                    return True
    return False


def _func_reaches(info: ModuleInfo, fn: Func, targets: list[CallRec], depth: int) -> bool:
    if any(t.func is fn for t in targets):
        return True
    if depth == 0:
        return False
    return any(rec.func is fn and any(_func_reaches(info, g, targets, depth - 1)
                                      for g in info.local_callees(rec)) for rec in info.calls)


@rule('DDP001', 'missing-set-epoch', 'error',
      'DistributedSampler drives an epoch loop but set_epoch is not called in it',
      'call sampler.set_epoch(epoch) at the top of every epoch')
def ddp001(info: ModuleInfo) -> Iterator[Hit]:
    """Every epoch repeats the first epoch's order. On by default again since issue 35's
    fourteenth round: since its false shapes were fixed (round 12), its first findings on
    unseen code were 5 of 5 true (docs/dev/lint_standings.md)."""
    hits = [*_ddp001(info), *_cycled(info)]
    if not hits:
        hits = list(_helper_built(info))
    if hits and not never_forms_a_group(info):
        yield from hits
    elif not hits:
        # Style 6: the loader handed in by another file, which forms the group (this one
        # may be a module with a `__main__` of its own that forms none).
        for lrec, message, caller in handed_in(info, _shuffles, _evaluation):
            if not _extracts_only(info, lrec) and not never_forms_a_group(caller):
                yield lrec.loops[-1], "DDP001", message


def _ddp001(info: ModuleInfo) -> Iterator[Hit]:
    reported: set[int] = set()
    misses: dict[tuple[int, int], bool] = {}

    def missing(loop: Loop, sampler: ast.Call) -> bool:
        key = (id(loop), id(sampler))
        hit = misses.get(key)
        if hit is None:
            targets = _set_epoch_recs(info, sampler)
            hit = misses[key] = not _reaches_cached(info, loop, targets) \
                and not _reseeded_in(loop, sampler) and not _per_dataset(loop, sampler) \
                and not _called_elsewhere(info, loop, targets)
        return hit

    # Style 1: `for epoch ...: for batch in loader:` in one function.
    shuffled: dict[int, tuple[list[ast.Call], list[ast.Call]]] = {}  # by id of samplers_of's
    for lrec in info.loops:
        node = lrec.node
        if isinstance(node, ast.While) or not lrec.loops:
            continue
        epoch_loop = lrec.loops[-1]
        found = loop_samplers(info, lrec)
        hit = shuffled.get(id(found))
        if hit is None:
            hit = shuffled[id(found)] = (found, _shuffling(found, info))
        for sampler in hit[1]:
            if id(epoch_loop) in reported:
                continue
            if missing(epoch_loop, sampler) and not _extracts_only(info, lrec):
                reported.add(id(epoch_loop))
                yield epoch_loop, "DDP001", _msg001(sampler)
    batch_loops: dict[int, bool] = {}
    find = getattr(info.file_set, "find", None)
    # names imported from the project's own modules (`from engine import train_one_epoch`)
    imported = {k for k, q in info.aliases.items() if "." in q
                and q.split(".", 1)[0] not in EXTERNAL} if find is not None else set()
    for rec in info.calls:
        if not rec.loops or id(rec.loops[-1]) in reported:
            continue
        callees = info.local_callees(rec)
        owner = info
        if not callees:
            # `from engine import train_one_epoch` (EEGMAE): the helper of another file
            if rec.callee not in imported or not rec.node.args:
                continue
            foreign = imported_function(info, rec)
            if foreign is None:
                continue
            owner, callees = foreign[0], [foreign[1]]
        epoch_loop = rec.loops[-1]
        batch = batch_loops.get(id(epoch_loop))
        if batch is None:
            batch = batch_loops[id(epoch_loop)] = not isinstance(epoch_loop, ast.While) and \
                bool(info.samplers_of(epoch_loop.iter))
        if batch:
            continue  # a call inside the batch loop (`adjust_lr(loader, step)`), not an epoch
        # Style 3: `for epoch ...: self._run_epoch(epoch)`, the method iterating `self.loader`.
        for sampler in _method_samplers(info, callees) if owner is info else ():
            if missing(epoch_loop, sampler):
                reported.add(id(epoch_loop))
                yield epoch_loop, "DDP001", _msg001(sampler)
                break
        if id(epoch_loop) in reported:
            continue
        # Style 2: `for epoch ...: train_one_epoch(model, train_loader)`.
        passed: list[tuple[int | str, ast.expr]] = [*enumerate(rec.node.args), *(
            (k.arg, k.value) for k in rec.node.keywords if k.arg is not None)]
        for key, arg in passed:
            samplers = [s for s in _shuffling(info.samplers_of(arg), info)
                        if not _made_after(info, s, rec)]
            if not samplers or not _iterates_param(owner, callees, key):
                continue  # the helper only reads `len(loader)`: it runs no epoch
            if any(missing(epoch_loop, s) for s in samplers):
                sampler = next(s for s in samplers if missing(epoch_loop, s))
                reported.add(id(epoch_loop))
                yield epoch_loop, "DDP001", _msg001(sampler)
                break


def _made_after(info: ModuleInfo, sampler: ast.Call, rec: CallRec) -> bool:
    """The sampler is made later in the function that makes the call: another arm's loader
    of the same name (TNN-MO's distributed arm below its single-process epoch loop)."""
    made = info.call_rec(sampler)
    return made is not None and made.func is rec.func and sampler.lineno > rec.node.lineno


def _cycled(info: ModuleInfo) -> Iterator[Hit]:
    """Style 4: `dl_iter = cycle(dataloader)` then `next(dl_iter)` in a step loop. An endless
    re-iteration of the loader (a project's `cycle`, `itertools.cycle`, an `infinite_loader`)
    goes over the sampler again and again at its epoch 0 when nothing anywhere in the program
    calls set_epoch (itertools.cycle replays its first pass, with the same effect)."""
    names = [n for n in info.call_lasts() if _endless(n)]  # each distinct name once
    recs = [r for r in info.calls_named(*names) if r.node.args] if names else []
    if not recs:
        return
    if set_epoch_anywhere(info):
        return
    for rec in recs:
        samplers = _shuffling(info.samplers_of(rec.node.args[0]), info)
        if samplers:
            yield rec.node, "DDP001", (
                f"the DistributedSampler created on line {samplers[0].lineno} is re-iterated "
                f"endlessly by `{ast.unparse(rec.node.func)}` but set_epoch is never called: "
                "every pass repeats the same order")


def _helper_built(info: ModuleInfo) -> Iterator[Hit]:
    """Style 5: `train_dat = prepare_data(x, y)`, a project function (of any file linted with
    this one) that returns a DataLoader it builds with a shuffling DistributedSampler, iterated
    in an epoch loop, where nothing in the program calls set_epoch at all
    (analysis/project_loaders.py)."""
    for lrec, message in built_by_helper(info, _shuffles, _evaluation):
        if not _extracts_only(info, lrec):
            yield lrec.loops[-1], "DDP001", message


def _endless(last: str) -> bool:
    low = last.lower()
    return low in ("cycle", "repeat_loader") or any(
        w in low for w in ("infinite", "endless", "forever"))


def _reseeded_in(loop: Loop, sampler: ast.Call) -> bool:
    """A sampler made afresh inside the epoch loop with a seed that is not a constant
    (`DistributedSampler(ds, seed=epoch)`): each epoch has its own order without set_epoch. (A
    fresh sampler with the default seed repeats the order: that stays a finding.)"""
    if not loop.lineno <= sampler.lineno <= (loop.end_lineno or loop.lineno):
        return False
    seed = kwarg(sampler, "seed")
    if seed is not None and not isinstance(seed, ast.Constant):
        return True
    # The data itself is rebuilt shuffled in this loop (`ds = build(stage, shuffle=True)`,
    # then `DistributedSampler(ds)`: coconut's "the sampler is deterministic, so we shuffle
    # the dataset when it's constructed, at every epoch"): each epoch has its own order.
    data = sampler.args[0] if sampler.args else kwarg(sampler, "dataset")
    if not isinstance(data, ast.Name):
        return False
    return any(isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
               and any(isinstance(t, ast.Name) and t.id == data.id for t in n.targets)
               and n.lineno < sampler.lineno and is_true(kwarg(n.value, "shuffle"))
               for n in ast.walk(loop))


_NO_GRAD = ("no_grad", "inference_mode")


def _extracts_only(info: ModuleInfo, lrec: LoopRec) -> bool:
    """The batch loop computes under no_grad and never steps (Siamese-Image-Modeling's
    `make_embeddings`, features for a linear probe): the order of its samples changes
    nothing, whatever the epochs."""
    loop = lrec.node
    stepping: set[int] | None = info._memo.get(("stepping_loops", 0))  # type: ignore[assignment]
    if stepping is None:
        stepping = info._memo[("stepping_loops", 0)] = {
            id(x) for r in info.calls if r.last in ("backward", "step") for x in r.loops}
    if id(loop) in stepping:
        return False
    fn = lrec.func
    if fn is not None and any(_no_grad_call(d) for d in fn.decorator_list):
        return True
    return any(isinstance(n, ast.With) and any(_no_grad_call(i.context_expr) for i in n.items)
               for n in ast.walk(loop))


def _no_grad_call(node: ast.expr) -> bool:
    f = node.func if isinstance(node, ast.Call) else node
    return (dotted(f) or "").rsplit(".", 1)[-1] in _NO_GRAD


def _per_dataset(loop: Loop, sampler: ast.Call) -> bool:
    """The loop walks datasets, not epochs: a fresh sampler per iteration over the loop's own
    item (`for subset in dsets: DataLoader(subset, sampler=DistributedSampler(subset))`, the
    validation of each file's dataset in multiple_physics_pretraining)."""
    if isinstance(loop, ast.While) or not \
            loop.lineno <= sampler.lineno <= (loop.end_lineno or loop.lineno):
        return False
    data = sampler.args[0] if sampler.args else kwarg(sampler, "dataset")
    return isinstance(data, ast.Name) and any(
        isinstance(n, ast.Name) and n.id == data.id for n in ast.walk(loop.target))


def _called_elsewhere(info: ModuleInfo, loop: Loop, targets: list[CallRec]) -> bool:
    """The loop calls, on another object, a method by the name of the function that holds a
    set_epoch (`for hook in self.hooks: hook.before_epoch(epoch)`, the hook's `before_epoch`
    calling `self.trainer.loader.sampler.set_epoch(epoch)`): the local call graph cannot
    follow that call, so it gets the benefit of the doubt."""
    names = {t.func.name for t in targets if t.func is not None}
    return bool(names) and any(rec.last in names and loop in rec.loops for rec in info.calls)


def _method_samplers(info: ModuleInfo, fns: list[Func]) -> list[ast.Call]:
    """Shuffling samplers behind the loaders that `fns` iterate by themselves (`for b in
    self.loader`), not through a parameter (style 2 handles those)."""
    out: list[ast.Call] = []
    hit = info._memo.get(("loops_by_func", 0))
    by_func: dict[int, list[LoopRec]]
    if hit is None:
        by_func = {}
        for lrec in info.loops:
            if lrec.func is not None and not isinstance(lrec.node, ast.While):
                by_func.setdefault(id(lrec.func), []).append(lrec)
        info._memo[("loops_by_func", 0)] = by_func
    else:
        by_func = hit  # type: ignore[assignment]
    for fn in fns:
        params = {a.arg for a in fn.args.args} - {"self", "cls"}
        for lrec in by_func.get(id(fn), ()):
            node = lrec.node
            assert isinstance(node, ast.For | ast.AsyncFor)
            names = {n.id for n in ast.walk(node.iter) if isinstance(n, ast.Name)}
            if names & params:
                continue
            out.extend(_shuffling(loop_samplers(info, lrec), info))
    return out


def _iterates_param(info: ModuleInfo, fns: list[Func], key: int | str) -> bool:
    """Some `fn` loops over the parameter at position (or named) `key` (`for b in loader`)."""
    for fn in fns:
        params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
        if params and params[0] in ("self", "cls"):
            params = params[1:]
        if isinstance(key, int) and key >= len(params):
            continue
        name = params[key] if isinstance(key, int) else key
        if name in _loop_names(info, fn):
            return True
    return False


def _loop_names(info: ModuleInfo, fn: Func) -> set[str]:
    """Names in the iterables of `fn`'s for-loops (from the walker's loop records)."""
    key = ("loop_names", id(fn))
    hit = info._memo.get(key)
    if hit is None:
        hit = info._memo[key] = {n.id for lrec in info.loops if lrec.func is fn
                                 and not isinstance(lrec.node, ast.While)
                                 for n in ast.walk(lrec.node.iter) if isinstance(n, ast.Name)}
    return hit  # type: ignore[return-value]


_EVAL = EVAL_HINTS
# `dev_sampler`, `devset`, `sampler_dev`: a development (validation) set, not `device`
_DEV = re.compile(r"(?:^|[_.])dev(?:[_.]|set|data|$)")


def _evaluation(name: str) -> bool:
    name = name.lower()
    return any(h in name for h in _EVAL) or _DEV.search(name) is not None


def _shuffling(samplers: list[ast.Call], info: ModuleInfo | None = None) -> list[ast.Call]:
    """set_epoch only reseeds the shuffle: a `shuffle=False` sampler has the same order every
    epoch whatever you call, and so may a validation sampler (`DistributedSampler(val_data)`):
    the order of evaluation does not change a metric."""
    memo: dict[int, bool] = info._memo.setdefault(("shuffles", 0), {}) \
        if info is not None else {}  # type: ignore[assignment]
    out = []
    for s in samplers:
        hit = memo.get(id(s))
        if hit is None:
            hit = memo[id(s)] = _shuffles(s, info)
        if hit:
            out.append(s)
    return out


def _shuffles(s: ast.Call, info: ModuleInfo | None = None) -> bool:
    sh = kwarg(s, "shuffle")
    if isinstance(sh, ast.Constant) and sh.value is False:
        return False
    if info is not None and (_advances_itself(info, info.callee_last(s)) or any(
            _evaluation(name) for name in _names_of(info, s))):
        # `eval_sampler = DistributedSampler(dataset)`: the order of evaluation does not
        # change a metric
        return False
    data = s.args[0] if s.args else kwarg(s, "dataset")
    name = (dotted(data) or "") if data is not None else ""
    return not _evaluation(name)


def _names_of(info: ModuleInfo, value: ast.expr) -> list[str]:
    """The names a value was assigned to (`eval_sampler = DistributedSampler(...)`), also as
    an arm of a conditional expression."""
    index: dict[int, list[str]] | None = info._memo.get(("names_of", 0))  # type: ignore
    if index is None:
        index = {}
        for name, entries in info.assigns.items():
            for _, v in entries:
                for part in (v.body, v.orelse) if isinstance(v, ast.IfExp) else (v,):
                    index.setdefault(id(part), []).append(name)
        info._memo[("names_of", 0)] = index
    return index.get(id(value), [])


def _advances_itself(info: ModuleInfo, name: str) -> bool:
    """A sampler class of this file that moves its own epoch on outside set_epoch
    (`self.epoch += 1` in `__iter__`): each pass shuffles anew without a call."""
    cls = info.classes.get(name)
    if cls is None:
        return False
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name != "set_epoch":
            for n in ast.walk(fn):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target] \
                    if isinstance(n, ast.AugAssign) else []
                if any(dotted(t) == "self.epoch" for t in targets) and fn.name != "__init__":
                    return True
    return False


def _msg001(sampler: ast.Call) -> str:
    return (f"the DistributedSampler created on line {sampler.lineno} drives this epoch loop "
            "but set_epoch is never called in it: every epoch repeats the same order")


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=32, sampler=sampler)
for epoch in range(epochs):
    for batch in loader:  # every epoch sees the first epoch's order
        train_step(batch)
"""

RULE = ddp001
