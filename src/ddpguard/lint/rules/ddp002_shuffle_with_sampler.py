"""DDP002 shuffle=True with a sampler.

`DataLoader(..., sampler=..., shuffle=True)`: torch raises ValueError (mutually exclusive).
Pitfall in [pitfalls.md](pitfalls.md). Fix: drop `shuffle`; the sampler shuffles.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..analysis.context import (
    ModuleInfo,
    is_true,
    kwarg,
)
from ..registry import Hit, rule


@rule('DDP002', 'shuffle-with-sampler', 'error',
      'DataLoader gets a sampler and shuffle=True (mutually exclusive)',
      'drop shuffle=True; shuffle in the sampler instead')
def ddp002(info: ModuleInfo) -> Iterator[Hit]:
    for rec in info.calls:
        if rec.last != "DataLoader":
            continue
        call = rec.node
        which = [k.arg for k in call.keywords if k.arg in ("sampler", "batch_sampler")
                 and not (isinstance(k.value, ast.Constant) and k.value.value is None)]
        if which and is_true(kwarg(call, "shuffle")):
            yield call, "DDP002", (f"DataLoader gets {which[0]}= and shuffle=True: "
                                   "torch raises ValueError (they are mutually exclusive)")


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
loader = DataLoader(dataset, sampler=DistributedSampler(dataset), shuffle=True)
"""

RULE = ddp002
