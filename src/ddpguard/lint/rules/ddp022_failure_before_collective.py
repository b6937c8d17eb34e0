"""DDP022 a failure before a collective on some ranks only.

The same for an `assert` that one class evaluates or a `raise` that one class reaches: swav's
`assert len(random_idx) >= K` under `if args.rank == 0:` just before `dist.broadcast(centroids,
0)`; a rank-0 `raise` when the output directory exists. When it fires, torchrun,
`torch.distributed.launch` and `mp.spawn` stop every worker (the job ends with that error); only
launchers that let the others run (srun without `--kill-on-bad-exit`) leave them in the
collective until the timeout. `assert x is not None` / `assert isinstance(...)`, written for the
type checker, are not counted. Off by default: on real code most such asserts check an invariant
that cannot fire (1 true in 7), and reviewers judged rank-0 raises on unseen code debatable
twice and false once (under torchrun the job ends with the intended error). `--extend-select
DDP022`.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.context import (
    ModuleInfo,
)
from ..analysis.divergence import divergences
from ..registry import At, Hit, rule


@rule("DDP022", "failure-before-collective", "warning",
      "an assert or raise that only some rank classes reach, before a collective the others "
      "go on to",
      "check the condition on every rank (or broadcast it) before anyone can fail",
      default=False)
def ddp022(info: ModuleInfo) -> Iterator[Hit]:
    """An `assert` or `raise` that only rank 0 reaches, just before a broadcast: if it fires,
    the other ranks wait for a rank that is gone, unless the launcher ends the job (torchrun,
    torch.distributed.launch and mp.spawn stop every worker when one fails; srun without
    --kill-on-bad-exit does not). Off by default: on real code most such asserts are
    invariants that cannot fire (1 true in 7), and a rank-0 `raise` under torchrun ends
    the job with its own error."""
    for d in divergences(info):
        if d.code == "DDP022":
            yield At(d.line), "DDP022", d.message


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch
import torch.distributed as dist


def init_centroids(bank, k):
    centroids = torch.empty(k, bank.shape[1])
    if dist.get_rank() == 0:
        idx = torch.randperm(len(bank))[:k]
        assert len(idx) >= k, "too few samples"  # rank 0 fails ...
        centroids = bank[idx]
    dist.broadcast(centroids, 0)  # ... the others wait here
    return centroids
"""

RULE = ddp022
