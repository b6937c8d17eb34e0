"""DDP040's option arm (fixture: tests/lint/fixtures/DDP040_spawn_count_vs_option.py): the
spawned function's world size is an option the command line may or may not give. Here: where
the option is declared, and the ways a program sets it other than by the command line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from helpers import lint_paths

from ddpguard.lint import Selection

ONLY = Selection(select=("DDP040",))

TRAIN = """\
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from opts import parser


def train(rank, args):
    dist.init_process_group("nccl", rank=rank, world_size=args.world_size)
    dist.barrier()


def main():
    args = parser.parse_args()
    {extra}
    mp.spawn(train, args=(args,), nprocs=torch.cuda.device_count())
"""

OPTS = """\
import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--world_size", type=int, default={default})
"""


def _lint(tmp_path: Path, extra: str = "", default: str = "2") -> list[str]:
    (tmp_path / "train.py").write_text(TRAIN.format(extra=extra))
    (tmp_path / "opts.py").write_text(OPTS.format(default=default))
    return [f.message for f in lint_paths([tmp_path / "train.py", tmp_path / "opts.py"], ONLY)]


def test_an_option_declared_in_another_file_is_read_there(tmp_path: Path) -> None:
    (msg,) = _lint(tmp_path)
    assert "--world_size (default 2, opts.py:4)" in msg
    assert "torch.cuda.device_count()" in msg and "ranks past 1 fail" in msg


@pytest.mark.parametrize("extra", [
    "args.world_size = torch.cuda.device_count()",
    "vars(args).update({'world_size': 4})",
    "args.__dict__.update(cfg)",
    "setattr(args, key, value)",
    "parser.set_defaults(world_size=torch.cuda.device_count())",
])
def test_an_option_the_program_sets_is_left_alone(tmp_path: Path, extra: str) -> None:
    assert _lint(tmp_path, extra) == []


def test_an_option_without_a_literal_default_is_left_alone(tmp_path: Path) -> None:
    assert _lint(tmp_path, default="None") == []
    assert _lint(tmp_path, default="int(os.environ['WORLD_SIZE'])") == []


def test_a_second_program_declaring_its_own_option_does_not_hide_the_first(
        tmp_path: Path) -> None:
    (tmp_path / "sr").mkdir()
    own = textwrap.dedent(TRAIN.replace("from opts import parser\n", "import argparse\n")
                          .format(extra="")) + textwrap.dedent("""\

        parser = argparse.ArgumentParser()
        parser.add_argument("--world_size", type=int, default=2)
        """)
    (tmp_path / "train.py").write_text(own)
    (tmp_path / "sr" / "train.py").write_text(own.replace("default=2", "default=4"))
    found = lint_paths([tmp_path / "train.py", tmp_path / "sr" / "train.py"], ONLY)
    assert sorted(f.message.split("(default ")[1][:1] for f in found) == ["2", "4"]
