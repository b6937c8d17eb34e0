"""NCCL environment variables spelled in a file: the names torch renamed (DDP023) and the one
that never existed (DDP011)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from .context import ModuleInfo

BAD_NCCL = re.compile(r"(?<![A-Z_])NCCL_(BLOCKING_WAIT|ASYNC_ERROR_HANDLING|TIMEOUT)\b")
NCCL_FIX = {
    "BLOCKING_WAIT": "is deprecated (torch still reads it and warns): use "
                     "TORCH_NCCL_BLOCKING_WAIT",
    "ASYNC_ERROR_HANDLING": "is deprecated (torch still reads it and warns): use "
                            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TIMEOUT": "does not exist (neither NCCL nor torch reads it): pass "
               "init_process_group(timeout=timedelta(...))",
}


def nccl_settings(info: ModuleInfo) -> Iterator[tuple[ast.Constant, str]]:
    """Each string that sets one of those variables, with the name after `NCCL_`."""
    for node in info.nccl_strings:
        text = str(node.value)
        m = BAD_NCCL.search(text)
        # The variable itself (`os.environ["NCCL_BLOCKING_WAIT"]`) or set in a command
        # (`NCCL_BLOCKING_WAIT=1 python ...`); not prose that names it (a --help text).
        if m and (text.strip() == m.group(0) or text[m.end():m.end() + 1] == "="):
            yield node, m.group(1)
