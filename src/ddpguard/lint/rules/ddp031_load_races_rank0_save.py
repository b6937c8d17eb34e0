"""DDP031 every rank loads a file rank 0 is still writing.

```python
if dist.get_rank() == 0:
    torch.save(model.state_dict(), ckpt)
state = torch.load(ckpt, map_location="cpu")   # every rank, no barrier in between
```

Rank 0 serialises the checkpoint while the other ranks, which had nothing to write, go straight
on to read it: they find no file (FileNotFoundError), or a zip rank 0 has only begun (a
truncated-archive error), or last epoch's. Those ranks die while rank 0 goes on into the next
collective and waits for them. Reported where the load is, for `torch.save` under a rank test
followed by `torch.load` of the same path (the same string, however it is built:
`os.path.join(d, n + ".pt")` and `os.path.join(d, n) + ".pt"` are one path) on every rank, with
nothing between them that makes the ranks wait for each other (a collective, a DDP wrap, a
backward, or a call into the project's own code, which might hold one): in one function, or at
the end of one function and the start of the next that a caller runs on every rank right after
it (`train(epoch, opts)` then `test(epoch, opts)`, the path built from the same arguments).
Fix: `dist.barrier()` on every rank after the save and before the load (or hand the state over
in memory instead of through the file).
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator

from ..analysis.callgraph import calls_by_func, params_of, resolve
from ..analysis.context import CallRec, Func, ModuleInfo, exclusive, is_collective, kwarg
from ..analysis.enclosing import dead, enclosing
from ..analysis.paths import path_key
from ..analysis.provenance import NONE
from ..registry import Hit, rule


@rule('DDP031', 'load-races-rank0-save', 'warning',
      'every rank loads a file that rank 0 saves just before, with no barrier in between',
      'dist.barrier() on every rank after the save, before the load')
def ddp031(info: ModuleInfo) -> Iterator[Hit]:
    fs = info.file_set
    mods = fs.infos if fs is not None and fs.multi else [info]  # type: ignore[attr-defined]
    if not any(_saves(m) for m in mods):  # no rank-guarded torch.save in the project
        return
    loads = [(r, p) for r in info.calls_named("load") if _torch(info, r, "load")
             and (p := _arg(r.node, 0, "f")) is not None and info.effective_guard(r) == NONE]
    saves = _saves(info) if info.distributed else []
    for load, path in loads:
        where = _same_function(info, load, path, saves) or _through_caller(info, load, path)
        chain = enclosing(load.func, info.tree, load.node) if where else None
        if where and chain is not None and not dead(chain, load.node):
            yield load.node, "DDP031", (
                f"every rank loads `{ast.unparse(path)}` here, which rank 0 writes at {where} "
                "with nothing in between that makes the ranks wait: the others read a file "
                "not yet written (or half written) and die, while rank 0 waits for them in the "
                "next collective")


def _saves(m: ModuleInfo) -> list[CallRec]:
    """The module's `torch.save(obj, path)` calls under a rank test."""
    hit = m._memo.get(("ddp031_saves", 0))
    if hit is None:
        hit = m._memo[("ddp031_saves", 0)] = [
            r for r in m.calls_named("save") if r.guard and _torch(m, r, "save")
            and _arg(r.node, 1, "f") is not None]
    return hit  # type: ignore[return-value]


def _torch(info: ModuleInfo, rec: CallRec, name: str) -> bool:
    return (rec.qual or info.qualify(rec.node.func) or "") == f"torch.{name}"


def _arg(call: ast.Call, pos: int, name: str) -> ast.expr | None:
    v = kwarg(call, name)
    if v is None and len(call.args) > pos:
        v = call.args[pos]
    return v


def _same_function(info: ModuleInfo, load: CallRec, path: ast.expr,
                   saves: list[CallRec]) -> str:
    key: tuple[str, ...] | None = None
    for save in saves:
        end = save.node.end_lineno or save.node.lineno
        if save.func is not load.func or end >= load.node.lineno or exclusive(save, load):
            continue
        p = _arg(save.node, 1, "f")
        if key is None:
            key = path_key(info, path)
        if p is None or path_key(info, p) != key:
            continue
        if not _waits(info, save.func, end, load.node.lineno):
            return f"line {save.node.lineno}"
    return ""


def _waits(info: ModuleInfo, func: Func | None, after: int, before: int) -> bool:
    """Some call strictly between the lines may make the ranks wait for each other."""
    ddp = info.ddp_names()
    for rec in calls_by_func(info).get(id(func) if func is not None else 0, ()):
        line = rec.node.lineno
        if not after < line < before:
            continue
        if is_collective(rec) or info.is_ddp_call(rec.node) \
                or rec.last in ("backward", "init_process_group", "barrier", "wait") \
                or (isinstance(rec.node.func, ast.Name) and rec.node.func.id in ddp) \
                or resolve(info, rec) is not None:
            return True
    return False


def _through_caller(info: ModuleInfo, load: CallRec, path: ast.expr) -> str:
    """The load is the first thing of its function that waits, and a caller runs, on every
    rank and with nothing in between, a function that ends with rank 0's save of that path."""
    fb = load.func
    if fb is None:
        return ""
    fs = info.file_set
    for mg in (getattr(fs, "infos", None) or [info]):
        for site in mg.calls_named(fb.name):
            prev = None if site.guard else _previous_call(mg, site)
            got = resolve(mg, prev) if prev is not None else None
            if got is None or resolve(mg, site) != (info, fb):
                continue
            ma, fa = got
            for save in _saves(ma):
                p = _arg(save.node, 1, "f")
                if save.func is not fa or p is None or not (ma.distributed or mg.distributed):
                    continue
                end = save.node.end_lineno or save.node.lineno
                if _waits(ma, fa, end, 10**9) or _waits(info, fb, 0, load.node.lineno):
                    continue
                a = _bound(ma, fa, prev.node, p)  # type: ignore[union-attr]
                b = _bound(info, fb, site.node, path)
                if a is not None and a == b:
                    name = ma.path.replace("\\", "/").rsplit("/", 1)[-1]
                    return f"{name}:{save.node.lineno} in {fa.name}() (called just before)"
    return ""


def _previous_call(mg: ModuleInfo, site: CallRec) -> CallRec | None:
    """The call the caller makes just before `site`, on the same path, with no call between
    that might wait (a statement of its own: `train(...)` then `test(...)`)."""
    prev = None
    for rec in calls_by_func(mg).get(id(site.func) if site.func is not None else 0, ()):
        if rec.node.lineno >= site.node.lineno:
            break
        prev = rec
    if prev is None or prev.guard or not isinstance(prev.stmt, ast.Expr) \
            or prev.stmt.value is not prev.node or exclusive(prev, site) \
            or prev.branch != site.branch:
        return None
    return prev


def _bound(m: ModuleInfo, fn: Func, call: ast.Call, path: ast.expr) -> tuple[str, ...] | None:
    """`path` in `fn` with each parameter it names replaced by what `call` passes; None when
    it names anything else but imports (a local of `fn`: not comparable across functions)."""
    params = params_of(fn)
    names = {n.id for n in ast.walk(path) if isinstance(n, ast.Name)} - set(m.aliases) - {"str"}
    positional = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
    given: dict[str, ast.expr] = {k.arg: k.value for k in call.keywords if k.arg}
    for i, a in enumerate(call.args):
        if isinstance(a, ast.Starred):
            return None
        if i < len(positional):
            given.setdefault(positional[i], a)
    if not names <= params or not names <= set(given):
        return None
    new = _Sub(given).visit(copy.deepcopy(path))
    return path_key(m, new)


class _Sub(ast.NodeTransformer):
    def __init__(self, given: dict[str, ast.expr]) -> None:
        self.given = given

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return copy.deepcopy(self.given[node.id]) if node.id in self.given else node


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch
import torch.distributed as dist

if dist.get_rank() == 0:
    torch.save(model.state_dict(), "last.pt")
state = torch.load("last.pt", map_location="cpu")
"""

RULE = ddp031
