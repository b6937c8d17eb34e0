"""A rank that ends itself with status 0 inside an evaluation called between training epochs
(corpus35g B190's shape):

    def validate(loader, model):
        with torch.no_grad():
            for x, y in loader:              # this rank's shard (a DistributedSampler)
                loss = crit(model(x), y)
                if loss.isnan():
                    quit()                   # status 0: no launcher ends the others

    for epoch in range(epochs):
        train_epoch(...)                     # DDP's backward: an all-reduce per step
        validate(val_loader, model)

The evaluation loop syncs nothing, but its caller's loop does: the rank that met the
non-finite loss on its own shard is gone, and the others wait for it in the next epoch's
all-reduce. Read only where the evaluation is called (in any file of the project) from a loop
whose other calls reach a backward or a collective, not under a rank test, and its data is
sharded (local_metric's reading: the loader built in its file with a DistributedSampler, or,
assumed and said, the program's validation loader built with one)."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

from .callgraph import resolve
from .collective_reach import reaches_collective
from .context import CallRec, Func, Loop, ModuleInfo
from .nonfinite import local_nonfinite
from .rank_failures import clean_exit
from .sharded_loaders import built_loaders, dist_loader, loop_source, sharded


def between_training(info: ModuleInfo, fn: Func, syncs: frozenset[str]
                     ) -> tuple[ModuleInfo, CallRec, CallRec, str] | None:
    """A call of `fn` in a loop (in any file of the project) whose other calls reach a
    backward or a collective: (its file, the call, the sync, what was assumed of the data);
    None where there is none, the call is under a rank test, or the data is not sharded."""
    infos: list[ModuleInfo] = list(getattr(info.file_set, "infos", None) or [info])
    for m in infos:
        if fn.name not in m.call_lasts():
            continue
        for rec in m.calls_named(fn.name):
            if not rec.loops or m.effective_guard(rec) or not _runs(m, rec, info, fn):
                continue
            assumed = _data_at(m, rec, info, fn)
            if assumed is None:
                continue
            loop = rec.loops[-1]
            sync = next((r for r in m.calls if loop in r.loops and r is not rec
                         and reaches_collective(m, r, syncs)), None)
            if sync is not None:
                return m, rec, sync, assumed
    return None


def _data_at(m: ModuleInfo, rec: CallRec, info: ModuleInfo, fn: Func) -> str | None:
    """Whether the data `fn` loops over is sharded, at this call: where its loop reads a
    parameter and the call passes a loader its file builds, that loader's sampler decides
    ("" sharded, None not: `validate(val_loader)` with a plain DataLoader gives every rank
    the whole set and the same loss); else local_metric's reading."""
    params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
    offset = 1 if params[:1] in (["self"], ["cls"]) and isinstance(rec.node.func,
                                                                   ast.Attribute) else 0
    for lp in (n for n in ast.walk(fn) if isinstance(n, ast.For)):
        it = loop_source(lp.iter)
        if not isinstance(it, ast.Name) or it.id not in params:
            continue
        k = params.index(it.id) - offset
        arg = next((kw.value for kw in rec.node.keywords if kw.arg == it.id), None) or (
            rec.node.args[k] if 0 <= k < len(rec.node.args) else None)
        built = built_loaders(m, arg) if arg is not None else []
        if built:
            return "" if all(dist_loader(m, v) for v in built) else None
    return sharded(info, fn)


def _runs(m: ModuleInfo, rec: CallRec, info: ModuleInfo, fn: Func) -> bool:
    """`rec` calls `fn` itself: this file's function by its name, or the one another file's
    call resolves to."""
    if m is info:
        return fn in m.local_callees(rec)
    got = resolve(m, rec)
    return got is not None and got[0] is info and got[1] is fn


def evaluation_exits(info: ModuleInfo, loop: Loop, fn: Func, skips: list[ast.If],
                     syncs: frozenset[str]) -> Iterator[tuple[ast.If, str]]:
    """The `if`s of `skips` (in `fn`'s evaluation loop, which syncs nothing) that end the
    rank with status 0 on its own non-finite loss, where `fn` runs between training steps."""
    for s in skips:
        end = next((b.value for b in s.body if isinstance(b, ast.Expr)
                    and clean_exit(info, b.value)), None)
        loss = local_nonfinite(info, loop, s) if end is not None else None
        hit = between_training(info, fn, syncs) if loss is not None and end is not None \
            else None
        if hit is None or end is None:
            continue
        m, rec, sync, assumed = hit
        yield s, (
            f"a rank whose own `{loss}` is not finite ends with `{ast.unparse(end)}` "
            f"(status 0: no launcher ends the others) in {fn.name}(), which the loop at "
            f"{_where(info, m, rec.node.lineno)} calls between its training steps: the "
            "loss is this rank's alone (its own shard of the data), and the others go on "
            f"to `{ast.unparse(sync.node.func)}` at {_where(info, m, sync.node.lineno)} in "
            f"that loop, whose all-reduce then waits for it forever{assumed}; all_reduce the "
            "flag first so that every rank decides alike, or raise")


def _where(info: ModuleInfo, m: ModuleInfo, line: int) -> str:
    return f"line {line}" if m is info else f"{os.path.basename(m.path)}:{line}"
