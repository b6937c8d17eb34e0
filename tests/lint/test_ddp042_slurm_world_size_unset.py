"""DDP042 a SLURM arm that leaves the world size at 1 (fixture:
tests/lint/fixtures/DDP042_slurm_arm_without_world_size.py). Here: the DETR-style set-up module
beside the entry script that holds the option, as corpus35q's three repositories ship it."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import lint_paths

from ddpguard.lint import RULES, Selection

ONLY = Selection(select=("DDP042",))

SETUP = """\
import os
import torch
import torch.distributed as dist


def init_distributed_mode(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
    elif "SLURM_PROCID" in os.environ:
        args.rank = int(os.environ["SLURM_PROCID"])
        args.gpu = args.rank % torch.cuda.device_count()
    else:
        args.distributed = False
        return
    dist.init_process_group(backend="nccl", init_method=args.dist_url,
                            world_size=args.world_size, rank=args.rank)
"""

MAIN = """\
import argparse
import util.misc as utils


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world_size", default=1, type=int)
    parser.add_argument("--dist_url", default="env://")
    args = parser.parse_args()
    {extra}utils.init_distributed_mode(args)
"""


def _project(tmp_path: Path, extra: str = "", other: str = "") -> list[Path]:
    (tmp_path / "util").mkdir()
    files = {"util/misc.py": SETUP, "main.py": MAIN.format(extra=extra)}
    if other:
        files["other_main.py"] = other
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return [tmp_path]


def test_the_option_default_in_the_entry_script_is_named(tmp_path: Path) -> None:
    [f] = lint_paths(_project(tmp_path), ONLY)
    assert f.path.endswith("misc.py") and f.line == 10
    assert "leaves `args.world_size` at the option's default, 1 (main.py:7)" in f.message
    assert "every task but rank 0 fails" in f.message


def test_a_caller_that_sets_the_world_size_first_is_silent(tmp_path: Path) -> None:
    extra = "args.world_size = int(os.environ['SLURM_NTASKS'])\n    "
    assert lint_paths(_project(tmp_path, extra), ONLY) == []


def test_another_entry_that_never_calls_the_set_up_does_not_count(tmp_path: Path) -> None:
    # corpus35q, PyconvResnetTransformer: pyconvmain.py spawns its own processes and sets
    # args.world_size for its own init; main.py's set-up is still wrong under srun.
    other = ("def main(args):\n"
             "    args.world_size = 8 * args.nodes\n")
    [f] = lint_paths(_project(tmp_path, other=other), ONLY)
    assert f.code == "DDP042"


def test_submitit_sets_it(tmp_path: Path) -> None:
    other = ("import submitit\n\n"
             "def launch(args):\n"
             "    return submitit.AutoExecutor(folder='x')\n")
    assert lint_paths(_project(tmp_path, other=other), ONLY) == []


def test_in_preview() -> None:
    # Right about the code, but most programs that carry it ship only torchrun launches.
    assert RULES["DDP042"].preview and not RULES["DDP040"].preview
