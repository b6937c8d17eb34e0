"""DDP005 collective divergence.

Two rank classes reach different collective sequences (`barrier`, `all_reduce`, `reduce`,
`broadcast*`, `all_gather*`, `gather*`, `scatter*`, `reduce_scatter*`, `all_to_all*`,
`monitored_barrier` of `torch.distributed`): a collective one class calls and the other does
not, or a different one at the same point, directly or inside a helper (reported at the call:
rank 0 alone calling a resume helper that broadcasts inside). Its certain form, the leader
alone reaching a collective of the default group where the others reach none, is DDP034's (on
by default) and not repeated here. The message names both classes with the test that chose
their arm, and both lines. A helper called in both arms of a rank test with the same literal
arguments is compared once, in the helper (`if rank == 0: training(rank) else:
training(rank)`); with different literals (`load(evaluate=True)` on one side) the call itself
is where they part. Two classes that reach the same collectives in the same order on every path
of the tests they share (flags, configs: the same on every rank) do not diverge, whatever lines
they use (OpenMatch's `if only_load_in_master: if not is_first_worker(): barrier(); return` ...
`barrier()`: one barrier per rank on each path). Not aligned, because the text cannot decide
them: a worker loop that leaves on the value it received (`while True: broadcast(signal); if
signal.item() == 0: break`, the other side of a leader-driven protocol such as mace's L-BFGS);
a closure handed to other code under rank tests only (`optimizer.step(closure)` on rank 0,
`closure()` on the workers); a function of the file handed to a thread under a rank test
(`Thread(target=batching_loop)` on rank 0, metaseq's server). `is_chief` is TensorFlow's role
name, not rank 0, unless a linted file defines it from the rank; `is_first_worker` is a leader
test; functions that return a rank test are known wherever they are defined in the file. Also:
a collective reached only in the fallback of a search (`name = None`, a loop that may set it,
then `if name is None:`) is run-time data, not a proven divergence; a test of a value a
collective of the function delivered (`n = size.item()` after `broadcast(size)`) follows the
sender's choice (size-then-payload protocols); the arm of a DataLoader-worker test
(`get_worker_info() is None`) that only workers take is no rank's path; `dist.get_rank(group)`
is the rank within a subgroup, not a rank class; and a bound method handed to other code under
a rank test (`wandb.agent(function=trainer.train)`) is handed away like a plain function. Not
reported either: ranks > 0 alone in a collective of a group of their own
(`dist.barrier(workers)` beside a parameter server), and a class that fails first (`if rank !=
server: raise RuntimeError(...)`: the launcher ends the job). Pitfall in
[pitfalls.md](pitfalls.md). Fix: the same collectives, in the same order, on every rank.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.context import (
    ModuleInfo,
)
from ..analysis.divergence import divergences
from ..registry import At, Hit, rule


@rule("DDP005", "collective-divergence", "error",
      "two rank classes reach different collective sequences (a collective only some ranks "
      "call, or a different one on each side)",
      "call the same collectives, in the same order, on every rank (outside the rank branch)",
      preview=True)
def ddp005(info: ModuleInfo) -> Iterator[Hit]:
    """Every rank must call the same collectives in the same order; one that waits in a
    collective the others never reach waits until the NCCL timeout (docs/pitfalls.md).
    A preview rule: unseen code kept showing new shapes whose ranks the text cannot tell
    apart (0 true, 6 false in its first findings)."""
    for d in divergences(info):
        if d.code == "DDP005" and d.leader is None:  # the certain form is DDP034's
            yield At(d.line), "DDP005", d.message


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.distributed as dist


def share(rank, t):
    if rank == 0:
        dist.broadcast(t, 0)  # the other ranks all-reduce instead
    else:
        dist.all_reduce(t)
"""

RULE = ddp005
