"""A checkout linted as one project: calls, attributes and re-exports resolved through the
other files given (`import a.b` then `a.b.f()`, a project's own name for torch's DDP class)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from helpers import lint_paths

from ddpguard.lint.analysis.context import ModuleInfo
from ddpguard.lint.analysis.crossfile import rank_function_seeds
from ddpguard.lint.analysis.provenance import GLOBAL
from ddpguard.lint.analysis.walker import build

DIST_UTIL = """\
import torch.distributed as dist


def sync_params(params):
    for p in params:
        dist.broadcast(p, 0)


def log_params(params):
    print(len(list(params)))


def is_master():
    return dist.get_rank() == 0
"""

TRAIN = """\
import pkg.dist_util


def main(model, loader, opt):
    for x in loader:
        model(x).sum().backward()
        opt.step()
    if pkg.dist_util.is_master():
        pkg.dist_util.sync_params(model.parameters())
"""


def _project(tmp_path: Path, files: dict[str, str]) -> list[tuple[str, str, int]]:
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return [(Path(f.path).name, f.code, f.line) for f in lint_paths([tmp_path])]


def test_import_of_a_dotted_module_resolves_its_functions(tmp_path: Path) -> None:
    # `import pkg.dist_util` binds `pkg`: the helper's broadcast is reached on rank 0 alone
    files = {"pkg/__init__.py": "", "pkg/dist_util.py": DIST_UTIL, "train.py": TRAIN}
    assert _project(tmp_path, files) == [("train.py", "DDP005", 9)]
    # the same call of a helper that makes no collective is no divergence
    files["train.py"] = TRAIN.replace("sync_params(", "log_params(")
    assert _project(tmp_path, files) == []


EXT_DIST = """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

DDP = DistributedDataParallel


def init(rank, world):
    dist.init_process_group("nccl", rank=rank, world_size=world)
"""

OWN_DDP = """\
import torch


class DDP(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
"""

WRAP = """\
import ext_dist


def main(model, loader, opt, rank):
    ext_dist.init(rank, 2)
    model = ext_dist.DDP(model)
    for x in loader:
        model(x).sum().backward()
        opt.step()
    if rank == 0:
        model(x)
"""


def test_a_projects_own_name_for_torchs_ddp_class_wraps(tmp_path: Path) -> None:
    # `ext_dist.DDP` is torch's class under the project's name: the forward on rank 0 alone
    # is a DDP forward (DDP037: no buffer is visible in these files; DDP006 where one is)
    files = {"ext_dist.py": EXT_DIST, "own.py": OWN_DDP, "train.py": WRAP}
    assert _project(tmp_path, files) == [("train.py", "DDP037", 11)]
    # imported by name, and defined in the training module itself
    files["train.py"] = WRAP.replace("import ext_dist\n", "import ext_dist\nfrom ext_dist "
                                     "import DDP\n").replace("ext_dist.DDP(", "DDP(")
    assert _project(tmp_path, files) == [("train.py", "DDP037", 12)]
    files["train.py"] = EXT_DIST + "\n\n" + WRAP.replace("import ext_dist\n", "").replace(
        "ext_dist.", "")
    assert [c for _, c, _ in _project(tmp_path, files)] == ["DDP037"]
    # a project class of that name, in another module, is not torch's wrapper
    files["train.py"] = WRAP.replace("import ext_dist\n", "import ext_dist\nimport own\n") \
        .replace("ext_dist.DDP(", "own.DDP(")
    assert _project(tmp_path, files) == []


COMM = """\
import torch.distributed as dist


def main_proc():
    return dist.get_rank() == 0


def synchronize():
    dist.barrier()
"""

LEAD = """\
import comm
from comm import main_proc
from torch.nn.parallel import DistributedDataParallel as DDP


def main(model, loader, opt):
    model = DDP(model)
    for x in loader:
        model(x).sum().backward()
        opt.step()
    if main_proc():
        model(x)
    if comm.main_proc():
        comm.synchronize()
"""


def test_a_projects_own_rank_predicate_is_read_where_it_is_defined(tmp_path: Path) -> None:
    # `main_proc` says nothing by its name; comm.py defines it from the rank
    files = {"comm.py": COMM, "train.py": LEAD}
    assert _project(tmp_path, files) == [("train.py", "DDP037", 12), ("train.py", "DDP034", 14)]
    # a function of that name in another module, not the imported one, tests nothing
    files["other.py"] = COMM
    files["comm.py"] = COMM.replace("dist.get_rank() == 0", "True")
    assert _project(tmp_path, files) == []


def test_a_rank_predicate_seeds_only_the_files_that_import_its_module() -> None:
    # the walk of train.py learns `main_proc` only from the module its call names
    def parse(path: str, text: str) -> ModuleInfo:
        return build(ast.parse(textwrap.dedent(text)), path)

    other = parse("proj/other.py", COMM)
    train = parse("proj/train.py", LEAD)
    plain = COMM.replace("dist.get_rank() == 0", "True")
    assert rank_function_seeds([parse("proj/comm.py", plain), other, train]) == {}
    comm = parse("proj/comm.py", COMM)
    assert rank_function_seeds([comm, other, train]) == {id(train): {"main_proc": GLOBAL}}


LAUNCH = """\
import torch.distributed as dist
from trainer import Trainer


def run(opt, device_id):
    dist.init_process_group("nccl", world_size=opt.world_size, rank=opt.gpu_ranks[device_id])
    Trainer(opt, device_id).train()
"""

TRAINER = """\
import torch
import torch.distributed as dist


class Trainer:
    def __init__(self, opt, device_id):
        self.gpu_rank = opt.gpu_ranks[device_id]

    def train(self):
        stats = torch.zeros(2)
        if self.gpu_rank == 0:
            dist.all_reduce(stats)
        return stats
"""


def test_the_rank_passed_to_init_process_group_is_the_rank_where_it_is_assigned(
        tmp_path: Path) -> None:
    # OpenNMT's shape: the launcher forms the group with `rank=opt.gpu_ranks[device_id]`, the
    # trainer keeps the same expression as `self.gpu_rank` and tests it
    files = {"launch.py": LAUNCH, "trainer.py": TRAINER}
    assert _project(tmp_path, files) == [("trainer.py", "DDP034", 12)]
    # another expression (the device's index, not the rank the group was formed with)
    files["trainer.py"] = TRAINER.replace("opt.gpu_ranks[device_id]", "opt.gpu_ids[device_id]")
    assert _project(tmp_path, files) == []


STAR_UTILS = """\
from torch import distributed as dist


def evaluate(model, loader):
    for x in loader:
        dist.all_reduce(model(x))
"""

STAR_TRAIN = """\
import torch
from utils.dist_utils import *


def main(model, loader, rank, patience):
    torch.distributed.init_process_group("nccl")
    bad = 0
    for epoch in range(10):
        evaluate(model, loader)
        if rank == 0:
            bad += 1
            if bad > patience:
                break
        dist.barrier()
"""


def test_a_star_import_of_a_project_module_brings_its_names(tmp_path: Path) -> None:
    # `dist` and `evaluate` come from utils/dist_utils.py through `import *`: rank 0's break
    # leaves the others in the next epoch's collectives (DDP019)
    files = {"utils/__init__.py": "", "utils/dist_utils.py": STAR_UTILS, "train.py": STAR_TRAIN}
    assert ("train.py", "DDP019", 13) in _project(tmp_path, files)
    # each alone: the torch alias (the barrier), the function (its all_reduce)
    files["train.py"] = STAR_TRAIN.replace("        evaluate(model, loader)\n", "")
    assert ("train.py", "DDP019", 12) in _project(tmp_path, files)
    files["train.py"] = STAR_TRAIN.replace("dist.barrier()", "pass")
    assert ("train.py", "DDP019", 13) in _project(tmp_path, files)
    files["train.py"] = STAR_TRAIN
    # a star import of a module that is not one of the files names nothing
    files["train.py"] = STAR_TRAIN.replace("utils.dist_utils", "other.dist_utils")
    assert [c for _, c, _ in _project(tmp_path, files) if c == "DDP019"] == []


METER = """\
import torch
import torch.distributed as dist


class MeterDDP:
    def update(self, value):
        t = torch.tensor([value])
        dist.barrier()
        dist.all_reduce(t)
"""

METER_LOOP = """\
import torch.distributed as dist
from utils.meters import MeterDDP


def train(model, loader, optimizer):
    meter = MeterDDP()
    for batch in loader:
        out = model(batch)
        out.sum().backward()
        optimizer.step()
        try:
            if not out.isfinite().all():
                raise ValueError("not finite")
            meter.update(out.mean().item())
        except ValueError:
            print("skipped")
"""


def test_a_swallowed_error_skips_a_method_of_another_files_class(tmp_path: Path) -> None:
    # `meter.update` all-reduces in utils/meters.py: the rank whose output was not finite
    # skips it (DDP004 at the handler)
    files = {"utils/__init__.py": "", "utils/meters.py": METER, "train.py": METER_LOOP}
    assert _project(tmp_path, files) == [("train.py", "DDP004", 15)]
    files["utils/meters.py"] = METER.replace("        dist.barrier()\n        dist.all_reduce(t)\n",
                                             "        print(t)\n")
    assert _project(tmp_path, files) == []


ENGINE = """\
def train_step(model, batch, optimizer):
    loss = model(batch).mean()
    loss.backward()
    optimizer.step()
"""

STEP_LOOP = """\
import torch.distributed as dist
from engine import train_step


def train(model, loader, optimizer):
    dist.init_process_group("nccl")
    for batch in loader:
        if batch is None:
            continue
        train_step(model, batch, optimizer)
"""


def test_a_loop_whose_step_is_another_files_function_steps_together(tmp_path: Path) -> None:
    # the loop's only sync is the backward inside engine.train_step: a rank that skips a
    # batch does one step fewer (DDP004)
    files = {"engine.py": ENGINE, "train.py": STEP_LOOP}
    assert _project(tmp_path, files) == [("train.py", "DDP004", 8)]
    files["engine.py"] = ENGINE.replace("    loss.backward()\n    optimizer.step()\n",
                                        "    print(loss)\n")
    assert _project(tmp_path, files) == []


WRAP_TRAINER = """\
import torch.distributed as dist


class Trainer:
    def __init__(self, model, loader, optimizer):
        self.model = model
        self.loader = loader
        self.optimizer = optimizer

    def epoch(self):
        for x in self.loader:
            loss = self.model(x).mean()
            loss.backward()
            self.optimizer.step()
        return loss.item()

    def train(self, epochs):
        for _ in range(epochs):
            loss = self.epoch()
            if dist.get_rank() == 0 and loss < 0.01:
                break
"""

MAIN_WRAPS = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from engine.trainer import Trainer


def main(loader, optimizer):
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(2, 1))
    Trainer(model, loader, optimizer).train(5)
"""


def test_a_wrapper_handed_to_another_files_class_is_its_ddp_model(tmp_path: Path) -> None:
    # main.py wraps and hands the wrapper to Trainer, which keeps it as `self.model`: rank 0's
    # early-stop `break` leaves the others in the next epoch's forward (DDP019)
    files = {"engine/__init__.py": "", "engine/trainer.py": WRAP_TRAINER, "main.py": MAIN_WRAPS}
    assert _project(tmp_path, files) == [("trainer.py", "DDP019", 21)]
    # the bare model handed over: no DDP forward in the trainer, nothing parts the ranks
    files["main.py"] = MAIN_WRAPS.replace("DDP(torch.nn.Linear(2, 1))",
                                          "torch.nn.Linear(2, 1)")
    assert _project(tmp_path, files) == []


STOPPER = """\
import torch.distributed as dist


class Stopper:
    def __init__(self):
        self.finished = False

    def update(self, value, best):
        if dist.get_rank() == 0:
            self.finished = value > best
        if self.finished:
            return
"""

LOOP = """\
import torch.distributed as dist


class Loop:
    def __init__(self, model, loader):
        self.model = model
        self.loader = loader

    def log(self):
        print(len(self.loader))

    def run(self):
        while True:
            for x in self.loader:
                dist.all_reduce(x)
            if dist.get_rank() == 0:
                self.log()
            if self.finished:
                break
"""


def test_a_flag_one_class_computes_is_no_flag_of_another_files_class(tmp_path: Path) -> None:
    # `self.finished` is set on rank 0 alone in stopper.py; loop.py reads an attribute of that
    # name that it never sets (whatever sets it is out of sight): no rank test
    files = {"stopper.py": STOPPER, "loop.py": LOOP}
    assert _project(tmp_path, files) == []


ENGINE_FIT = """\
import torch.distributed as dist


def fit(model, loader, optimizer, epochs):
    best = float("inf")
    for _ in range(epochs):
        for x in loader:
            loss = model(x).mean()
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            if loss.item() > best:
                break
            best = loss.item()
"""

MAIN_FIT = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from engine import fit


def main(loader, optimizer):
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(2, 1))
    fit(model, loader, optimizer, 5)
"""


def test_a_wrapper_every_caller_passes_is_the_parameters_ddp_model(tmp_path: Path) -> None:
    # main.py's only call of engine.fit passes the wrapper: rank 0's `break` leaves the
    # others in the next epoch's forward (DDP019)
    files = {"engine.py": ENGINE_FIT, "main.py": MAIN_FIT}
    assert _project(tmp_path, files) == [("engine.py", "DDP019", 13)]
    # a second call with the bare model: the parameter is not always the wrapper
    files["main.py"] = MAIN_FIT + "    fit(torch.nn.Linear(2, 1), loader, optimizer, 1)\n"
    assert _project(tmp_path, files) == []


BN_MODEL = """\
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
"""


def test_a_buffer_in_another_file_proves_the_rank_0_forward(tmp_path: Path) -> None:
    # The BatchNorm lives in models.py; the rank-0 forward in train.py hangs on its broadcast
    # (DDP006, on by default). Without it, the same forward is DDP037's (preview).
    files = {"ext_dist.py": EXT_DIST, "models.py": BN_MODEL, "train.py": WRAP}
    assert _project(tmp_path, files) == [("train.py", "DDP006", 11)]


def test_a_launchers_process_forms_its_group_through_another_files_helper(
        tmp_path: Path) -> None:
    # diffwave-sashimi's shape (corpus35y tuning T161): `mp.Process(target=partial(...))`
    # whose function forms the group in distributed_util.py, then a join on each in turn
    (tmp_path / "distributed_util.py").write_text(
        "import torch.distributed as dist\n\n\n"
        "def init_distributed(rank, num_gpus):\n"
        "    dist.init_process_group('nccl', rank=rank, world_size=num_gpus)\n")
    launch = textwrap.dedent("""\
        import multiprocessing as mp
        from functools import partial

        from distributed_util import init_distributed


        def train(rank, num_gpus):
            init_distributed(rank, num_gpus)


        def main(n):
            train_fn = partial(train, num_gpus=n)
            procs = []
            for i in range(n):
                p = mp.Process(target=train_fn, args=(i,))
                p.start()
                procs.append(p)
            for p in procs:
                p.join()
        """)
    (tmp_path / "train.py").write_text(launch)
    found = [(Path(f.path).name, f.code, f.line) for f in lint_paths([tmp_path])]
    assert found == [("train.py", "DDP035", 18)]
    # alone, the set-up is out of sight: nothing says the processes form a group
    assert lint_paths([tmp_path / "train.py"]) == []
