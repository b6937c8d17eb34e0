"""DDP029 the result of an in-place collective lost.

`dist.all_reduce(t)`, `dist.broadcast(t, src)`, `dist.reduce(t, dst)` write their result into
`t` and return None (a work handle only with `async_op=True`). Two spellings lose it, on every
rank, with no error:

- the tensor is a temporary (`dist.all_reduce(p.grad.detach().clone())`,
  `dist.all_reduce(torch.tensor(x))`): the reduced values land in an object nothing holds;
- the call's value is used (`g = dist.all_reduce(t)`, a list of them): it is None. A wrapper
  that returns it (`return dist.all_reduce(t, op)`) is reported only where a caller in the
  files linted together reads what the wrapper returns.

The collective itself still runs on every rank, so nothing hangs: the program goes on with
the local values (or with None) as if they had been averaged. Fix: reduce a tensor you keep
(`g = p.grad.clone(); dist.all_reduce(g)`), and read it, not the call's value.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import ModuleInfo, is_collective, kwarg
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
