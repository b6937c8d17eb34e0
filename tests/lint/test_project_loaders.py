"""Loaders a helper of another file builds with a DistributedSampler, followed into the loop
that iterates them (DDP001's set_epoch question asked of the program, not the file)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import lint_paths

LOADERS = """\
from torch.utils.data import DataLoader, DistributedSampler


def load_data(ds, shuffle=True):
    sampler = DistributedSampler(ds, shuffle=shuffle)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    return loader
"""

TRAIN_LOOP = """\
import torch.distributed as dist
from data.loaders import load_data


def main(model, ds, epochs):
    dist.init_process_group("nccl")
    dataset = load_data(ds)
    for epoch in range(epochs):
        for batch in dataset:
            model(batch).sum().backward()
"""


def _set_epoch_project(tmp_path: Path, train: str, loaders: str = LOADERS) -> list[int]:
    files = {"data/__init__.py": "", "data/loaders.py": loaders, "train.py": train}
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return [f.line for f in lint_paths([tmp_path]) if f.code == "DDP001"]


def test_a_loader_a_helper_of_another_file_builds_is_followed_for_set_epoch(
        tmp_path: Path) -> None:
    # DeepFashion_Try_On's shape (corpus35l): `dataset = data_loader.load_data()`, the
    # DistributedSampler built in another file, no set_epoch anywhere
    assert _set_epoch_project(tmp_path, TRAIN_LOOP) == [8]
    # a set_epoch anywhere in the program, a sampler that never shuffles, an evaluation loader
    advanced = TRAIN_LOOP.replace("        for batch in dataset:",
                                  "        dataset.sampler.set_epoch(epoch)\n"
                                  "        for batch in dataset:")
    assert _set_epoch_project(tmp_path, advanced) == []
    assert _set_epoch_project(tmp_path, TRAIN_LOOP,
                              LOADERS.replace("shuffle=shuffle", "shuffle=False")) == []
    assert _set_epoch_project(tmp_path, TRAIN_LOOP.replace("dataset", "val_set")) == []
