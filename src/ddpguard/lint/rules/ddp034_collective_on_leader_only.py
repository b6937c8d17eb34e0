"""DDP034 collective on the leader only.

The certain form of DDP005 (which stays in preview): rank 0 (or local rank 0, or the
project's own main-process predicate) reaches a collective of the default group, directly or
through a project function (in this file or another one given) whose collective is on every
path, and the other ranks reach no collective in its place: they skip it and go on, or never
reach it. The collective waits for ranks that never call it: the job hangs until the NCCL
timeout. Tests inside the helper decided by what the call passes (`validate(...,
distributed=True)` whose `if distributed and dist.is_initialized(): dist.all_reduce(...)`) or
by the program being distributed count as taken; option tests between the rank test and the
call (`if args.swa and is_main:`) are the same on every rank, and the message names them as
what it assumes. Not reported here: a different collective on the other side (a size-then-
payload protocol, two ends of one broadcast), a collective of a group of its own, a helper
whose collective sits under a test of run-time data or in a loop: DDP005 (preview). Pitfall
in [pitfalls.md](pitfalls.md). Fix: call it on every rank, or leave the collective out of the
leader's branch (`model.module` for an evaluation on rank 0 alone, without the all-reduce).
"""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.context import ModuleInfo
from ..analysis.divergence import divergences
from ..registry import At, Hit, rule


@rule("DDP034", "collective-on-leader-only", "error",
      "a collective that rank 0 (or local rank 0) alone reaches: the other ranks reach no "
      "collective in its place",
      "call the collective on every rank (outside the rank branch), or leave it out of the "
      "leader's branch")
def ddp034(info: ModuleInfo) -> Iterator[Hit]:
    """A collective waits until every rank of its group calls it; one the leader alone
    reaches waits forever (docs/pitfalls.md)."""
    for d in divergences(info):
        if d.code == "DDP005" and d.leader is not None:
            assumed = f" (assumed: {d.leader})" if d.leader else ""
            yield At(d.line), "DDP034", (
                d.message.replace("; the ranks reach different collective sequences and "
                                  "wait on each other", "")
                + ": the collective waits for ranks that never call it, and the job hangs"
                + assumed)


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch
import torch.distributed as dist


def validate(model, loader, distributed=False):
    total = sum(model(x).item() for x in loader)
    if distributed and dist.is_initialized():
        t = torch.tensor([total])
        dist.all_reduce(t)


def train(args, model, loader):
    for epoch in range(args.epochs):
        if args.swa and dist.get_rank() == 0:
            validate(model, loader, distributed=True)  # the other ranks never all-reduce
"""

RULE = ddp034
