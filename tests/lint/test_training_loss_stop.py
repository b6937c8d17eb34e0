"""DDP004: an early stop on the average a training function returns of this rank's own loss
(ECG-Bench's shape, corpus35o B161/B210: `train()` sums `loss.item()` over its shard and
returns the average; a checkpoint manager fed it decides the stop on each rank alone)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import lint_paths

TRAINER = """\
import torch.distributed as dist


def train(model, loader, opt, epoch):
    loader.sampler.set_epoch(epoch)
    total_loss, steps = 0.0, 0
    for x, y in loader:
        opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        total_loss += loss.item()
        steps += 1
        loss.backward()
        opt.step()
        if dev_break(loss.item()):
            break
    average = total_loss / steps if steps else float("inf")
    return {"average_loss": average, "steps": steps}


def dev_break(value):
    flag = [value < 0]
    dist.broadcast_object_list(flag, src=0)
    return flag[0]
"""

MAIN = """\
import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from runners.trainer import train


class Manager:
    def __init__(self, patience):
        self.losses, self.patience = [], patience

    def save_epoch(self, loss):
        self.losses.append(loss)
        return loss <= min(self.losses)

    def stop_early(self):
        best = self.losses.index(min(self.losses))
        return len(self.losses) - 1 - best >= self.patience


def main(data, net, epochs):
    dist.init_process_group("gloo")
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = Manager(3)
    for epoch in range(epochs):
        result = train(model, loader, opt, epoch)
        if manager.save_epoch(result["average_loss"]):
            torch.save(model.module.state_dict(), "best.pt")
        if manager.stop_early():
            break
    dist.destroy_process_group()
"""


def _stops(tmp_path: Path, main: str = MAIN, trainer: str = TRAINER) -> list[int]:
    files = {"runners/__init__.py": "", "runners/trainer.py": trainer, "main.py": main}
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return [f.line for f in lint_paths([tmp_path]) if f.code == "DDP004"]


def test_a_stop_on_the_average_a_training_function_returns_is_this_ranks_own(
        tmp_path: Path) -> None:
    # the manager is fed in an `if` test and asked in the next one; `dev_break` broadcasts
    # only its flag, whose value is tested: the loss it was given stays this rank's own
    assert _stops(tmp_path) == [32]
    # fed in an assignment
    assert _stops(tmp_path, main=MAIN.replace(
        '        if manager.save_epoch(result["average_loss"]):\n',
        '        improved = manager.save_epoch(result["average_loss"])\n        if improved:\n'
    )) == [33]


def test_an_average_all_reduced_before_the_return_is_shared(tmp_path: Path) -> None:
    shared = TRAINER.replace(
        '    average = total_loss / steps if steps else float("inf")\n',
        '    average = total_loss / steps if steps else float("inf")\n'
        "    t = torch.tensor(average)\n    dist.all_reduce(t)\n    average = t.item() / 2\n"
    ).replace("import torch.distributed as dist", "import torch\nimport torch.distributed as dist")
    assert _stops(tmp_path, trainer=shared) == []


def test_a_function_that_returns_no_sum_of_its_loss_decides_nothing(tmp_path: Path) -> None:
    assert _stops(tmp_path, trainer=TRAINER.replace(
        '"average_loss": average', '"average_loss": epoch')) == []


def test_a_builtin_or_a_module_given_the_value_holds_no_state_of_the_loop(
        tmp_path: Path) -> None:
    # `len(result)` and `np.mean(...)` feed no object: tests that read `len` or `np` alone
    # (not the result) decide the same on every rank
    quiet = MAIN.replace(
        "        if manager.stop_early():\n            break\n",
        "        n, avg = len(result), np.mean(result[\"average_loss\"])\n"
        "        if len(data) < epoch or np.isnan(opt.param_groups[0][\"lr\"]):\n"
        "            break\n")
    assert _stops(tmp_path, main=quiet) == []
