"""File-system races whose racy half lives in another file of the project: a helper that tests
for a folder and creates it, called on every rank before the ranks meet again (DDP030)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import lint_paths

MISC = """\
import os


def mkdir(path):
    if not os.path.exists(path):
        os.makedirs(path)


def mkdir_ok(path):
    if not os.path.exists(path):
        os.makedirs(path, exist_ok=True)


def mkdir_caught(path):
    try:
        if not os.path.isdir(path):
            os.mkdir(path)
    except FileExistsError:
        pass


def mkdir_sub(path):
    path = os.path.join(path, "sub")
    if not os.path.exists(path):
        os.makedirs(path)
"""

TRAIN = """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from utils.misc import mkdir


def main(args, net, loader, opt):
    dist.init_process_group("nccl")
    mkdir(args.out)
    model = DDP(net)
    for x in loader:
        model(x).sum().backward()
        opt.step()
"""


def _project(tmp_path: Path, train: str) -> list[tuple[str, str, int]]:
    files = {"utils/__init__.py": "", "utils/misc.py": MISC, "train.py": train}
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return [(Path(f.path).name, f.code, f.line) for f in lint_paths([tmp_path])
            if f.code == "DDP030"]


def test_a_helpers_makedirs_races_at_the_call_every_rank_makes(tmp_path: Path) -> None:
    assert _project(tmp_path, TRAIN) == [("train.py", "DDP030", 8)]
    # the same helper through `import utils.misc` and a module attribute
    dotted = TRAIN.replace("from utils.misc import mkdir", "import utils.misc").replace(
        "    mkdir(args.out)", "    utils.misc.mkdir(args.out)")
    assert _project(tmp_path, dotted) == [("train.py", "DDP030", 8)]


def test_the_helpers_race_is_silent_where_the_call_cannot_race(tmp_path: Path) -> None:
    # rank 0 alone calls it
    guarded = TRAIN.replace("    mkdir(args.out)",
                            "    if dist.get_rank() == 0:\n        mkdir(args.out)")
    assert _project(tmp_path, guarded) == []
    # one folder per rank
    per_rank = TRAIN.replace("mkdir(args.out)", "mkdir(f'{args.out}/rank{dist.get_rank()}')")
    assert _project(tmp_path, per_rank) == []
    # the ranks never meet again after it
    last = TRAIN.replace("    mkdir(args.out)\n", "") + "    mkdir(args.out)\n"
    assert _project(tmp_path, last) == []
    # rank 0 made it first, the others waited
    first = TRAIN.replace("    mkdir(args.out)",
                          "    if dist.get_rank() == 0:\n        mkdir(args.out)\n"
                          "    dist.barrier()\n    mkdir(args.out)")
    assert _project(tmp_path, first) == []
    # the call sits in a try that catches the error
    caught = TRAIN.replace("    mkdir(args.out)",
                           "    try:\n        mkdir(args.out)\n    except OSError:\n        pass")
    assert _project(tmp_path, caught) == []


def test_a_helper_that_cannot_race_is_silent_at_every_call(tmp_path: Path) -> None:
    for name in ("mkdir_ok", "mkdir_caught", "mkdir_sub"):
        train = TRAIN.replace("import mkdir", f"import {name}").replace(
            "    mkdir(args.out)", f"    {name}(args.out)")
        assert _project(tmp_path, train) == [], name


MODELS = """\
from torch.nn.parallel import DistributedDataParallel as DDP


def create_model(net, rank):
    return DDP(net.cuda(rank), device_ids=[rank])
"""

TRAIN_HELPER_WRAP = """\
import os

import torch.distributed as dist
from models import create_model


def main(args, net, loader, opt):
    dist.init_process_group("nccl")
    if not os.path.exists(args.out):
        os.makedirs(args.out)
    model = create_model(net, args.local_rank)
    for x in loader:
        model(x).sum().backward()
        opt.step()
"""


def test_the_race_names_the_first_wait_inside_a_project_helper(tmp_path: Path) -> None:
    # The others first wait in the DDP wrap inside create_model() (corpus35l's DeepFashion,
    # where the message named the later backward): that is the line the message must give.
    for name, text in {"models.py": MODELS, "train.py": TRAIN_HELPER_WRAP}.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    found = [f for f in lint_paths([tmp_path]) if f.code == "DDP030"]
    assert [(Path(f.path).name, f.line) for f in found] == [("train.py", 10)]
    assert "inside create_model() at line 11" in found[0].message, found[0].message
