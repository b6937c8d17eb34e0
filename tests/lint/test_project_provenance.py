"""The rank's kind followed from the launcher variable through the project's own calls and
files: a parameter is what every caller in the files given passes."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import lint_paths

SETUP = """\
import os

import torch
from torch.distributed import init_process_group


def ddp_setup(rank, world_size, master_addr="localhost"):
    os.environ["MASTER_ADDR"] = master_addr
    init_process_group(backend="nccl", rank=rank, world_size=world_size)
"""

MAIN = """\
import os

from utils import ddp_setup

LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))
RANK = int(os.getenv("RANK", -1))
WORLD_SIZE = int(os.getenv("WORLD_SIZE", 1))


def main(local_rank, world_size):
    ddp_setup(local_rank, world_size)


if __name__ == "__main__":
    main(LOCAL_RANK, WORLD_SIZE)
"""


def _project(tmp_path: Path, files: dict[str, str]) -> list[tuple[str, str, int, str]]:
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return [(Path(f.path).name, f.code, f.line, f.message) for f in lint_paths([tmp_path])]


def test_the_local_rank_passed_through_two_calls_is_the_groups_rank(tmp_path: Path) -> None:
    [(name, code, line, message)] = _project(tmp_path, {"utils.py": SETUP, "main.py": MAIN})
    assert (name, code, line) == ("utils.py", "DDP046", 9)
    assert "LOCAL_RANK" in message and "main() at main.py:15" in message \
        and "ddp_setup() at main.py:11" in message
    # the file that imports the set-up shows a second node: DDP025, naming that evidence
    nodes = MAIN.replace('WORLD_SIZE = int(os.getenv("WORLD_SIZE", 1))\n',
                         'WORLD_SIZE = int(os.getenv("WORLD_SIZE", 1)); '
                         'NODE = os.getenv("NODE_RANK")\n')
    [(name, code, line, message)] = _project(tmp_path, {"utils.py": SETUP, "main.py": nodes})
    assert (name, code, line) == ("utils.py", "DDP025", 9)
    assert "it reads `NODE_RANK` at main.py:7" in message


def test_the_global_rank_passed_through_the_same_calls_is_silent(tmp_path: Path) -> None:
    main = MAIN.replace("main(LOCAL_RANK, WORLD_SIZE)", "main(RANK, WORLD_SIZE)")
    assert _project(tmp_path, {"utils.py": SETUP, "main.py": main}) == []
    # the same global rank picking the device is the other spelling of the mix-up
    setup = SETUP.replace("    init_process_group",
                          "    torch.cuda.set_device(rank)\n    init_process_group")
    [(name, code, line, message)] = _project(tmp_path, {"utils.py": setup, "main.py": main})
    assert (name, code, line) == ("utils.py", "DDP046", 9) and "device index" in message


def test_mp_spawns_index_tells_nothing_and_the_call_in_sight_answers(tmp_path: Path) -> None:
    # mp.spawn passes its index (both ranks on one node) to the first parameter: the call in
    # sight, on the launcher's path, still passes the local rank
    main = MAIN + ("    import torch.multiprocessing as mp\n"
                   "    mp.spawn(main, args=(2,), nprocs=2)\n")
    [(name, code, line, message)] = _project(tmp_path, {"utils.py": SETUP, "main.py": main})
    assert (name, code, line) == ("utils.py", "DDP046", 9) and "main() at main.py:15" in message
    # with the spawn alone, nothing in sight says which rank it is
    spawned = main.replace("    main(LOCAL_RANK, WORLD_SIZE)\n", "")
    assert _project(tmp_path, {"utils.py": SETUP, "main.py": spawned}) == []


def test_one_caller_passing_another_kind_leaves_the_parameter_unknown(tmp_path: Path) -> None:
    main = MAIN + "    main(int(os.environ['RANK']), WORLD_SIZE)\n"
    assert _project(tmp_path, {"utils.py": SETUP, "main.py": main}) == []


TRAINER = """\
import torch


class Trainer:
    def __init__(self, model, train_data, val_data, patience):
        self.model = model
        self.train_data = train_data
        self.val_data = val_data
        self.patience = patience
        self.bad = 0

    def _run_epoch(self):
        for x, y in self.train_data:
            torch.nn.functional.mse_loss(self.model(x), y).backward()

    def _validate(self):
        self.model.eval()
        total = 0.0
        with torch.no_grad():
            for x, y in self.val_data:
                total += torch.nn.functional.mse_loss(self.model(x), y).item()
        self.model.train()
        return total

    def fit(self, epochs):
        best = float("inf")
        for _ in range(epochs):
            self._run_epoch()
            val_loss = self._validate()
            if val_loss < best:
                best = val_loss
                self.bad = 0
            else:
                self.bad += 1
            if self.bad > self.patience:
                break
"""

FIT = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from trainer import Trainer

dist.init_process_group("nccl")
ds = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
train_loader = DataLoader(ds, sampler=DistributedSampler(ds))
val_loader = DataLoader(ds, sampler=DistributedSampler(ds, shuffle=False))
Trainer(DDP(torch.nn.Linear(2, 1)), train_loader, val_loader, 3).fit(10)
"""


def test_a_stop_on_each_ranks_own_validation_loss_in_another_files_class(
        tmp_path: Path) -> None:
    [(name, code, line, message)] = [
        f for f in _project(tmp_path, {"trainer.py": TRAINER, "main.py": FIT})
        if f[1] == "DDP004"]
    assert (name, line) == ("trainer.py", 35)
    assert "assumed: the data _validate() reads is the validation loader `val_loader`" \
        in message and "main.py:11" in message
    # every rank validates the whole set: the same loss everywhere, the same decision
    fit = FIT.replace("DataLoader(ds, sampler=DistributedSampler(ds, shuffle=False))",
                      "DataLoader(ds)")
    assert [f for f in _project(tmp_path, {"trainer.py": TRAINER, "main.py": fit})
            if f[1] == "DDP004"] == []


TRAINER_CLASS = """\
import os

import torch.distributed as dist


class Trainer:
    def __init__(self):
        self.world = int(os.environ["WORLD_SIZE"])
        self.rank = int(os.environ["LOCAL_RANK"])

    def setup(self):
        dist.init_process_group("nccl", rank=self.rank, world_size=self.world)
"""


def test_an_attribute_the_class_keeps_is_what_its_methods_assign(tmp_path: Path) -> None:
    # ninth round (corpus35g T160/T165): LOCAL_RANK kept in __init__, read in another method
    [(name, code, line, message)] = _project(tmp_path, {"train.py": TRAINER_CLASS})
    assert (name, code, line) == ("train.py", "DDP046", 12) and "LOCAL_RANK" in message
    fixed = TRAINER_CLASS.replace('os.environ["LOCAL_RANK"]', 'os.environ["RANK"]')
    assert _project(tmp_path, {"train.py": fixed}) == []
    # a class that also assigns the global rank to it: its kind is unknown, silent
    both = TRAINER_CLASS + "\n    def resume(self):\n        self.rank = dist.get_rank()\n"
    assert _project(tmp_path, {"train.py": both}) == []


CONFIG_LAUNCH = """\
import torch.distributed as dist

from trainer import Trainer


def main(params):
    dist.init_process_group("nccl")
    params['world_rank'] = dist.get_rank()
    params['verb'] = params['world_rank'] == 0
    Trainer(params).train()
"""

RESUMING_TRAINER = """\
import torch


class Trainer:
    def __init__(self, params):
        self.verb = params['verb']
        self.model, self.loader, self.opt = params['model'], params['loader'], params['opt']
        self.start_epoch = 0
        if params['resuming'] and self.verb:
            self.restore(params['checkpoint'])

    def restore(self, path):
        self.start_epoch = torch.load(path)['epoch']

    def train(self):
        for epoch in range(self.start_epoch, 10):
            for x in self.loader:
                self.model(x).sum().backward()
                self.opt.step()
"""


def test_a_config_key_set_from_the_rank_is_that_flag_in_another_file(tmp_path: Path) -> None:
    # `params['verb'] = rank == 0` in the launcher makes the trainer's `self.verb` rank 0's
    # flag: the resume it guards moves the epoch loop's start on rank 0 alone (DDP027)
    found = _project(tmp_path, {"launch.py": CONFIG_LAUNCH, "trainer.py": RESUMING_TRAINER})
    assert [(n, c, line) for n, c, line, _ in found] == [("trainer.py", "DDP027", 16)]
    assert "self.start_epoch" in found[0][3] and "line 10" in found[0][3]
    # the key read straight from the config in the test
    direct = RESUMING_TRAINER.replace("params['resuming'] and self.verb",
                                      "params['resuming'] and params['verb']")
    assert [(n, c, line) for n, c, line, _ in _project(
        tmp_path, {"launch.py": CONFIG_LAUNCH, "trainer.py": direct})] == [
        ("trainer.py", "DDP027", 16)]
    # the same key set from something else is no rank test
    other = CONFIG_LAUNCH.replace("params['world_rank'] == 0", "params['debug']")
    assert _project(tmp_path, {"launch.py": other, "trainer.py": RESUMING_TRAINER}) == []


KEPT_TRAINER = """\
import os

import torch.distributed as dist


class Trainer:
    def __init__(self, model, device):
        self.model = model
        self.device = device

    def train(self, loader, out):
        if self.device == 0:
            if not os.path.exists(out):
                os.makedirs(out)
        for x in loader:
            self.model(x).sum().backward()
            dist.barrier()
"""

KEPT_MAIN = """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer import Trainer


def main(net, loader, out, gpu):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    Trainer(DDP(net), device=rank).train(loader, out)
"""


def test_a_rank_kept_by_a_constructor_guards_the_classs_own_tests(tmp_path: Path) -> None:
    # `Trainer(..., device=rank)` then `self.device = device`: `if self.device == 0:` is rank
    # 0's arm, so its folder is made once (no DDP030 race)
    found = _project(tmp_path, {"trainer.py": KEPT_TRAINER, "main.py": KEPT_MAIN})
    assert [c for _, c, _, _ in found if c == "DDP030"] == []
    # a device every process shares is no rank: every process makes the folder
    other = KEPT_MAIN.replace("device=rank", "device=0")
    assert [(n, c, line) for n, c, line, _ in _project(
        tmp_path, {"trainer.py": KEPT_TRAINER, "main.py": other}) if c == "DDP030"] == [
        ("trainer.py", "DDP030", 14)]
