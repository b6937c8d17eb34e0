"""Two entry scripts of one folder that each define and call their own functions of the same
names (so-vits-svc's train.py and train_diff.py, corpus35o B140): a plain name calls the
file's own definition, so each script's DDP wrapper is followed into its own helpers."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import lint_paths

SCRIPT = """\
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def run(data, val):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        train_and_evaluate(rank, model, opt, data, val)


def train_and_evaluate(rank, model, opt, data, val):
    for x in data:
        model(x).sum().backward()
        opt.step()
    if rank == 0:
        evaluate(model, val)


def evaluate(model, val):
    with torch.no_grad():
        for x in val:
            model(x)
"""


def _forwards(tmp_path: Path, names: list[str]) -> list[tuple[str, int]]:
    for name in names:
        (tmp_path / name).write_text(textwrap.dedent(SCRIPT))
    return sorted((Path(f.path).name, f.line) for f in lint_paths([tmp_path])
                  if f.code == "DDP006")


def test_each_script_follows_its_own_helpers_wrapper(tmp_path: Path) -> None:
    assert _forwards(tmp_path, ["train.py"]) == [("train.py", 22)]


def test_a_second_script_defining_the_same_names_hides_nothing(tmp_path: Path) -> None:
    assert _forwards(tmp_path, ["train.py", "train_diff.py"]) == [
        ("train.py", 22), ("train_diff.py", 22)]
