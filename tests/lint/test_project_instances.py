"""A rank-0-only early-stop counter kept in another file's class (corpus35g T150's shape):
`stop = runner.checkpoint(score)`, the method advancing `self.bad` only on rank 0 and returning
`self.bad >= 7`; the caller's `if stop: break` leaves the epoch loop on rank 0 alone, while
the others go on to the next epoch's forward through the wrapper the class holds. The class
is found through the import that names it, a package's re-export, or (a partial copy without
the package's `__init__.py`) the one module of the folder that defines it."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import lint_paths

TRAINER = """\
import torch


class Trainer:
    def __init__(self, model, rank):
        self.model = model
        self.rank = rank
        self.best = 0.0
        self.bad = 0

    def train(self, loader, opt):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(self.model(x), y).backward()
            opt.step()

    def checkpoint(self, score):
        if self.rank == 0:
            if score > self.best:
                self.best = score
                self.bad = 0
                torch.save(self.model.state_dict(), "best.pt")
            self.bad += 1
        return self.bad >= 7
"""

MAIN = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer import Trainer


def main(loader, epochs):
    rank = int(os.environ["RANK"])
    dist.init_process_group("nccl", rank=rank)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    runner = Trainer(model, rank)
    for epoch in range(epochs):
        runner.train(loader, opt)
        stop = runner.checkpoint(float(epoch))
        if stop:
            break
    dist.destroy_process_group()
"""


def _project(tmp_path: Path, files: dict[str, str]) -> list[tuple[str, str, int, str]]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    return [(Path(f.path).name, f.code, f.line, f.message) for f in lint_paths([tmp_path])
            if f.code == "DDP019"]


def test_a_counter_only_rank_0_advances_in_another_files_method(tmp_path: Path) -> None:
    [(name, _, line, message)] = _project(tmp_path, {"trainer.py": TRAINER, "main.py": MAIN})
    assert (name, line) == ("main.py", 20)
    assert message.startswith("rank 0 can leave at line 20 (break) while ranks > 0 go on to "
                              "a forward of the DDP model `self.model`")
    assert message.endswith("(`stop` is what checkpoint() returns at trainer.py:24, `self.bad "
                            ">= 7`, where `self.bad` is set only where `self.rank == 0` (line "
                            "23); the other ranks keep its first value, 0)")


def test_a_counter_every_rank_advances_is_silent(tmp_path: Path) -> None:
    trainer = TRAINER.replace("            self.bad += 1\n", "").replace(
        "        return self.bad >= 7", "        self.bad += 1\n        return self.bad >= 7")
    assert _project(tmp_path, {"trainer.py": trainer, "main.py": MAIN}) == []


def test_a_package_re_export_and_a_rank_below_one(tmp_path: Path) -> None:
    # `if self.rank < 1:` holds on rank 0 (and a single process's -1) only
    trainer = TRAINER.replace("if self.rank == 0:", "if self.rank < 1:")
    main = MAIN.replace("from trainer import Trainer", "from utils import Trainer")
    files = {"utils/trainer.py": trainer, "utils/__init__.py": "from .trainer import Trainer\n",
             "main.py": main}
    [(name, _, line, message)] = _project(tmp_path, files)
    assert (name, line) == ("main.py", 20) and message.startswith("rank 0 can leave")
    # a package whose __init__.py does not bind the name: no such class, silent
    (tmp_path / "utils/__init__.py").write_text("from .trainer import Other\n")
    assert _project(tmp_path, {}) == []


def test_a_partial_copy_without_the_packages_init(tmp_path: Path) -> None:
    main = MAIN.replace("from trainer import Trainer", "from utils import Trainer")
    files = {"utils/trainer.py": TRAINER, "main.py": main}
    [(name, _, line, _)] = _project(tmp_path, files)
    assert (name, line) == ("main.py", 20)
    # two modules of the folder define the class: which one is unknown, silent (the loop's
    # own forward here: the wrapper handed to one of two same-named classes is unknown too)
    main = main.replace("        runner.train(loader, opt)\n", (
        "        for x, y in loader:\n"
        "            torch.nn.functional.mse_loss(model(x), y).backward()\n"))
    found = _project(tmp_path, {"main.py": main})
    assert [(n, line) for n, _, line, _ in found] == [("main.py", 21)]
    every_rank = TRAINER.replace("            self.bad += 1\n", "").replace(
        "        return self.bad >= 7", "        self.bad += 1\n        return self.bad >= 7")
    (tmp_path / "utils/trainer2.py").write_text(textwrap.dedent(every_rank))
    assert _project(tmp_path, {}) == []
