"""DDP028 nn.DataParallel over one device in a process-per-device program (its fixture is
tests/lint/fixtures/DDP028_data_parallel_per_process.py)."""

from __future__ import annotations

from helpers import lint_with_defaults

from ddpguard.lint import RULES, Selection


def test_a_script_of_one_process_may_use_one_device() -> None:
    # No torch.distributed anywhere: DataParallel over one GPU is pointless, not a desync.
    src = "import torch\nmodel = torch.nn.DataParallel(net.cuda(0), device_ids=[0])\n"
    assert lint_with_defaults(src, "t.py", Selection(select=("DDP028",))) == []
    src = "import torch.distributed as dist\n" + src + "dist.barrier()\n"
    assert [f.code for f in lint_with_defaults(src, "t.py", Selection(extend_select=("DDP028",)))
            ] == ["DDP028"]


def test_in_preview() -> None:
    # Its first finding on unseen code (corpus37a) was false: DataParallel in the `else` of
    # `if cfg.DISTRIBUTED:`, the one-process run (silent since).
    assert RULES["DDP028"].preview
