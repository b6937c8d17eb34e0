"""DDP011 bad-nccl-variable."""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.context import (
    ModuleInfo,
)
from ..analysis.nccl import NCCL_FIX, nccl_settings
from ..registry import Hit, rule


@rule('DDP011', 'bad-nccl-variable', 'warning',
      'an NCCL variable that does not exist (NCCL_TIMEOUT: neither NCCL nor torch reads it)',
      'timeouts go in init_process_group(timeout=...)')
def ddp011(info: ModuleInfo) -> Iterator[Hit]:
    for node, name in nccl_settings(info):
        if name == "TIMEOUT":
            yield node, "DDP011", f"NCCL_TIMEOUT {NCCL_FIX[name]}"


RULE = ddp011
