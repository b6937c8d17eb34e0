"""DDP047 a debugger breakpoint left in a distributed program.

`import ipdb; ipdb.set_trace()` (or `pdb.set_trace()`, `breakpoint()`, `pudb.set_trace()`,
`IPython.embed()`) that every rank reaches in a training loop (a loop of a function that runs a
backward, an optimizer step or a collective), in a file that runs as part of a process group:
each process stops at its own prompt on the launcher's one terminal, where nobody can drive
several prompts at once; a rank that is let go waits in its next collective (the gradient
all-reduce) for the ones still stopped, and a rank that stays stopped never exits, so the
launcher tears nothing down. With no terminal (nohup, a batch job) the debugger reads end of
input and raises BdbQuit on every rank instead. A test on the run's progress on the way
(`if epoch > 0:`, `if step % 100 == 0:`, a `while` loop's body) does not spare it: every
rank passes it at the same point. Not reported: a breakpoint under any other test (`if
args.debug:`, `if rank == 0:`, `if loss > 10:`), in an `except` handler (post-mortem
debugging), in a file that is not run by a group, or in a project's own debugging helper
(`def set_trace(): pdb.set_trace()`, called when wanted). Fix: remove it, or put it behind a
flag that is off by default.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ..analysis.context import ModuleInfo, dotted, is_collective
from ..analysis.enclosing import enclosing
from ..analysis.provenance import NONE
from ..registry import Hit, rule

_BREAKS = {"pdb.set_trace", "ipdb.set_trace", "pudb.set_trace", "IPython.embed",
           "breakpoint"}
_COUNTER = re.compile(r"epoch|step|iter")
_SWITCH = re.compile(r"debug|pdb|trace|break|verbose|interactive|inspect")
_CONDITIONAL = (ast.If, ast.While, ast.IfExp, ast.ExceptHandler, ast.BoolOp, ast.Lambda)


@rule('DDP047', 'debugger-breakpoint', 'error',
      'a debugger breakpoint (pdb/ipdb.set_trace, breakpoint()) every rank reaches in a '
      'distributed program',
      'remove it, or put it behind a flag that is off by default')
def ddp047(info: ModuleInfo) -> Iterator[Hit]:
    recs = info.calls_named("set_trace", "breakpoint", "embed")
    if not recs:
        return
    file_set = info.file_set
    grouped = file_set.in_group(info) if getattr(  # type: ignore[attr-defined]
        file_set, "multi", False) else info.distributed
    if not grouped:
        return
    for rec in recs:
        name = rec.qual if rec.qual in _BREAKS else dotted(rec.node.func)
        if name not in _BREAKS or not rec.loops or not _trains(info, rec.func):
            continue
        chain = enclosing(rec.func, info.tree, rec.stmt or rec.node)
        if chain is None or not _every_rank(info, chain, rec.stmt or rec.node):
            continue
        where = "in a loop every rank runs, in a function that trains"
        yield rec.node, "DDP047", (
            f"`{ast.unparse(rec.node)}` stops every rank at a debugger prompt ({where}): the "
            "ranks share the launcher's one terminal and nobody can drive their prompts at "
            "once; a rank let go waits in its next collective for the ones still stopped, "
            "which never exit, so the launcher tears nothing down (with no terminal the "
            "debugger raises BdbQuit on every rank instead); remove it, or put it behind a "
            "flag that is off by default")


def _every_rank(info: ModuleInfo, chain: list[ast.AST], node: ast.AST) -> bool:
    """Every rank gets to `node`: no test stands on the way but a `while` loop's own body and
    the body of an `if` on the run's progress (`if epoch > 0:`, `if step % 100 == 0:`), which
    all ranks pass at the same point (samtemp's breakpoint in its per-epoch validation)."""
    for i, n in enumerate(chain):
        inner = chain[i + 1] if i + 1 < len(chain) else node
        if isinstance(n, ast.While) and inner in n.body:
            continue
        if isinstance(n, ast.If) and inner in n.body and _progress(info, n.test):
            continue
        if isinstance(n, _CONDITIONAL):
            return False
    return True


def _progress(info: ModuleInfo, test: ast.expr) -> bool:
    """`test` compares the run's counters (an epoch, step or iteration) with constants or
    settings: no call, no rank, nothing named like a debugging switch."""
    if info.rank_level(test) != NONE:
        return False
    named = False
    for n in ast.walk(test):
        if isinstance(n, (ast.Call, ast.Lambda, ast.NamedExpr)):
            return False
        ident = n.id if isinstance(n, ast.Name) else n.attr if isinstance(
            n, ast.Attribute) else None
        if ident is None:
            continue
        low = ident.lower()
        if _SWITCH.search(low):
            return False
        named = named or bool(_COUNTER.search(low))
    return named and isinstance(test, (ast.Compare, ast.BoolOp)) and (
        not isinstance(test, ast.BoolOp) or isinstance(test.op, ast.And))


def _trains(info: ModuleInfo, fn: ast.AST | None) -> bool:
    """`fn` (None: the module's own statements) runs a training step (a backward, an optimizer
    step, a collective): not a debugging helper of the project (`def set_trace():
    pdb.set_trace()`, called when wanted)."""
    return any(r.func is fn and (r.last in ("backward", "step") or is_collective(r))
               for r in info.calls)


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.distributed as dist


def train(model, loader, optimizer):
    dist.init_process_group("nccl")
    for x in loader:
        import ipdb; ipdb.set_trace()  # left from a debugging session
        model(x).sum().backward()
        optimizer.step()
"""

RULE = ddp047
