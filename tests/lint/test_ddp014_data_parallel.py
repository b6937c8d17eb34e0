"""DDP014 nn.DataParallel.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from helpers import (
    ALL_BUT_PRINT,
    lint_with_defaults,
)

from ddpguard.lint import RULES


def test_paddle_data_parallel_is_not_torchs() -> None:
    src = "import paddle\nmodel = paddle.DataParallel(net)\n"
    assert [f.code for f in lint_with_defaults(src, "t.py", ALL_BUT_PRINT)] == []
    src = "import torch\nmodel = torch.nn.DataParallel(net)\n"
    assert [f.code for f in lint_with_defaults(src, "t.py", ALL_BUT_PRINT)] == ["DDP014"]


def test_data_parallel_rule_is_off_by_default() -> None:
    # 0 true in 8 findings on real code; a strategy, not a bug.
    assert RULES["DDP014"].default is False
    src = "import torch\nmodel = torch.nn.DataParallel(net)\n"
    assert [f.code for f in lint_with_defaults(src, "t.py")] == []
