"""DDP012 no destroy_process_group.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

import pytest
from helpers import (
    snippet_codes,
)


@pytest.mark.parametrize("args", ["world_size=1, rank=0", "store=dist.HashStore()"])
def test_one_process_group_needs_no_destroy(args: str) -> None:
    src = f'dist.init_process_group({args})\nif __name__ == "__main__":\n    pass\n'
    assert snippet_codes(src) == []
    assert snippet_codes(src.replace(args, "'nccl'")) == ["DDP012"]
