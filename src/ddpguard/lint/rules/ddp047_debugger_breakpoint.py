"""DDP047 a debugger breakpoint left in a distributed program.

`import ipdb; ipdb.set_trace()` (or `pdb.set_trace()`, `breakpoint()`, `pudb.set_trace()`,
`IPython.embed()`) that every rank reaches in a training loop (a loop of a function that runs a
backward, an optimizer step or a collective), in a file that runs as part of a process group:
each process stops at its own prompt on the launcher's one terminal, where nobody can drive
several prompts at once; a rank that is let go waits in its next collective (the gradient
all-reduce) for the ones still stopped, and a rank that stays stopped never exits, so the
launcher tears nothing down. With no terminal (nohup, a batch job) the debugger reads end of
input and raises BdbQuit on every rank instead. Not reported: a breakpoint under any test (`if
args.debug:`, `if rank == 0:`), in an `except` handler (post-mortem debugging), in a file
that is not run by a group, or in a project's own debugging helper (`def set_trace():
pdb.set_trace()`, called when wanted). Fix: remove it, or put it behind a flag that is off by
default.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import ModuleInfo, dotted, is_collective
from ..analysis.enclosing import enclosing
from ..registry import Hit, rule

_BREAKS = {"pdb.set_trace", "ipdb.set_trace", "pudb.set_trace", "IPython.embed",
           "breakpoint"}
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
        if chain is None or any(isinstance(n, _CONDITIONAL) for n in chain):
            continue
        where = "in the training loop every rank runs"
        yield rec.node, "DDP047", (
            f"`{ast.unparse(rec.node)}` stops every rank at a debugger prompt ({where}): the "
            "ranks share the launcher's one terminal and nobody can drive their prompts at "
            "once; a rank let go waits in its next collective for the ones still stopped, "
            "which never exit, so the launcher tears nothing down (with no terminal the "
            "debugger raises BdbQuit on every rank instead); remove it, or put it behind a "
            "flag that is off by default")


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
