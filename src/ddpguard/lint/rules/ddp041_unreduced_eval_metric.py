"""DDP041 an evaluation over a DistributedSampler shard whose metric is never combined.

```python
val_loader = DataLoader(val_set, batch_size=64, sampler=DistributedSampler(val_set))
acc = validate(model, val_loader)   # sums correct/total over this rank's share only
if rank == 0:
    print(f"val acc {acc:.3f}")     # rank 0's 1/world_size of the set, logged as the whole
```

The sampler gives each rank 1/world_size of the evaluation set. A metric summed over the loop
is then this rank's share: what rank 0 logs, compares against the best so far or stops on is
measured on a fraction of the set (with the sampler's padding repeats), and each rank holds a
different number. Reported at the loop when the loop reads an evaluation loader (a name with
`val`/`test`/`eval`, or a loop in an evaluation function: `no_grad` and no backward) that a
DistributedSampler feeds, accumulates into a name (`+=`, `.update(...)`, `.append(...)`) and
its function returns a value or prints or logs one; and nothing combines the ranks' results:
no collective reached from the function or from a function that calls it (through the
project's own helpers too), no call whose name says it reduces, gathers or synchronises
(`reduce_tensor`, `synchronize_between_processes`, `all_gather_object`), no torchmetrics or
Accelerate (which gather inside), and no per-rank file written from the loop's function
(prediction files merged afterwards: a write whose path names the rank). Not a loop that may
`break` (a sample of the set for a plot, not the set's metric), except in a debug run. Fix:
all_reduce the sums and the counts (or all_gather the predictions) before computing the
metric.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

from ..analysis.callgraph import calls_by_func
from ..analysis.collective_reach import reaches_collective
from ..analysis.context import (
    EVAL_HINTS,
    CallRec,
    Func,
    LoopRec,
    ModuleInfo,
    is_collective,
    wraps_iterable,
)
from ..analysis.enclosing import block_statements
from ..analysis.loop_samplers import loop_samplers
from ..analysis.provenance import dotted
from ..registry import Hit, rule

_COMBINES = ("reduce", "gather", "sync", "all_to_all", "broadcast")
_GATHERING_PACKAGES = ("torchmetrics", "accelerate", "ignite", "lightning", "mmengine",
                       "mmcv", "detectron2")
_WRITES = {"open", "dump", "save", "savetxt", "to_csv", "write", "imwrite", "savemat",
           "save_image", "to_json"}
_BARRIERS = frozenset({"barrier", "monitored_barrier", "Barrier"})
_REPORTS = {"print", "info", "log", "add_scalar", "add_scalars", "write"}
_ACCUMULATES = {"update", "append", "extend", "add_"}


@rule('DDP041', 'unreduced-eval-metric', 'warning',
      'an evaluation loop over a DistributedSampler shard whose metric no rank combines with '
      'the others: the value logged is one rank\'s share of the set',
      'all_reduce the sums and the counts (or all_gather the predictions) before computing '
      'the metric')
def ddp041(info: ModuleInfo) -> Iterator[Hit]:
    # A module the group's own set-up imports runs in the group too (motion_forecasting's
    # train.py holds the `val()` that train_ddp.py calls).
    if not (info.distributed or info.file_set is not None
            and info.file_set.in_group(info)) or any(  # type: ignore[attr-defined]
                q.split(".", 1)[0] in _GATHERING_PACKAGES for q in info.aliases.values()):
        return
    trains = {id(loop) for r in info.calls_named("backward", "step") for loop in r.loops
              if isinstance(r.node.func, ast.Attribute)}
    for lrec in info.loops:
        fn = lrec.func
        if fn is None or not isinstance(lrec.node, ast.For) or id(lrec.node) in trains \
                or not _evaluation_loop(info, lrec, fn):
            continue
        samplers = [s for s in loop_samplers(info, lrec) if info.is_dist_sampler(s)]
        # what the callers hand in says more than the line (and is the only answer across files)
        where = _handed_in(info, fn, lrec.node.iter) or (
            f"line {samplers[0].lineno}" if samplers else "")
        if not where or not _reports(info, fn) or not _accumulates(info, lrec.node) \
                or _breaks(lrec.node) or _combined(info, fn):
            continue
        loader = ast.unparse(lrec.node.iter)
        yield lrec.node, "DDP041", (
            f"the loop over `{loader}` at line {lrec.node.lineno} evaluates this rank's share "
            f"of the set (DistributedSampler, {where}), and nothing in {fn.name}() or "
            f"in what calls it all-reduces or gathers the results: the metric it reports is "
            f"one rank's 1/world_size of the set (padding repeats included), not the whole "
            f"set's; all_reduce the sums and counts (or all_gather the predictions) first")


def _evaluation_loop(info: ModuleInfo, lrec: LoopRec, fn: Func) -> bool:
    """The loop reads an evaluation loader by name, or runs in an evaluation function (under
    `no_grad` or after `.eval()`) that never calls `backward`."""
    iterable = lrec.node.iter if isinstance(lrec.node, ast.For) else None
    names = [(dotted(n) or "").rsplit(".", 1)[-1].lower()
             for n in ast.walk(iterable) if isinstance(n, ast.Name | ast.Attribute)] \
        if iterable is not None else []
    if any("train" in n for n in names):
        return False
    if any(any(h in n for h in EVAL_HINTS) for n in names):
        return True
    calls = calls_by_func(info).get(id(fn), ())
    if any(r.last in ("backward", "step") for r in calls):
        return False
    evaluating = any(r.last in ("no_grad", "inference_mode", "eval") for r in calls) or any(
        (dotted(d.func if isinstance(d, ast.Call) else d) or "").endswith(
            ("no_grad", "inference_mode")) for d in fn.decorator_list)
    return evaluating and any(h in fn.name.lower() for h in (*EVAL_HINTS, "valid"))


def _handed_in(info: ModuleInfo, fn: Func, iterable: ast.expr) -> str:
    """The distributed samplers behind the loader a caller hands in: the loop reads a
    parameter of `fn` (through `enumerate`, a progress bar, a local name), and a call of `fn`
    in the project passes a loader that a DistributedSampler feeds (motion_forecasting's
    `val(cfg, val_loader, ...)` in train_ddp.py, `val` in train.py): where, as the message
    names it; "" for none."""
    node: ast.expr | None = iterable
    for _ in range(4):
        while isinstance(node, ast.Call) and wraps_iterable(info.callee_last(node)) \
                and node.args:
            node = node.args[0]
        if not isinstance(node, ast.Name):
            return ""
        local = [v for line, v in info.assigns.get(node.id, [])
                 if fn.lineno <= line <= (fn.end_lineno or fn.lineno)]
        if not local:
            break
        node = local[-1]
    params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
    if not isinstance(node, ast.Name) or node.id not in params:
        return ""
    index = params.index(node.id)
    if params and params[0] in ("self", "cls"):
        index -= 1
    infos: list[ModuleInfo] = getattr(info.file_set, "infos", None) or [info]
    for m in infos:
        for rec in _calls_of(m, info, fn):
            arg = next((k.value for k in rec.node.keywords if k.arg == node.id), None)
            if arg is None and 0 <= index < len(rec.node.args):
                arg = rec.node.args[index]
            if arg is None or isinstance(arg, ast.Starred):
                continue
            found = [s for s in m.samplers_of(arg) if m.is_dist_sampler(s)]
            if found:
                file = os.path.basename(m.path)
                return (f"{file}:{found[0].lineno}, handed in as `{node.id}` by the call at "
                        f"{file}:{rec.node.lineno}")
    return ""


def _breaks(loop: ast.For) -> bool:
    """A `break` of this loop (not of one inside it): a sample of the set (the first
    `max_samples` for a plot, a Jacobian on 100 inputs), not the metric of the whole set."""
    # Statements only: a `break` is one, and expressions are most of a loop's nodes.
    stack: list[ast.stmt] = list(loop.body)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Break):
            return True
        if isinstance(n, ast.If):
            # `if args.debug and i > 20: break` is no real run's
            stack.extend(n.orelse if _debug(n.test) else [*n.body, *n.orelse])
        elif isinstance(n, ast.With | ast.AsyncWith):
            stack.extend(n.body)
        elif isinstance(n, ast.Try):
            stack.extend([*n.body, *n.orelse, *n.finalbody,
                          *(st for h in n.handlers for st in h.body)])
    return False


def _debug(test: ast.expr) -> bool:
    return any("debug" in (dotted(n) or "").lower() for n in ast.walk(test)
               if isinstance(n, ast.Name | ast.Attribute))


def _calls_of(m: ModuleInfo, info: ModuleInfo, fn: Func) -> list[CallRec]:
    """The calls of `fn` in `m`: in its own file, or in a file that imports it by name and
    defines no function of that name itself (main_rna_pdb.py's `validation` is its own, not
    main_rna_pdb_single.py's)."""
    if m is not info and (fn.name in m.funcs or not any(
            v.endswith("." + fn.name) for v in m.aliases.values())):
        return []
    return m.calls_named(fn.name)


def _accumulates(info: ModuleInfo, loop: ast.For) -> bool:
    """Something computed from the batch is summed or collected; not a count of batches
    (`n += 1`: the sampler gives every rank the same number)."""
    if any(loop in r.loops and isinstance(r.node.func, ast.Attribute)
           and not all(isinstance(a, ast.Constant) for a in r.node.args)
           for r in info.calls_named(*_ACCUMULATES)):
        return True
    return any(isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add)
               and not isinstance(n.value, ast.Constant) for n in block_statements(loop.body))


def _reports(info: ModuleInfo, fn: Func) -> bool:
    if any(r.last in _REPORTS for r in calls_by_func(info).get(id(fn), ())):
        return True
    return any(isinstance(n, ast.Return) and n.value is not None for n in block_statements(fn.body))


def _combined(info: ModuleInfo, fn: Func) -> bool:
    """Something combines the ranks' results: in `fn`, or in a function of the project that
    calls it (its caller all-reduces what it returns); or `fn` writes files (per-rank
    predictions merged afterwards). Once per function (several loops may evaluate in it)."""
    memo: dict[int, bool] = info._memo.setdefault(("ddp041_combined", 0), {})  # type: ignore[assignment]
    hit = memo.get(id(fn))
    if hit is None:
        hit = memo[id(fn)] = _combined_now(info, fn)
    return hit


def _combined_now(info: ModuleInfo, fn: Func) -> bool:
    if _combines_in(info, fn, writes=True):
        return True
    infos: list[ModuleInfo] = getattr(info.file_set, "infos", None) or [info]
    if any(_handed_as_value(m, fn.name) for m in infos):
        return True
    for m in infos:
        calls = _calls_of(m, info, fn)
        if calls and m is not info and any(q.split(".", 1)[0] in _GATHERING_PACKAGES
                                           for q in m.aliases.values()):
            return True
        for rec in calls:
            if m is info and rec.func is fn:
                continue
            # A caller at the module level (a script's body, RocWeather's train_ddp.py)
            # combines with the module's own statements.
            if _combines_in(m, rec.func, writes=False):
                return True
    return False


def _may_reach(info: ModuleInfo, rec: CallRec) -> bool:
    f = rec.node.func
    head = f.id if isinstance(f, ast.Name) else (dotted(f) or ".").split(".")[0]
    return is_collective(rec) or rec.last in info.funcs or head in info.aliases \
        or head in info.assigns or head == "self"


def _handed_as_value(info: ModuleInfo, name: str) -> bool:
    """`name` read as a value, not called (`self.validate_fn = validate_fn or
    self._default_validate`, HagAli22): its callers are not seen, and the one that runs it
    may combine what it returns."""
    key = ("handed_as_value", 0)
    refs = info._memo.get(key)
    if refs is None:
        # What is assigned or handed on (`x = a or self.f`, `run(f)`, `hooks=[f]`): a plain
        # name read elsewhere may be a variable of that name (`val`), not the function.
        values: list[ast.AST] = []
        for n in ast.walk(info.tree):
            if isinstance(n, ast.Assign):
                values.append(n.value)
            elif isinstance(n, ast.Call):
                values += [*n.args, *(k.value for k in n.keywords)]
        refs = info._memo[key] = {
            x.attr if isinstance(x, ast.Attribute) else x.id for v in values
            for x in ([v, *v.values] if isinstance(v, ast.BoolOp) else
                      [v, *v.elts] if isinstance(v, ast.List | ast.Tuple) else [v])
            if isinstance(x, ast.Attribute | ast.Name)}
    return name in refs  # type: ignore[operator]


def _combines_in(info: ModuleInfo, fn: Func | None, writes: bool) -> bool:
    calls: list[CallRec] = list(calls_by_func(info).get(id(fn) if fn is not None else 0, ()))
    # By name first (cheap, and usually the answer: `dist.all_reduce(total)`), then by reach.
    for rec in calls:
        low = rec.last.lower()
        # `synchronize()` (maskrcnn-benchmark's, torch.cuda's) is a barrier: it combines nothing.
        if any(w in low for w in _COMBINES) and low != "synchronize" \
                or writes and rec.last in _WRITES and _per_rank(rec.node):
            return True
    for rec in calls:
        # Only a call that can lead into the project's code (a function of this file, an
        # import, an object built from a class) may reach a collective; a method of a tensor
        # or a model (`loss.item()`, `x.to(device)`) is not looked up.
        if _may_reach(info, rec) and reaches_collective(info, rec) \
                and reaches_collective(info, rec, skip=_BARRIERS):
            return True
    return False


def _per_rank(call: ast.Call) -> bool:
    """A write whose arguments name the rank (`open(f"pred_{rank}.json", "w")`): one file
    per rank, merged afterwards; a checkpoint saved on the best metric is no merge."""
    return any(isinstance(n, ast.Name | ast.Attribute) and "rank" in (dotted(n) or "").lower()
               or isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute | ast.Name)
               and "rank" in (dotted(n.func) or "").lower()
               for a in [*call.args, *(k.value for k in call.keywords)] for n in ast.walk(a))


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

val_loader = DataLoader(val_set, batch_size=64, sampler=DistributedSampler(val_set))

@torch.no_grad()
def validate(model, val_loader):
    correct = total = 0
    for x, y in val_loader:
        correct += (model(x).argmax(1) == y).sum().item()
        total += len(y)
    return correct / total
"""

RULE = ddp041
