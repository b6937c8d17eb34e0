"""Which loaders read this rank's shard: a DataLoader built with a DistributedSampler, as
a file builds it or a project helper returns it (alone or in a tuple), and what a function's
evaluation loop reads when the loader comes from elsewhere (assumed: the program's sharded
validation loader)."""

from __future__ import annotations

import ast
import os

from .context import EVAL_HINTS, Func, ModuleInfo, loader_samplers
from .enclosing import single_process_arm


def sharded(m: ModuleInfo, fn: Func) -> str | None:
    """The data `fn` loops over is sharded across the ranks: "" where the loader its loop
    reads is built in the file with a DistributedSampler; where it comes from elsewhere (a
    parameter, an attribute a constructor keeps), what was assumed: that it is the program's
    validation loader built with one (None when the program builds none)."""
    loops = [n for n in ast.walk(fn) if isinstance(n, ast.For)]
    for lp in loops:
        built = [v for v in built_loaders(m, loop_source(lp.iter))
                 if not single_process_arm(m, v)]
        if built:
            return "" if all(dist_loader(m, v) for v in built) else None
    infos: list[ModuleInfo] = getattr(m.file_set, "infos", None) or [m]
    key = ("sharded_validation", 0)
    hit = infos[0]._memo.get(key)
    if hit is None:
        hit = infos[0]._memo[key] = _program_loader(infos)
    return f" (assumed: the data {fn.name}() reads{hit}" if hit else None


def _program_loader(infos: list[ModuleInfo]) -> str:
    """The first validation loader the program builds with a DistributedSampler, as the
    message names it ("" for none); asked once per program."""
    for i in infos:
        for name, vals in [*i.assigns.items(), *_unpacked(i)]:
            if any(h in name.rsplit(".", 1)[-1].lower() for h in EVAL_HINTS):
                for _, v in vals:
                    if isinstance(v, ast.Call) and (
                            i.callee_last(v) == "DataLoader" and dist_loader(i, v)
                            or _helper_builds_dist_loader(infos, i.callee_last(v))):
                        return (f" is the validation loader `{name}` built with a "
                                f"DistributedSampler at {os.path.basename(i.path)}:{v.lineno})")
    return ""


def _unpacked(i: ModuleInfo) -> list[tuple[str, list[tuple[int, ast.expr]]]]:
    """Names unpacked from a call (`vali_data, vali_loader = self._get_data(flag='val')`),
    with that call: the walk's table keeps plain assignments only."""
    return [(e.id, [(a.lineno, a.value)]) for a in ast.walk(i.tree)
            if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
            for t in a.targets if isinstance(t, ast.Tuple) for e in t.elts
            if isinstance(e, ast.Name)]


def _helper_builds_dist_loader(infos: list[ModuleInfo], name: str) -> bool:
    return bool(returned_samplers(infos, name))


def returned_samplers(infos: list[ModuleInfo], name: str, depth: int = 0,
                      only: Func | None = None) -> list[tuple[ModuleInfo, ast.Call]]:
    """The DistributedSamplers (with their modules) of the DataLoaders a function of the
    program named `name` builds and returns (`valid_dat = prepare_data(x, y)`, the helper's
    loader named anything), alone or in a tuple (`return data_set, data_loader`), or that it
    returns from another such function (`self._get_data(flag)` returning
    `data_provider(args, flag)`)."""
    if name == "DataLoader" or depth > 2:
        return []
    out: list[tuple[ModuleInfo, ast.Call]] = []
    for m in infos:
        for fn in m.funcs.get(name, []):
            if only is not None and fn is not only:
                continue  # the one the call resolves to (the override, not the base stub)
            for n in ast.walk(fn):
                if not isinstance(n, ast.Return) or n.value is None:
                    continue
                parts = n.value.elts if isinstance(n.value, ast.Tuple) else [n.value]
                for part in parts:
                    # names bound in the function itself first (a module of several loader
                    # helpers binds `sampler` in each)
                    loaders = [v for v in _local(fn, part) if isinstance(v, ast.Call)
                               and m.callee_last(v) == "DataLoader"] or built_loaders(m, part)
                    out += [(m, v) for loader in loaders for s in loader_samplers(loader)
                            for v in (_local(fn, s) or m.values_of(s) or [s])
                            if isinstance(v, ast.Call) and m.is_dist_sampler(v)]
                    call = part if isinstance(part, ast.Call) else _unpacked_from(fn, part)
                    if call is not None and m.callee_last(call) != name:
                        out += returned_samplers(infos, m.callee_last(call), depth + 1)
    return out


def _local(fn: Func, node: ast.expr) -> list[ast.expr]:
    """What a plain name is assigned in `fn` (the value itself for anything else)."""
    if not isinstance(node, ast.Name):
        return [node] if isinstance(node, ast.Call) else []
    out: list[ast.expr] = []
    todo = [a.value for a in ast.walk(fn) if isinstance(a, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == node.id for t in a.targets)]
    while todo:
        v = todo.pop(0)
        if isinstance(v, ast.IfExp):  # `DistributedSampler(d) if training else ...`
            todo[:0] = [v.body, v.orelse]
        else:
            out.append(v)
    return out


def _unpacked_from(fn: Func, node: ast.expr) -> ast.Call | None:
    """The call a name of `fn` was unpacked from (`data_set, data_loader = data_provider(args,
    flag)`), when that is its one binding there."""
    if not isinstance(node, ast.Name):
        return None
    found = [a.value for a in ast.walk(fn) if isinstance(a, ast.Assign)
             and any(isinstance(t, ast.Tuple | ast.List) and any(
                 isinstance(e, ast.Name) and e.id == node.id for e in t.elts) for t in a.targets)]
    return found[0] if len(found) == 1 and isinstance(found[0], ast.Call) else None


def loop_source(it: ast.expr) -> ast.expr:
    """What a `for` iterates, under `enumerate(...)`, `tqdm(...)` and `iter(...)`."""
    while isinstance(it, ast.Call) and it.args and isinstance(it.func, ast.Name) \
            and it.func.id in ("enumerate", "tqdm", "iter"):
        it = it.args[0]
    return it


def built_loaders(m: ModuleInfo, node: ast.expr) -> list[ast.Call]:
    """The `DataLoader(...)` calls `node` may hold, as this file builds them."""
    return [v for v in m.values_of(node) if isinstance(v, ast.Call)
            and m.callee_last(v) == "DataLoader"]


def dist_loader(m: ModuleInfo, loader: ast.Call) -> bool:
    return any(m.is_dist_sampler(v) for s in loader_samplers(loader)
               for v in (m.values_of(s) or [s]))
