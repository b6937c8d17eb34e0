"""The statements around one node, for the few rules that ask about a handful of calls (an
explicit search from the function's top, not a parent map of every node)."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from .collective_reach import reaches_collective
from .context import CallRec, Func, Loop, ModuleInfo, is_collective
from .ranks import FALSE, TRUE, launch

# A DDP wrap in a helper counts as the collective it makes (its parameter broadcast).
_WRAPS = frozenset(("DistributedDataParallel", "DDP", "backward"))

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def enclosing(func: Func | None, tree: ast.Module, node: ast.AST) -> list[ast.AST] | None:
    """The nodes enclosing `node` inside its function (outermost first), None if not found."""
    stack: list[tuple[ast.AST, list[ast.AST]]] = [
        (st, []) for st in (func.body if func is not None else tree.body)]
    while stack:
        cur, up = stack.pop()
        if cur is node:
            return up
        if isinstance(cur, SCOPES):
            continue
        down = [*up, cur]
        stack.extend((child, down) for child in ast.iter_child_nodes(cur))
    return None


def dead(chain: list[ast.AST], node: ast.AST) -> bool:
    """`node` sits in an arm that a constant test never takes (`if 0:`, `if False:`, the
    `else` of `if True:`)."""
    for i, n in enumerate(chain):
        if isinstance(n, ast.If) and isinstance(n.test, ast.Constant):
            inner = chain[i + 1] if i + 1 < len(chain) else node
            taken = n.body if n.test.value else n.orelse
            if inner not in taken:
                return True
    return False


def single_process_arm(info: ModuleInfo, node: ast.Call) -> bool:
    """The call sits in an arm a distributed run never takes (the `else` of `if world_size >
    1:`, the body of `if not args.distributed:`): the single-process path."""
    rec = info.call_rec(node)
    chain = enclosing(rec.func if rec is not None else None, info.tree, node)
    for i, n in enumerate(chain or []):
        if isinstance(n, ast.If):
            v = launch(info, n.test)
            inner = chain[i + 1] if chain is not None and i + 1 < len(chain) else node
            if v == TRUE and inner in n.orelse or v == FALSE and inner in n.body:
                return True
    return False


def waits_after(info: ModuleInfo, func: Func | None, start: int,
                rendezvous: bool = False, through: bool = False) -> str:
    """The first call in `func`, at line `start` or later and under no rank test, that makes
    every rank wait for the others: a collective, a DDP wrap, a backward (and, with
    `rendezvous`, init_process_group; with `through`, a call of the project's own code that
    reaches one, such as a `create_model()` that wraps in DDP), said with its line; "" for
    none."""
    for rec in info.calls:
        if rec.func is not func or rec.node.lineno < start or rec.guard:
            continue
        if through and not is_collective(rec) and not info.is_ddp_call(rec.node) \
                and rec.last not in ("backward", "init_process_group") \
                and reaches_collective(info, rec, _WRAPS):
            return (f"the collective (or DDP wrap) inside {rec.last}() at line "
                    f"{rec.node.lineno}")
        if is_collective(rec):
            return f"{rec.last}() at line {rec.node.lineno}"
        if info.is_ddp_call(rec.node):
            return f"the DDP constructor's broadcast at line {rec.node.lineno}"
        if rendezvous and rec.last == "init_process_group":
            return f"the rendezvous of init_process_group() at line {rec.node.lineno}"
        if rec.last == "backward":
            return f"the backward's all-reduce at line {rec.node.lineno}"
    return ""


def next_wait(info: ModuleInfo, func: Func | None, line: int, loops: Iterable[Loop]) -> str:
    """What every rank waits in after `line`: later in `func` (waits_after), or in the next
    turn of one of `loops` around it, tried in the order given (the next epoch's backward,
    the next step's)."""
    follow = waits_after(info, func, line)
    if follow:
        return follow
    for loop in loops:
        follow = waits_after(info, func, loop.lineno)
        at = int(follow.rsplit(" ", 1)[-1]) if follow else 0
        if at and at <= (loop.end_lineno or 0):
            return f"{follow} (the loop's next turn)"
    return ""


_BLOCKS = {ast.If: ("body", "orelse"), ast.For: ("body", "orelse"),
           ast.AsyncFor: ("body", "orelse"), ast.While: ("body", "orelse"),
           ast.With: ("body",), ast.AsyncWith: ("body",),
           ast.Try: ("body", "handlers", "orelse", "finalbody")}


def block_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """Every statement of a scope in source order, nested blocks included, not those of inner
    functions or classes (one explicit stack: DDP027 runs it for every function with a rank
    test, DDP041 and DDP044 for the scopes they read)."""
    out: list[ast.stmt] = []
    stack: list[ast.AST] = list(reversed(body))
    pop, push = stack.pop, stack.extend
    while stack:
        st = pop()
        if type(st) is ast.ExceptHandler:
            push(reversed(st.body))
            continue
        out.append(st)  # type: ignore[arg-type]
        fields = _BLOCKS.get(type(st))
        if fields:
            for name in reversed(fields):
                push(reversed(getattr(st, name)))
    return out


def only_under_rank_tests(info: ModuleInfo, fn: Func, depth: int = 0) -> CallRec | None:
    """A call of `fn` in this file, where every call of it sits in the body of a rank test
    (PepHAR's `validate(it)` under `if ... and local_rank == 0:`), or in a function that is
    itself only called so; None where one call is not, or there is none."""
    if fn not in info.guarded_funcs or depth > 2:
        return None
    sites = [r for r in info.calls if fn in info.local_callees(r)]
    if not sites:
        return None
    for r in sites:
        if not (r.guard and inside_rank_test(info, r)) and (
                r.func is None or only_under_rank_tests(info, r.func, depth + 1) is None):
            return None
    return sites[0]


def inside_rank_test(info: ModuleInfo, rec: CallRec) -> bool:
    """The step sits in the body of an `if` on the rank, not merely past a rank-tested
    `return` (`if args.eval_first and is_main_process(): ...; return` leaves every rank that
    goes on to train stepping its scheduler)."""
    chain = enclosing(rec.func, info.tree, rec.node)
    for i, n in enumerate(chain or []):
        if isinstance(n, ast.If) and info.rank_level(n.test):
            inner = chain[i + 1] if chain is not None and i + 1 < len(chain) else rec.stmt
            if any(inner is st for st in n.body):
                return True
    return False
