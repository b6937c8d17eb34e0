"""DDP030 a create-directory race on every rank.

```python
dist.init_process_group("nccl")
if not os.path.exists(args.out_dir):
    os.makedirs(args.out_dir)         # every rank
model = DDP(model)
```

Every rank tests the folder, finds it missing, and creates it: the ranks start together, so
two of them pass the test before either has made it, and the later `mkdir` raises
FileExistsError. That rank dies; the others go on into the next collective (here the DDP
constructor's broadcast) and wait there for it, until the launcher tears the job down or the
timeout ends it. Reported for `os.mkdir`, `os.makedirs` and `Path(...).mkdir` without
`exist_ok=True`, under a test that the same path does not exist, reached on every rank (not
under a rank test, in a function not called only under one) of a module that runs under
torch.distributed, when a collective, a DDP wrap or a backward follows in the same function or
in the caller (the ranks must meet again after it for one death to hang the rest). Silent in a
`try` that catches FileExistsError (or OSError), for a path that names the rank, and where
rank 0 created the same path before. A project helper in another file that does the test and
the `makedirs` on its parameter (`utils.mkdir(path)`) is the same race at each call site that
every rank reaches, with the same silences read at the call. Fix: `os.makedirs(path,
exist_ok=True)`, or create it on rank 0 and `dist.barrier()` before the others use it.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

from ..analysis.callgraph import resolve
from ..analysis.context import CallRec, Func, ModuleInfo, kwarg
from ..analysis.enclosing import dead, enclosing, waits_after
from ..analysis.paths import per_rank_path
from ..analysis.provenance import NONE
from ..registry import Hit, rule

_EXISTS = {"exists", "isdir", "lexists", "is_dir"}
_CATCH = {"FileExistsError", "OSError", "IOError", "EnvironmentError", "Exception",
          "BaseException"}


@rule('DDP030', 'makedirs-race', 'warning',
      'a folder created on every rank after a test that it is missing, without exist_ok',
      'os.makedirs(path, exist_ok=True), or create it on rank 0 and barrier before others use it')
def ddp030(info: ModuleInfo) -> Iterator[Hit]:
    if not info.distributed:
        return
    for rec in info.calls_named("makedirs", "mkdir"):
        call = rec.node
        path = _made_path(info, call)
        if path is None or info.effective_guard(rec) != NONE or per_rank_path(info, path):
            continue
        chain = enclosing(rec.func, info.tree, call)
        if chain is None or dead(chain, call) or not _tested_missing(chain, path) \
                or _caught(chain) or _made_by_rank0(info, rec, path):
            continue
        follow = _follow(info, rec.func, call.lineno)
        if not follow:
            continue
        yield call, "DDP030", (
            f"every rank creates `{ast.unparse(path)}` after testing that it is missing: two "
            f"ranks pass the test together and the later {rec.last}() raises FileExistsError, "
            f"so that rank dies while the others go on to {follow} and wait for it")
    yield from _helper_sites(info)


def _helper_sites(info: ModuleInfo) -> Iterator[Hit]:
    """Calls, on every rank, of another file's helper that makes its parameter's folder after
    testing that it is missing (`utils.mkdir(args.out)`)."""
    helpers = _racy_helpers(info)
    if not helpers:
        return
    for rec in info.calls:
        if rec.last not in helpers or info.effective_guard(rec) != NONE:
            continue
        target = resolve(info, rec)
        if target is None or target[0] is info:
            continue  # this file's own helpers are read at their makedirs (above)
        made = next((m for m in helpers[rec.last]
                     if m[0] is target[0] and m[1] is target[1]), None)
        if made is None:
            continue
        path = _argument(rec.node, made[1], made[2])
        if path is None or per_rank_path(info, path):
            continue
        chain = enclosing(rec.func, info.tree, rec.node)
        if chain is None or dead(chain, rec.node) or _caught(chain) \
                or _made_by_rank0(info, rec, path, (rec.last,)):
            continue
        follow = _follow(info, rec.func, rec.node.lineno)
        if not follow:
            continue
        where = f"{os.path.basename(made[0].path)}:{made[3]}"
        yield rec.node, "DDP030", (
            f"every rank calls {rec.last}(`{ast.unparse(path)}`), which tests that the folder is "
            f"missing and then creates it without exist_ok ({where}): two ranks pass the test "
            f"together and the later one raises FileExistsError, so that rank dies while the "
            f"others go on to {follow} and wait for it")


def _racy_helpers(info: ModuleInfo) -> dict[str, list[tuple[ModuleInfo, Func, str, int]]]:
    """Every plain function of the other files on the command line whose own makedirs makes
    the folder one of its parameters names, after testing that it is missing, on every rank
    of its own body: name -> (module, function, parameter, line). Read once per file set."""
    file_set = info.file_set
    if file_set is None or not getattr(file_set, "multi", False):
        return {}
    memo = file_set.memo.get("ddp030_helpers")  # type: ignore[attr-defined]
    if memo is not None:
        return memo
    out: dict[str, list[tuple[ModuleInfo, Func, str, int]]] = {}
    for other in file_set.infos:  # type: ignore[attr-defined]
        for rec in other.calls_named("makedirs", "mkdir"):
            fn = rec.func
            path = _made_path(other, rec.node)
            if fn is None or fn in other.func_class or not isinstance(path, ast.Name) \
                    or rec.guard or path.id not in _positional(fn) and path.id not in {
                        a.arg for a in fn.args.kwonlyargs} \
                    or _rebound(fn, path.id):
                continue
            chain = enclosing(fn, other.tree, rec.node)
            if chain is None or dead(chain, rec.node) or not _tested_missing(chain, path) \
                    or _caught(chain):
                continue
            out.setdefault(fn.name, []).append((other, fn, path.id, rec.node.lineno))
    file_set.memo["ddp030_helpers"] = out  # type: ignore[attr-defined]
    return out


def _rebound(fn: Func, name: str) -> bool:
    """The function assigns the parameter before use (`path = os.path.join(path, sub)`): the
    folder is no longer the caller's argument."""
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
               for st in fn.body for n in ast.walk(st))


def _positional(fn: Func) -> list[str]:
    return [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]


def _argument(call: ast.Call, fn: Func, param: str) -> ast.expr | None:
    """The expression a call passes for `param` of `fn` (None when a star hides it)."""
    v = kwarg(call, param)
    if v is not None:
        return v
    names = _positional(fn)
    if param not in names:
        return None
    i = names.index(param)
    if any(isinstance(a, ast.Starred) for a in call.args[:i + 1]) or i >= len(call.args):
        return None
    return call.args[i]


def _made_path(info: ModuleInfo, call: ast.Call) -> ast.expr | None:
    """The folder `os.makedirs(p)` / `os.mkdir(p)` / `Path(p).mkdir()` creates, when nothing
    says exist_ok=True; else None."""
    f = call.func
    if not isinstance(f, ast.Attribute):
        if isinstance(f, ast.Name) and (info.qualify(f) or "") in ("os.makedirs", "os.mkdir") \
                and call.args and not _exist_ok(call, 2):
            return call.args[0]
        return None
    q = info.qualify(f) or ""
    if q in ("os.makedirs", "os.mkdir"):
        return call.args[0] if call.args and not _exist_ok(call, 2) else None
    if f.attr == "mkdir" and _is_path(info, f.value) and not _exist_ok(call, 2):
        return f.value
    return None


def _exist_ok(call: ast.Call, pos: int) -> bool:
    v = kwarg(call, "exist_ok")
    if v is None and len(call.args) > pos:
        v = call.args[pos]
    return v is not None and not (isinstance(v, ast.Constant) and not v.value)


def _is_path(info: ModuleInfo, node: ast.expr, depth: int = 0) -> bool:
    if isinstance(node, ast.Call):
        return (info.qualify(node.func) or "").rsplit(".", 1)[-1] in ("Path", "PurePath")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _is_path(info, node.left, depth)
    if isinstance(node, ast.Name) and depth < 2:
        return any(_is_path(info, v, depth + 1) for _, v in info.assigns.get(node.id, []))
    return False


def _same(a: ast.expr, b: ast.expr) -> bool:
    return ast.dump(a) == ast.dump(b)


def _tested_missing(chain: list[ast.AST], path: ast.expr) -> bool:
    """An enclosing `if not os.path.exists(path):` (`isdir`, `Path.exists()`), taken in its
    body."""
    for i, node in enumerate(chain):
        if not isinstance(node, ast.If) or i + 1 >= len(chain) \
                or chain[i + 1] not in node.body:
            continue
        tests = node.test.values if isinstance(node.test, ast.BoolOp) \
            and isinstance(node.test.op, ast.And) else [node.test]
        for t in tests:
            if not (isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not)
                    and isinstance(t.operand, ast.Call)):
                continue
            c = t.operand
            f = c.func
            if not isinstance(f, ast.Attribute) or f.attr not in _EXISTS:
                continue
            arg = c.args[0] if c.args else f.value
            if _same(arg, path):
                return True
    return False


def _caught(chain: list[ast.AST]) -> bool:
    for node in chain:
        if isinstance(node, ast.Try) and any(
                h.type is None or any(n.id in _CATCH for n in ast.walk(h.type)
                                      if isinstance(n, ast.Name))
                or any(n.attr in _CATCH for n in ast.walk(h.type)
                       if isinstance(n, ast.Attribute))
                for h in node.handlers):
            return True
    return False


def _made_by_rank0(info: ModuleInfo, rec: CallRec, path: ast.expr,
                   makers: tuple[str, ...] = ()) -> bool:
    """Rank 0 made the same folder earlier in the same scope (and, as the code's own order
    says, the others wait for it)."""
    line = rec.node.lineno
    func = rec.func
    for other in info.calls_named("makedirs", "mkdir", *makers):
        if other.func is func and other.node.lineno < line and other.guard \
                and other.node.args and _same(other.node.args[0], path):
            return True
    return False


def _follow(info: ModuleInfo, func: Func | None, line: int, depth: int = 0) -> str:
    """What every rank reaches after `line` in `func` (or after a call of `func` in a caller of
    the same file): a collective, a DDP wrap, a backward or a rendezvous ("" for none)."""
    found = waits_after(info, func, line + 1, rendezvous=True)
    if found:
        # Named as the first wait, which may be inside a project helper called before it
        # (`create_model()` wrapping in DDP); the finding itself needs a wait of its own.
        return waits_after(info, func, line + 1, rendezvous=True, through=True)
    if func is None or depth > 1:
        return ""
    for site in info.calls_named(func.name):
        if site.guard or not isinstance(site.node.func, ast.Name) or site.func is func:
            continue
        found = _follow(info, site.func, site.node.lineno, depth + 1)
        if found:
            return found
    return ""


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import os
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
if not os.path.exists(out_dir):
    os.makedirs(out_dir)
model = DDP(net)
"""

RULE = ddp030
