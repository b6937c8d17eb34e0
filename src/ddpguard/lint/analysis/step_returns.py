"""A step function that returns early on a value drawn from this rank's own batch, before the
step's sync, called every step by a loop over batches (corpus41b's grpo2: `train_step(batch)`
decodes what the model generated for its batch and returns `{"loss": 0.0}` when the text is
empty, before the backward the other ranks all-reduce in). The `continue` of a loop that
skips an empty batch, one call away.

Only the parameter the loop hands its batch to, and the names the function computes from it
before the test (in statement order, through `with`, `try` and `if` blocks), count as the
batch; the test is one of DDP004's empty-value tests (`not x`, `x is None`, `len(x) == 0`)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from .callgraph import calls_by_func
from .context import CallRec, Func, Loop, ModuleInfo, is_collective
from .enclosing import SCOPES
from .rank_failures import Site, step_callees

EmptyTest = Callable[[ast.expr, set[str]], bool]
# A module's own methods of these names are called with its tensors everywhere (`self.net(x)`
# goes through `forward`): no step function of the project's is looked for behind them.
_MODULE_API = frozenset(("__init__", "__call__", "forward", "train", "eval", "to", "cuda",
                         "step", "zero_grad", "backward", "state_dict", "load_state_dict",
                         "parameters", "__getitem__", "__len__", "__iter__"))


def batch_step_returns(info: ModuleInfo, loop: Loop, func: Func | None,
                       targets: Callable[[], set[str]], empty: EmptyTest
                       ) -> Iterator[tuple[Site, ast.If, int, CallRec]]:
    """For each call in `loop` (of `func`) that hands one of the loop's batch names
    (`targets()`, asked only when a call may need them) to a project function: that
    function's first early return on an empty value of it before its sync, the sync's line
    and the call."""
    seen: set[int] = set()
    batch: set[str] | None = None
    for rec in _candidates(info):
        if rec.func is not func or loop not in rec.loops:
            continue
        if batch is None:
            batch = targets()
        if not any(type(a) is ast.Name and a.id in batch for a in rec.node.args):
            continue
        for m, fn in step_callees(info, rec):
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            param = _param(m, fn, rec, batch)
            hit = _early_return(m, fn, param, empty) if param else None
            if hit is not None:
                yield (m, fn), hit[0], hit[1], rec


def has_step_calls(info: ModuleInfo) -> bool:
    return bool(_candidates(info))


def _candidates(info: ModuleInfo) -> list[CallRec]:
    """The calls in a loop, with arguments, of a name the project defines (once per file):
    most calls in a loop are torch's or a model's."""
    hit = info._memo.get(("step_calls",))
    if hit is None:
        defs = _defined(info)
        # one scan, no index: most files have none, and calls_named's index is not built
        # for them otherwise
        hit = info._memo[("step_calls",)] = [
            r for r in info.calls if r.loops and r.last in defs and r.node.args]
    return hit  # type: ignore[return-value]


def _defined(info: ModuleInfo) -> set[str]:
    """The names of the functions and methods any file of the project defines (once per
    file set)."""
    fs = info.file_set
    memo: dict[str, object] = getattr(fs, "memo", None) or info._memo  # type: ignore[assignment]
    hit = memo.get("step_defs")
    if hit is None:
        hit = memo["step_defs"] = {name for m in getattr(fs, "infos", None) or [info]
                                   for name in m.funcs} - _MODULE_API
    return hit  # type: ignore[return-value]


def _param(m: ModuleInfo, fn: Func, rec: CallRec, batch: set[str]) -> str:
    """The parameter of `fn` that the call fills with the batch (positionally; a method's
    `self` is skipped)."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if m.func_class.get(fn) is not None and params and params[0] in ("self", "cls"):
        params = params[1:]
    for k, a in enumerate(rec.node.args):
        if type(a) is ast.Name and a.id in batch and k < len(params):
            return params[k]
    return ""


def _early_return(m: ModuleInfo, fn: Func, param: str, empty: EmptyTest
                  ) -> tuple[ast.If, int] | None:
    recs = calls_by_func(m).get(id(fn), [])
    # An optimizer step is no wait: a rank that skips it drifts, the others do not stop.
    syncs = [r.node.lineno for r in recs if r.last == "backward" or is_collective(r)]
    if not syncs:
        return None
    last = max(syncs)
    names = {param}
    for st in _in_order(fn.body):
        if st.lineno >= last:
            break
        if type(st) is ast.Assign and any(type(n) is ast.Name and n.id in names
                                          for n in ast.walk(st.value)):
            names |= {n.id for t in st.targets for n in ast.walk(t) if type(n) is ast.Name}
        elif type(st) is ast.If and any(type(b) is ast.Return for b in st.body) and \
                empty(st.test, names):
            later = [s for s in syncs if s > st.lineno]
            if later:
                return st, min(later)
    return None


def _in_order(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a function in source order, nested blocks included, not those of
    an inner function or class, nor of a loop (a return there is one turn's)."""
    stack: list[ast.stmt] = list(reversed(body))
    while stack:
        st = stack.pop()
        yield st
        if isinstance(st, (*SCOPES, ast.For, ast.While, ast.AsyncFor)):
            continue
        inner: list[ast.stmt] = []
        for field in ("body", "orelse", "finalbody"):
            inner.extend(getattr(st, field, ()))
        for h in getattr(st, "handlers", ()):
            inner.extend(h.body)
        stack.extend(reversed(inner))
