"""DDP041 an evaluation over a DistributedSampler shard whose metric is never combined
(fixture: tests/lint/fixtures/DDP041_unreduced_eval_metric.py). Here: the loader handed in
from another file, as corpus35t's motion_forecasting does (`val()` in train.py, its
DistributedSampler and the call in train_ddp.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import lint_paths

from ddpguard.lint import RULES, Selection

ONLY = Selection(select=("DDP041",))

EVAL = """\
import torch


def val(cfg, data_loader, net):
    total = 0.0
    loop = enumerate(data_loader)
    with torch.no_grad():
        for i, batch in loop:
            total += net(batch).sum().item()
    print("val", total)
    return total
"""

ENTRY = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from train import val


def main(cfg, net, val_set):
    dist.init_process_group("gloo")
    net = DDP(net)
    val_sampler = DistributedSampler(val_set)
    val_loader = DataLoader(val_set, batch_size=4, sampler=val_sampler)
    for epoch in range(3):
        val(cfg, val_loader, net){extra}
"""


def _project(tmp_path: Path, extra: str = "", own_val: bool = False) -> list[Path]:
    entry = ENTRY.format(extra=extra)
    if own_val:  # the entry defines its own `val`: train.py's is not the one it calls
        entry = entry.replace("from train import val\n", "import train\n") + (
            "\n\ndef val(cfg, loader, net):\n    return 0\n")
    (tmp_path / "train.py").write_text(textwrap.dedent(EVAL))
    (tmp_path / "train_ddp.py").write_text(textwrap.dedent(entry))
    return [tmp_path]


def test_a_loader_handed_in_from_another_file(tmp_path: Path) -> None:
    [f] = lint_paths(_project(tmp_path), ONLY)
    assert f.path.endswith("train.py") and f.line == 8
    assert "(DistributedSampler, train_ddp.py:11, handed in as `data_loader` by the call " \
           "at train_ddp.py:14)" in f.message
    assert "nothing in val() or in what calls it all-reduces or gathers" in f.message


def test_a_caller_that_reduces_what_it_returns(tmp_path: Path) -> None:
    extra = "\n        dist.all_reduce(torch.zeros(1))"
    assert lint_paths(_project(tmp_path, extra), ONLY) == []


def test_a_script_body_that_reduces_what_it_returns(tmp_path: Path) -> None:
    # spent corpus, RocWeather: train_ddp.py calls validation_ddp() in its module body and
    # then dist.reduce()s the three metrics to rank 0.
    (tmp_path / "train.py").write_text(textwrap.dedent(EVAL))
    (tmp_path / "train_ddp.py").write_text(
        "import torch.distributed as dist\n"
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        "from train import val\n"
        "dist.init_process_group('gloo')\n"
        "val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set))\n"
        "loss = val(cfg, val_loader, net)\n"
        "dist.reduce(loss, 0, op=dist.ReduceOp.AVG)\n")
    assert lint_paths([tmp_path], ONLY) == []
    text = (tmp_path / "train_ddp.py").read_text()
    (tmp_path / "train_ddp.py").write_text(text.replace("dist.reduce(", "print("))
    [f] = lint_paths([tmp_path], ONLY)
    assert f.code == "DDP041"


def test_a_call_of_another_function_of_that_name_hands_nothing_in(tmp_path: Path) -> None:
    assert lint_paths(_project(tmp_path, own_val=True), ONLY) == []


def test_on_by_default() -> None:
    assert RULES["DDP041"].default and not RULES["DDP041"].preview
