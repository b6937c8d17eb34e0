"""DDP012 no destroy_process_group.

A training script (a DDP wrap or a `__main__` block) that initializes a process group and never
destroys it: torch 2.4+ warns on every rank at exit, and a rank that exits first can leave a
peer blocked. Helper modules (`init_distributed_mode()`) are left to their caller. A one-process
group (`world_size=1`, a `HashStore`) and a connectivity-test worker (`_test_nccl_worker`) are
not reported. Pitfall in [pitfalls.md](pitfalls.md). Fix: `dist.destroy_process_group()` in a
`finally`. Off by default: an independent reviewer judged 0 of 13 findings on unseen code worth
acting on (11 debatable: hygiene, a warning at exit in scripts where no rank can leave early; 2
false). `--extend-select DDP012`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import (
    CallRec,
    ModuleInfo,
    dotted,
    kwarg,
)
from ..registry import Hit, rule


@rule('DDP012', 'missing-destroy', 'warning',
      'a training script initializes a process group and never destroys it',
      'call dist.destroy_process_group() on the way out (try/finally)', default=False)
def ddp012(info: ModuleInfo) -> Iterator[Hit]:
    """Off by default: a reviewer of real scripts judged 0 of 13 first-contact findings worth
    acting on (hygiene, a warning at exit; no rank of those scripts can leave early)."""
    # A helper module's `init_distributed_mode()` cannot tear down what its caller still
    # uses; the finding belongs in the script (a DDP wrap or a `__main__` block).
    if not (info.has_main or info.wraps_ddp):
        return
    # A one-process group (`world_size=1`, a HashStore, accelerate's single-GPU fallback) and
    # a connectivity test worker (`_test_nccl_worker`) exit without peers to leave waiting.
    inits = [r for r in info.calls if r.last == "init_process_group" and not _solo(r)
             and not (r.func is not None and "test" in r.func.name.lower())]
    if inits and not any(r.last in ("destroy_process_group", "shutdown") for r in info.calls):
        yield inits[0].node, "DDP012", (
            "the process group is never destroyed: torch (2.4+) warns at exit that pending "
            "NCCL work may not have finished, and a rank that exits first can leave a peer "
            "blocked in a collective")


def _solo(rec: CallRec) -> bool:
    ws = kwarg(rec.node, "world_size")
    store = kwarg(rec.node, "store")
    return (isinstance(ws, ast.Constant) and ws.value == 1) or (
        isinstance(store, ast.Call) and (dotted(store.func) or "").endswith("HashStore"))


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
dist.init_process_group("nccl")
if __name__ == "__main__":
    train()  # never destroy_process_group()
"""

RULE = ddp012
