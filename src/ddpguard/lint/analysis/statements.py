"""What a statement or a decorator means to the schedule: a stub that raises, a memoised
function, an assert that narrows a type, a call that turns gradients off, the names a
function's own tests read."""

from __future__ import annotations

import ast

from .context import Func, ModuleInfo, dotted


def _tested_names(info: ModuleInfo, fn: Func) -> frozenset[str]:
    """The parameters of `fn` that its own `if` tests read, or that it passes on whole to a
    call (where the callee's tests may read them)."""
    key = ("tested", id(fn))
    hit = info._memo.get(key)
    if hit is None:
        params = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
        read: set[str] = set()
        for st in ast.walk(fn):
            if isinstance(st, ast.If):
                read.update(n.id for n in ast.walk(st.test) if isinstance(n, ast.Name))
            elif isinstance(st, ast.Call):
                for a in [*st.args, *(k.value for k in st.keywords)]:
                    if isinstance(a, ast.UnaryOp) and isinstance(a.op, ast.Not):
                        a = a.operand  # `is_training=not evaluate`
                    if isinstance(a, ast.Name):
                        read.add(a.id)
        hit = info._memo[key] = frozenset(read & params)
    return hit  # type: ignore[return-value]


def _narrowing(test: ast.expr) -> bool:
    """`assert x is not None`, `assert isinstance(x, T)`: written for the type checker about
    a value the code just made; counting them as exits buries the asserts that can fire."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return all(_narrowing(v) for v in test.values)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        right = test.comparators[0]
        return isinstance(test.ops[0], ast.IsNot) and isinstance(right, ast.Constant) \
            and right.value is None
    return isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and \
        test.func.id in ("isinstance", "callable", "hasattr")


STUB = "raise NotImplementedError"


_MEMO_DECORATORS = {"cache", "lru_cache", "cached", "memoize", "memoized", "cached_property"}


def _grad_off(node: ast.expr) -> bool:
    """`torch.no_grad()`, `torch.inference_mode()`, `torch.set_grad_enabled(False)` (as a
    context or a decorator)."""
    call = node if isinstance(node, ast.Call) else None
    name = dotted(call.func if call is not None else node) or ""
    last = name.rsplit(".", 1)[-1]
    if last in ("no_grad", "inference_mode"):
        return True
    return last == "set_grad_enabled" and call is not None and bool(call.args) and \
        isinstance(call.args[0], ast.Constant) and call.args[0].value is False


def _stub(exc: ast.expr | None) -> bool:
    if isinstance(exc, ast.Call):
        exc = exc.func
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def _memoised(fn: Func) -> bool:
    for d in fn.decorator_list:
        name = dotted(d.func if isinstance(d, ast.Call) else d) or ""
        if name.rsplit(".", 1)[-1] in _MEMO_DECORATORS:
            return True
    return False
