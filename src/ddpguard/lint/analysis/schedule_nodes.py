"""The nodes of a function's schedule tree (schedule.py builds them, projection.py walks them)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from .context import Func, ModuleInfo


# -- the tree built once per function -------------------------------------------------------
@dataclass(frozen=True)
class CallerParam:
    """A callee parameter bound to the caller's own parameter: its value is known only where
    the caller's caller passed a literal (a marker of its own: a literal may be a tuple).
    `negate`: the argument was `not param` (`convert(is_training=not evaluate)`)."""
    name: str
    negate: bool = False


@dataclass(slots=True)
class Ev:
    kind: str          # coll fwd pcall write exit mayexit yield
    op: str
    line: int
    text: str = ""     # the collective's group, the forwarded model, the written path
    per_rank: bool = False
    path: str = ""     # the file it is in (a callee may sit in another file)
    names: frozenset[str] = frozenset()   # the plain names a written path is built from
    no_grad: bool = False   # a forward under `torch.no_grad()` / `inference_mode()`
    caught: str = ""   # an exit in an `except` handler: the error it catches (`KeyError`)


@dataclass(slots=True)
class IfN:
    test: ast.expr
    body: list[object]
    orelse: list[object]
    split: bool
    line: int
    fixed: int   # TRUE/FALSE for launch-mode tests (`if args.distributed:`), else UNKNOWN
    fallback: bool = False   # `if found is None:` after a search (runtime_tests.fallback)
    received: bool = False   # reads what a collective delivered (runtime_tests.received)


@dataclass(slots=True)
class LoopN:
    body: list[object]
    line: int
    iter: ast.expr | None = None   # what a `for` loop walks (leader_only reads it)


@dataclass(slots=True)
class CallN:
    site: int
    target: tuple[ModuleInfo, Func]
    bind: dict[str, tuple[str, str]]   # callee parameter -> ("ddp", name) | ("param", name)
    ctx_body: list[object] | None = None   # `with helper(): body` on a generator helper
    # callee parameter the callee's own tests read -> a literal (True, False, None, a number,
    # a string, a tuple) or CallerParam(name): `load_data(args, evaluate=True)`
    consts: dict[str, object] = field(default_factory=dict)
    # callee parameters whose argument here is a per-rank path (`f"best_w{rank}.th"`, or a
    # name assigned one): a write to that parameter writes one file per rank
    per_rank: frozenset[str] = frozenset()
    no_grad: bool = False   # the call sits under `torch.no_grad()` in the caller
    via_self: bool = False  # `self.method(...)`: the callee's `self` is the caller's
