"""DDP049 a call that always raises, on the ranks a rank test lets through.

Rank 0 alone logs, plots or saves, and the call it makes there cannot succeed: an API that
current releases removed (pandas 2.0's `DataFrame.append`, `vutils.save_image(...,
range=(-1, 1))` on current torchvision, numpy 1.24's `np.float`, Pillow 10's
`Image.ANTIALIAS`), a call of the project's own function (this file's, or one imported from
another file given) with arguments its signature cannot take (a required parameter left out,
one too many), or a `torch.save` (or an `open(path, "w")`, a log or result file) into a
folder written out in the path (`"Weights/net_%d.pth"`, `"logs/run_{}.txt".format(k)`) that
nothing in the program creates, the checkout does not hold and no launch script or README
beside it makes (`mkdir -p logs`).
Rank 0 raises there while the other
ranks go on to their next collective (the next step's gradient all-reduce, a barrier) and
wait for it. torchrun and `mp.spawn` then stop the job with rank 0's error, after its first
epoch's work; a launcher that lets the others run (srun without `--kill-on-bad-exit`, the
legacy `torch.distributed.launch`) leaves them waiting until the timeout.

Reported only where a collective that every rank reaches follows, in the same function or
in the next turn of a loop around it; a call under `try` is left alone, as is a callee the
file defines twice, rebinds or decorates, a method a subclass may override, and a folder named
at run time or where the program makes any folder whose name it computes. The removed
APIs are those absent from the current releases named in the message; a program that pins
an older release runs. Fix: use the current spelling (`pd.concat`, `value_range=`,
`float`, `Image.LANCZOS`), pass what the function requires, or create the folder
(`os.makedirs(folder, exist_ok=True)`) before the save.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.callgraph import calls_by_func
from ..analysis.context import CallRec, ModuleInfo
from ..analysis.enclosing import enclosing, inside_rank_test, next_wait, only_under_rank_tests
from ..analysis.provenance import NONE
from ..analysis.raising_calls import heads, raise_reason
from ..registry import Hit, rule


@rule('DDP049', 'rank-only-raise', 'error',
      "a call that always raises (a removed API, arguments its function cannot take), made "
      "only on the ranks a rank test lets through, before a collective the others reach",
      'use the current API or pass the arguments the function requires')
def ddp049(info: ModuleInfo) -> Iterator[Hit]:
    if not info.distributed:
        return
    roots = heads(info)
    for rec in _rank_only_calls(info):
        why = raise_reason(info, rec, roots)
        if not why:
            continue
        site = _rank_only_site(info, rec)
        if site is None:
            continue
        follow = _next_wait(info, site)
        if not follow:
            continue
        yield rec.node, "DDP049", (
            f"{why}; only the ranks `{_test(info, site)}` lets through make this call: they "
            f"die here while the others go on to {follow} and wait for them (torchrun and "
            "mp.spawn then end the job with this error; other launchers leave the others "
            "waiting until the timeout)")


def _rank_only_calls(info: ModuleInfo) -> list[CallRec]:
    """The calls under a rank test, and those of functions only called under one."""
    out = list(info.guarded_calls)
    if info.guarded_funcs:
        by_func = calls_by_func(info)
        for fn in info.guarded_funcs:
            out.extend(r for r in by_func.get(id(fn), ()) if not r.guard)
    return out


def _rank_only_site(info: ModuleInfo, rec: CallRec) -> CallRec | None:
    """The call itself when it sits in the body of a rank test, else the call of its function
    that does (every call of it being rank-tested); None under `try`."""
    chain = enclosing(rec.func, info.tree, rec.node) or []
    if any(isinstance(n, ast.Try) for n in chain):
        return None
    if rec.guard and inside_rank_test(info, rec):
        return rec
    if rec.func is not None:
        return only_under_rank_tests(info, rec.func)
    return None


def _next_wait(info: ModuleInfo, site: CallRec) -> str:
    """What the ranks the test turns away wait in: later in the function, or in the next
    turn of a loop around the call, innermost first."""
    return next_wait(info, site.func, site.node.lineno, reversed(site.loops))


def _test(info: ModuleInfo, site: CallRec) -> str:
    chain = enclosing(site.func, info.tree, site.node) or []
    for n in reversed(chain):
        if isinstance(n, ast.If) and info.rank_level(n.test) != NONE:
            return ast.unparse(n.test)
    return "the rank test"


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import pandas as pd
import torch.distributed as dist


def train(model, loader, optimizer, epochs):
    dist.init_process_group("nccl")
    log = pd.DataFrame(columns=["epoch", "loss"])
    for epoch in range(epochs):
        for x in loader:
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            log = log.append({"epoch": epoch, "loss": loss.item()}, ignore_index=True)
"""

RULE = ddp049
