"""An early stop on the rank's own running sum of its training loss, where the loader comes
from another file of the project: the message says what was assumed (the program's
DistributedSampler); silent where the program builds none."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import lint_paths

DATA = """\
import torch
from torch.utils.data import DataLoader, DistributedSampler


def loaders(dataset, train):
    sampler = DistributedSampler(dataset) if train else None
    return {"train": DataLoader(dataset, sampler=sampler)}
"""

MAIN = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from data import loaders


def main(epochs, patience):
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dataset = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    train_loader = loaders(dataset, True)["train"]
    best = float("inf")
    for epoch in range(epochs):
        train_loader.sampler.set_epoch(epoch)
        running = 0.0
        for x, y in train_loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            running += loss.item()
            loss.backward()
            opt.step()
        if running < best:
            best, patience = running, 3
        else:
            patience -= 1
        if patience <= 0:
            break
    val_loader = loaders(dataset, False)["train"]
    for epoch in range(epochs):
        for x, y in train_loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        val_sum = 0.0
        with torch.no_grad():
            for x, y in val_loader:
                val_loss = torch.nn.functional.mse_loss(model(x), y)
                val_sum += val_loss.item()
        if val_sum < 0.1:
            break  # every rank evaluated the whole unsharded set: the same sum everywhere
    dist.destroy_process_group()
"""


def _project(tmp_path: Path, files: dict[str, str]) -> list[tuple[str, str, int, str]]:
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return [(Path(f.path).name, f.code, f.line, f.message) for f in lint_paths([tmp_path])]


def test_a_running_sum_over_a_loader_of_another_file_assumes_the_programs_sampler(
        tmp_path: Path) -> None:
    found = [f for f in _project(tmp_path, {"data.py": DATA, "main.py": MAIN})
             if f[1] == "DDP004"]
    [(name, _, line, message)] = found
    assert (name, line) == ("main.py", 28)
    assert "`patience`, which follows `running`" in message
    assert "assumed: the loop at line 18 reads the program's DistributedSampler-sharded " \
        "data, data.py:6" in message


def test_a_program_that_shards_nothing_is_silent(tmp_path: Path) -> None:
    data = DATA.replace("DistributedSampler(dataset) if train else None", "None")
    found = [f for f in _project(tmp_path, {"data.py": data, "main.py": MAIN})
             if f[1] == "DDP004"]
    assert found == []
