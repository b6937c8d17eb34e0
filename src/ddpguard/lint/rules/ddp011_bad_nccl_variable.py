"""DDP011 a non-existent NCCL variable.

`NCCL_TIMEOUT`: no such variable; neither NCCL nor torch reads it, so the timeout the script
believes it set is the default. A string that is the variable (`os.environ["NCCL_TIMEOUT"]`) or
sets it (`"NCCL_TIMEOUT=600 python ..."`), not prose that names it (a `--help` text). Pitfall in
[pitfalls.md](pitfalls.md). Fix: `init_process_group(timeout=timedelta(...))`.
"""

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


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
os.environ["NCCL_TIMEOUT"] = "1800"  # no such variable
"""

RULE = ddp011
