"""A method called on an instance of a class another file defines: `trainer.train(...)` where
`trainer = Trainer(model, rank)` and `from utils.trainer import Trainer` (corpus35g T150's
shape). The class's file is found through the import that names it, as a function's is, and
the method is that class's own (not a same-named function or another class's method)."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

from .context import CallRec, Func, ModuleInfo, dotted


def receiver_class(info: ModuleInfo, call: ast.Call) -> tuple[str, str] | None:
    """(the module the import names, the class) for `x.m(...)` where every binding of `x` in
    this file is a call of that one imported class; None otherwise (a local class is
    `instance_methods`' to read)."""
    f = call.func
    if type(f) is not ast.Attribute:
        return None
    owner = dotted(f.value)
    values = info.assigns.get(owner, []) if owner not in (None, "self", "cls") else []
    if not values:
        return None
    quals = {info.qualify(v.func) if type(v) is ast.Call else None for _, v in values}
    if len(quals) != 1:
        return None
    qual = quals.pop()
    roots = info._memo.get(("alias_roots", 0))
    if roots is None:
        roots = info._memo[("alias_roots", 0)] = {v.split(".", 1)[0]
                                                  for v in info.aliases.values()}
    if qual is None or "." not in qual or qual.split(".", 1)[0] not in roots:  # type: ignore
        return None
    module, _, cls = qual.rpartition(".")
    return (module, cls) if cls not in info.classes else None


def method_of(m: ModuleInfo, cls: str, name: str) -> Func | None:
    """The one method `name` of class `cls` defined in `m`."""
    if cls not in m.classes:
        return None
    fns = [fn for fn in m.funcs.get(name, []) if m.func_class.get(fn) == cls]
    return fns[0] if len(fns) == 1 else None


def find_method(info: ModuleInfo, rec: CallRec) -> tuple[ModuleInfo, Func] | None:
    """The method `rec` runs on an instance of another file's class (see the module)."""
    file_set = info.file_set
    got = receiver_class(info, rec.node) if file_set is not None else None
    if got is None:
        return None
    name = rec.node.func.attr  # type: ignore[attr-defined]
    key = ("find_method", got, name)
    if key not in info._memo:
        info._memo[key] = lookup(
            lambda mod, caller: file_set._modules(mod, caller),  # type: ignore
            file_set.infos, info, got[0], got[1], name)  # type: ignore[attr-defined]
    return info._memo[key]  # type: ignore[return-value]


def lookup(modules: Callable[[str, ModuleInfo], list[ModuleInfo]], infos: list[ModuleInfo],
           caller: ModuleInfo, module: str, cls: str, name: str, depth: int = 0
           ) -> tuple[ModuleInfo, Func] | None:
    """Method `name` of class `cls` that the import `module` names, followed through a
    package's re-export (`from .trainer import Trainer` in utils/__init__.py) up to 3 links.
    Where the files given hold the package's folder beside the caller but not its
    `__init__.py` (a partial copy), the one module of that folder that defines the class."""
    hits: list[tuple[ModuleInfo, Func]] = []
    found = modules(module, caller)
    if not found and depth == 0:
        folder = Path(caller.path).parent.joinpath(*module.split("."))
        found = [m for m in infos if Path(m.path).parent == folder]
    for m in found:
        fn = method_of(m, cls, name)
        if fn is not None:
            hits.append((m, fn))
        elif depth < 3 and cls not in m.classes and "." in m.aliases.get(cls, ""):
            mod2, _, cls2 = m.aliases[cls].rpartition(".")
            hit = lookup(modules, infos, m, mod2, cls2, name, depth + 1)
            if hit is not None:
                hits.append(hit)
    return hits[0] if len(hits) == 1 else None


def method_rank_seeds(infos: list[ModuleInfo], names: set[str]) -> dict[int, dict[str, int]]:
    """A method of another file's class that returns a rank test (`Trainer.save_models`
    returning `self.early_stop >= 7`, a counter only rank 0 advances): `stop =
    trainer.save_models(...)` in the caller is a rank test there too. Per file (by id), the
    method names to know before its walk."""
    index: dict[str, list[ModuleInfo]] = {}
    for info in infos:
        parts = list(Path(info.path).with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts.pop()
        for k in range(1, min(4, len(parts)) + 1):
            index.setdefault(".".join(parts[-k:]), []).append(info)

    def modules(qual: str, caller: ModuleInfo) -> list[ModuleInfo]:
        tail = qual.split(".")[-4:]
        for k in range(len(tail), 0, -1):
            cands = [m for m in index.get(".".join(tail[-k:]), ()) if m is not caller]
            if cands:
                return cands
        return []

    out: dict[int, dict[str, int]] = {}
    for info in infos:
        wanted = [n for n in info.call_lasts() if n in names and n not in info.funcs]
        for rec in info.calls_named(*wanted) if wanted else ():
            got = receiver_class(info, rec.node)
            hit = lookup(modules, infos, info, got[0], got[1], rec.last) if got else None
            if hit is None:
                continue
            ret = hit[1].body[-1] if hit[1].body else None
            level = hit[0].rank_level(ret.value) if isinstance(ret, ast.Return) else 0
            if level:
                out.setdefault(id(info), {})[rec.last] = level
    return out
