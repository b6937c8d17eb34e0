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


FACTORY = """\
from torch.utils.data import DataLoader, DistributedSampler


def data_provider(args, flag):
    data_set = make_set(args, flag)
    sampler = DistributedSampler(data_set, shuffle=flag == "train")
    data_loader = DataLoader(data_set, batch_size=8, sampler=sampler)
    return data_set, data_loader
"""

EXP = """\
import numpy as np
import torch
import torch.distributed as dist
from data.factory import data_provider


class EarlyStopping:
    def __init__(self, patience):
        self.patience, self.counter, self.best, self.early_stop = patience, 0, None, False

    def __call__(self, val_loss):
        if self.best is None or val_loss < self.best:
            self.best, self.counter = val_loss, 0
        else:
            self.counter += 1
            self.early_stop = self.counter >= self.patience


class Exp:
    def _get_data(self, flag):
        data_set, data_loader = data_provider(self.args, flag)
        return data_set, data_loader

    def vali(self, vali_data, vali_loader):
        self.model.eval()
        total = []
        with torch.no_grad():
            for x, y in vali_loader:
                total.append((self.model(x) - y).pow(2).mean().item())
        loss = torch.tensor(np.average(total))
        dist.reduce(loss, dst=0)
        return loss.item() / dist.get_world_size()

    def train(self, epochs):
        train_data, train_loader = self._get_data(flag="train")
        vali_data, vali_loader = self._get_data(flag="val")
        early_stopping = EarlyStopping(3)
        for epoch in range(epochs):
            train_loader.sampler.set_epoch(epoch)
            for x, y in train_loader:
                (self.model(x) - y).pow(2).mean().backward()
                self.opt.step()
            vali_loss = self.vali(vali_data, vali_loader)
            early_stopping(vali_loss)
            if early_stopping.early_stop:
                break
"""


def _stops(tmp_path: Path, exp: str) -> list[int]:
    files = {"data/__init__.py": "", "data/factory.py": FACTORY, "exp.py": exp}
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return [f.line for f in lint_paths([tmp_path]) if f.code == "DDP004"]


def test_an_early_stop_on_a_loss_reduced_to_rank_zero_through_a_data_factory(
        tmp_path: Path) -> None:
    # OpenLTM's shape (corpus35o B101/B215, likely): the validation loader comes from
    # `self._get_data(flag="val")`, which unpacks `data_provider(...)`'s tuple; the loss is
    # reduced to rank 0 alone, and every rank feeds its own copy to the early stopper
    assert _stops(tmp_path, EXP) == [45]
    # an all_reduce hands every rank the same loss: no finding
    assert _stops(tmp_path, EXP.replace("dist.reduce(loss, dst=0)", "dist.all_reduce(loss)")) == []
