"""DDP017 local rank 0 writes in a multi-node script.

Checkpoints (not logs) decided by a local-rank test (`local_rank == 0`, `self.local_rank == 0`,
`args.rank % ngpus_per_node == 0`), directly or through a helper that reaches `torch.save`
(reported at the guarded call), in a script that can run on several nodes (`RANK`, `NODE_RANK`,
`SLURM_PROCID`, `--nnodes`, `get_rank()`): every node's local rank 0 writes the same file (a
pattern from the field reports, which use both RANK and LOCAL_RANK). Fix: global rank. One
finding per guarded block (the arguments, the optimizer and the scheduler saved one after
another under one test are one decision), and a save under a local-rank test of its own is
reported where it is, not again at every call of the functions that lead to it. Off by default:
independent first-contact reviews judged it true once in five; the harm needs nodes that share
one file system, which the code does not show; `--extend-select DDP017`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import (
    Func,
    ModuleInfo,
    kwarg,
)
from ..analysis.provenance import LOCAL
from ..registry import Hit, rule


def _in_memory(info: ModuleInfo, call: ast.Call) -> bool:
    """`torch.save(obj, io.BytesIO())`: a buffer per process, nothing shared is written."""
    dest = call.args[1] if len(call.args) > 1 else kwarg(call, "f")
    if dest is None:
        return False
    return any(isinstance(v, ast.Call) and info.callee_last(v) == "BytesIO"
               for v in [dest, *info.values_of(dest)])


@rule('DDP017', 'local-rank-zero-writes', 'warning',
      'a local-rank test (`local_rank == 0`, `rank % ngpus_per_node == 0`) decides '
      'checkpointing in a multi-node script',
      'use the global rank (dist.get_rank() == 0)', default=False)
def ddp017(info: ModuleInfo) -> Iterator[Hit]:
    """Off by default: whether every node's local rank 0
    writing one file matters depends on a shared file system the code does not show;
    independent reviewers called 4 of 5 findings on unseen code debatable (VAR's per-node
    checkpoints, the old example trainers' `local_rank in [-1, 0]` saves)."""
    if not info.multi_node:
        return
    seen: set[tuple[object, ...]] = set()
    for rec in info.calls:
        if rec.guard != LOCAL:
            continue
        # One finding per guarded block: the args, the optimizer and the scheduler saved one
        # after another under the same test are one decision to fix, not three.
        block = (id(rec.func), rec.branch)
        if block in seen:
            continue
        saved = _saves_in(info, info.local_callees(rec), 2)
        if saved is not None:
            seen.add(block)
            yield rec.node, "DDP017", (
                f"{rec.last}() writes a checkpoint (torch.save, line {saved}) under a "
                "local-rank test in a multi-node script: local rank 0 of every node writes "
                "the same file")
        elif rec.qual == "torch.save" and not _in_memory(info, rec.node):
            seen.add(block)
            yield rec.node, "DDP017", ("torch.save is guarded by the local rank in a "
                                       "multi-node script: local rank 0 of every node writes "
                                       "the same file")


def _saves_in(info: ModuleInfo, fns: list[Func], depth: int) -> int | None:
    """Line of a torch.save that `fns` reach (through local calls, `depth` levels). A save
    under a local-rank test of its own is reported where it is, not again at every call."""
    for rec in info.calls:
        if rec.func in fns:
            if rec.qual == "torch.save" and not _in_memory(info, rec.node):
                if rec.guard == LOCAL:
                    continue
                return rec.node.lineno
            if depth and (line := _saves_in(info, info.local_callees(rec), depth - 1)):
                return line
    return None


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
rank = int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])
if local_rank == 0:
    torch.save(state, "ckpt.pt")  # one writer per node, all to the same shared file
"""

RULE = ddp017
