"""DDP029 the result of an in-place collective lost.

`dist.all_reduce(t)`, `dist.broadcast(t, src)`, `dist.reduce(t, dst)` write their result into
`t` and return None (a work handle only with `async_op=True`). Two spellings lose it, on every
rank, with no error:

- the tensor is a temporary (`dist.all_reduce(p.grad.detach().clone())`,
  `dist.all_reduce(torch.tensor(x))`): the reduced values land in an object nothing holds;
- the call's value is used (`g = dist.all_reduce(t)`, a list of them): it is None. A wrapper
  that returns it (`return dist.all_reduce(t, op)`) is reported only where a caller in the
  files linted together reads what the wrapper returns.

A third loses it one call away: a helper of the project reduces a copy of its argument and
returns it (`t = torch.tensor([loss]); dist.all_reduce(t); return t[0]`), and a call drops
what it returns (`sync_loss(avg_loss, device)` as a statement) while the caller goes on to
read its argument (`avg_loss`), which is still this rank's own value. Not where the helper
also hands the copy to anything else (writes it back, logs it).

The collective itself still runs on every rank, so nothing hangs: the program goes on with
the local values (or with None) as if they had been averaged. Fix: reduce a tensor you keep
(`g = p.grad.clone(); dist.all_reduce(g)`), and read it, not the call's value.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

from ..analysis.bindings import names_in
from ..analysis.callgraph import resolve
from ..analysis.context import Func, ModuleInfo, is_collective, kwarg
from ..registry import Hit, rule

# Collectives that write their result into their first argument and return None when
# synchronous (all_gather and friends write into a list the caller keeps: not these).
_IN_PLACE = {"all_reduce", "broadcast", "reduce", "all_reduce_coalesced"}
# Calls that always make a new tensor, and calls that may hand back their receiver or a view
# of it (`acol.contiguous()` of a contiguous tensor is `acol`; `loss.detach()` shares its
# storage): a reduction into the latter reaches a tensor someone holds.
_FRESH = {"clone", "tensor", "zeros_like", "ones_like", "empty_like", "full_like", "stack",
          "cat", "sum", "mean", "new_tensor"}
_SAME = {"contiguous", "detach", "view", "reshape", "flatten", "float", "half", "double", "to",
         "cuda", "cpu", "data"}


@rule('DDP029', 'collective-result-lost', 'warning',
      'the result of dist.all_reduce / broadcast / reduce written into a temporary, or the '
      "call's value (None) used",
      'reduce a tensor you keep, and read that tensor')
def ddp029(info: ModuleInfo) -> Iterator[Hit]:
    for rec in info.calls_named(*_IN_PLACE):
        node = rec.node
        if not is_collective(rec) or not node.args:
            continue
        asynchronous = kwarg(node, "async_op")
        if asynchronous is not None and not (isinstance(asynchronous, ast.Constant)
                                             and asynchronous.value is False):
            continue
        target = node.args[0]
        if _temporary(target):
            yield node, "DDP029", (
                f"dist.{rec.last} writes its result into `{ast.unparse(target)}`, a "
                "temporary nothing keeps: the reduced values are lost on every rank")
        elif rec.stmt is not None and _value_used(rec.stmt, node) and (
                not isinstance(rec.stmt, ast.Return) or _callers_read(info, rec.func)):
            yield node, "DDP029", (
                f"the value of dist.{rec.last}(...) is used, but a synchronous collective "
                f"returns None: the result is in `{ast.unparse(target)}`")
    yield from _dropped(info)


def _dropped(info: ModuleInfo) -> Iterator[Hit]:
    """`sync_loss(avg_loss, device)` as a statement, where sync_loss reduces a copy of its
    argument and returns it, and the caller reads `avg_loss` after the call."""
    names = _copy_reducers(info)
    if not names:
        return
    for rec in info.calls_named(*names):
        stmt = rec.stmt
        if not isinstance(stmt, ast.Expr) or stmt.value is not rec.node \
                or not rec.node.args or rec.func is None:
            continue
        arg = ast.unparse(rec.node.args[0])
        if not isinstance(rec.node.args[0], ast.Name | ast.Attribute):
            continue
        read = next((n.lineno for n in ast.walk(rec.func) if isinstance(n, ast.Name | ast.Attribute)
                     and isinstance(n.ctx, ast.Load) and n.lineno > rec.node.end_lineno  # type: ignore[operator]
                     and ast.unparse(n) == arg), None)
        if read is None:
            continue
        hit = resolve(info, rec)
        if hit is None or (where := _reduces_copy(hit[1])) is None:
            continue
        yield rec.node, "DDP029", (
            f"{hit[1].name}() reduces a copy of its argument across ranks (dist.{where[0]} at "
            f"{os.path.basename(hit[0].path)}:{where[1]}) and returns it, but this call drops "
            f"what it returns: `{arg}`, read at line {read}, is still this rank's own value; "
            f"assign it (`{arg} = {ast.unparse(rec.node)}`)")


def _copy_reducers(info: ModuleInfo) -> set[str]:
    """Names of the functions in the files given that reduce a copy and return it."""
    file_set = info.file_set
    memo = getattr(file_set, "memo", None)
    if memo is not None and "ddp029_copy_reducers" in memo:
        return memo["ddp029_copy_reducers"]
    out: set[str] = set()
    for m in getattr(file_set, "infos", None) or [info]:
        seen: set[int] = set()
        for rec in m.calls_named(*_IN_PLACE):
            fn = rec.func
            if fn is None or id(fn) in seen or fn.name in out or not rec.node.args \
                    or not isinstance(rec.node.args[0], ast.Name) or not is_collective(rec):
                continue
            seen.add(id(fn))
            # a helper's last statement returns the reduced tensor (most functions that
            # reduce return nothing or something else: no walk of their bodies)
            last = fn.body[-1]
            if isinstance(last, ast.Return) and last.value is not None \
                    and _mentions(last.value, rec.node.args[0].id) and _reduces_copy(fn):
                out.add(fn.name)
    if memo is not None:
        memo["ddp029_copy_reducers"] = out
    return out


def _reduces_copy(fn: Func) -> tuple[str, int] | None:
    """(collective, line) where `fn` binds a fresh tensor made from one of its parameters,
    reduces it in place, returns it, and does nothing else with it."""
    # what is made from the parameters (`t = [loss]` then `t = torch.tensor(t)`)
    derived = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args]}
    fresh: dict[str, ast.Assign] = {}
    for st in fn.body:
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1
                and isinstance(st.targets[0], ast.Name)):
            continue
        if not any(isinstance(n, ast.Name) and n.id in derived for n in ast.walk(st.value)):
            continue
        name = st.targets[0].id
        if _temporary(st.value):
            fresh[name] = st
        else:
            derived.add(name)
    if not fresh:
        return None
    # one walk: the calls, the returned values and the stores of the function
    calls: list[ast.Call] = []
    returns: list[ast.expr] = []
    stores: list[ast.Name] = []
    for n in ast.walk(fn):
        if isinstance(n, ast.Call):
            calls.append(n)
        elif isinstance(n, ast.Return) and n.value is not None:
            returns.append(n.value)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id in fresh:
            stores.append(n)
    for name, bound in fresh.items():
        coll = None
        other = False
        for c in calls:
            if c is bound.value or name not in _roots(c):
                continue
            last = c.func.attr if isinstance(c.func, ast.Attribute) else getattr(c.func, "id", "")
            if last in _IN_PLACE and c.args and isinstance(c.args[0], ast.Name) \
                    and c.args[0].id == name and kwarg(c, "async_op") is None:
                coll = coll or (last, c.lineno)
            elif not (last in _SAME or last in ("item", "tolist", "numpy")):
                other = True
        if coll and not other and returns and all(name in names_in(v) for v in returns) \
                and not any(n.id == name and n.lineno > bound.lineno for n in stores):
            return coll
    return None


def _root(node: ast.expr | None) -> str:
    """The name under subscripts and attributes (`t[0]`, `t.item`), "" for none."""
    while isinstance(node, ast.Subscript | ast.Attribute | ast.Starred):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _roots(call: ast.Call) -> set[str]:
    """The names a call hands its tensor arguments or its receiver as."""
    parts = [*call.args, *(k.value for k in call.keywords)]
    if isinstance(call.func, ast.Attribute):
        parts.append(call.func.value)
    return {_root(x) for x in parts}


def _mentions(node: ast.expr, name: str) -> bool:
    """`name` within the first levels of `node` (`rt`, `t[0]`, `t / world_size`, `(t, n)`): the
    shapes a helper returns its reduced tensor in, without a walk of deeper expressions."""
    todo: list[tuple[ast.AST, int]] = [(node, 0)]
    while todo:
        n, depth = todo.pop()
        if isinstance(n, ast.Name):
            if n.id == name:
                return True
        elif depth < 3:
            todo.extend((c, depth + 1) for c in ast.iter_child_nodes(n))
    return False


def _temporary(node: ast.expr) -> bool:
    """A tensor the argument expression makes afresh (`p.grad.detach().clone()`,
    `torch.tensor([x])`), past calls that may return their receiver."""
    while isinstance(node, ast.Call | ast.Attribute):
        f = node.func if isinstance(node, ast.Call) else node
        last = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) \
            else ""
        if isinstance(node, ast.Call) and last in _FRESH:
            return True
        if last not in _SAME or not isinstance(f, ast.Attribute):
            return False
        node = f.value
    return False


def _value_used(stmt: ast.stmt, call: ast.Call) -> bool:
    """The call's value is assigned or returned (`g = dist.all_reduce(t)`, a list of them)."""
    if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.Return) and stmt.value is not None:
        return any(n is call for n in ast.walk(stmt.value))
    return False


def _callers_read(info: ModuleInfo, fn: ast.AST | None) -> bool:
    """A wrapper that hands back the collective's None (`return dist.all_reduce(t, op)`,
    mirroring torch's own signature) loses nothing unless a caller in the files given reads
    what it returns."""
    name = getattr(fn, "name", None)
    if name is None:
        return True
    for m in getattr(info.file_set, "infos", None) or [info]:
        for r in m.calls_named(name):
            if is_collective(r):
                continue  # torch's own of the same name, not the wrapper
            if r.stmt is not None and not (isinstance(r.stmt, ast.Expr)
                                           and r.stmt.value is r.node):
                return True
    return False


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.distributed as dist

grads = [dist.all_reduce(p.grad.detach().clone()) for p in model.parameters()]
"""

RULE = ddp029
