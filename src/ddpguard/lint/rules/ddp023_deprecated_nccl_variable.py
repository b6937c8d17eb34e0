"""DDP023 deprecated-nccl-variable."""

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
    """Off by default since issue 20's sixth round: torch 2.13 still reads the old names and
    only warns (reviewers called 3 of 4 such findings debatable); a rename, not a bug."""
    for node, name in nccl_settings(info):
        if name != "TIMEOUT":
            yield node, "DDP023", f"NCCL_{name} {NCCL_FIX[name]}"


RULE = ddp023
