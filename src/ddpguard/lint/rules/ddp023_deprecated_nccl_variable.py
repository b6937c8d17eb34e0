"""DDP023 a deprecated NCCL variable.

`NCCL_BLOCKING_WAIT`, `NCCL_ASYNC_ERROR_HANDLING`: renamed `TORCH_NCCL_*`; torch 2.13 still
reads the old names and warns. Off by default: a rename, not a bug (reviewers called 3 of 4 such
findings debatable). `--extend-select DDP023`. Fix: the `TORCH_NCCL_` names.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.context import (
    ModuleInfo,
)
from ..analysis.nccl import NCCL_FIX, nccl_settings
from ..registry import Hit, rule


@rule('DDP023', 'deprecated-nccl-variable', 'info',
      'a deprecated NCCL variable that torch still reads (NCCL_BLOCKING_WAIT, '
      'NCCL_ASYNC_ERROR_HANDLING)',
      'use TORCH_NCCL_BLOCKING_WAIT / TORCH_NCCL_ASYNC_ERROR_HANDLING', default=False)
def ddp023(info: ModuleInfo) -> Iterator[Hit]:
    """Off by default: torch 2.13 still reads the old names and
    only warns (reviewers called 3 of 4 such findings debatable); a rename, not a bug."""
    for node, name in nccl_settings(info):
        if name != "TIMEOUT":
            yield node, "DDP023", f"NCCL_{name} {NCCL_FIX[name]}"


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
os.environ["NCCL_ASYNC_ERROR_HANDLING"] = "1"
"""

RULE = ddp023
