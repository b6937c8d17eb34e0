"""DDP018 unguarded print.

`print` on every rank in a distributed script (prints that mention the rank are fine). Pitfall
in [pitfalls.md](pitfalls.md). Enable with `--extend-select DDP018`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import (
    ModuleInfo,
)
from ..registry import Hit, rule


@rule('DDP018', 'unguarded-print', 'info',
      'print on every rank',
      'guard with `if rank == 0:` or include the rank in the message', default=False)
def ddp018(info: ModuleInfo) -> Iterator[Hit]:
    if not info.distributed:
        return
    for rec in info.calls:
        if rec.qual != "print" or info.effective_guard(rec):
            continue
        mentions_rank = any(
            info.rank_level(n) for a in rec.node.args for n in ast.walk(a)
            if isinstance(n, ast.Name | ast.Attribute | ast.Call | ast.Subscript))
        if not mentions_rank:
            yield rec.node, "DDP018", "print runs on every rank (duplicated output)"


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
dist.init_process_group("nccl")
print("loss", loss)  # once per rank
"""

RULE = ddp018
