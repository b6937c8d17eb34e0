"""DDP050 the local rank read only from a `--local_rank` option (fixture:
tests/lint/fixtures/DDP050_local_rank_option_only.py). Here: the twins that stay silent, a
helper module that reads LOCAL_RANK, and what the message says for parse_known_args."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from helpers import lint_paths, lint_source

from ddpguard.lint import Selection

ONLY = Selection(select=("DDP050",))

HEAD = textwrap.dedent("""\
    import argparse
    import os

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser()
    """)
TAIL = textwrap.dedent("""\
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group("nccl")
    """)


@pytest.mark.parametrize("declaration, rest", [
    # both spellings: what PyTorch's own launch documentation recommends
    ('parser.add_argument("--local-rank", "--local_rank", type=int, default=0)\n', ""),
    # the default taken from the environment
    ('parser.add_argument("--local_rank", type=int, '
     'default=int(os.environ.get("LOCAL_RANK", 0)))\n', ""),
    # assigned from the environment after parsing
    ('parser.add_argument("--local_rank", type=int, default=0)\n',
     'args.local_rank = int(os.environ["LOCAL_RANK"])\n'),
    # assigned from SLURM's variable (no LOCAL_RANK named anywhere)
    ('parser.add_argument("--local_rank", type=int, default=0)\n',
     'args.local_rank = int(os.environ["SLURM_LOCALID"])\n'),
    # the program spawns its own processes: the spawn index is the rank
    ('parser.add_argument("--local_rank", type=int, default=0)\n',
     "mp.spawn(print, nprocs=2)\n"),
])
def test_silent_where_the_launcher_s_local_rank_arrives(declaration: str, rest: str) -> None:
    src = HEAD + declaration + "args = parser.parse_args()\n" + rest + TAIL
    assert lint_source(src, "train.py", ONLY) == []


def test_a_helper_module_that_reads_local_rank_silences_it(tmp_path: Path) -> None:
    (tmp_path / "dist_utils.py").write_text(textwrap.dedent("""\
        import os


        def local_rank(args):
            return int(os.environ.get("LOCAL_RANK", args.local_rank))
        """))
    (tmp_path / "train.py").write_text(
        HEAD + 'parser.add_argument("--local_rank", type=int, default=0)\n'
        "args = parser.parse_args()\n" + TAIL)
    assert lint_paths([tmp_path], ONLY) == []
    (tmp_path / "dist_utils.py").unlink()
    assert [f.line for f in lint_paths([tmp_path], ONLY)] == [9]


def test_parse_known_args_keeps_the_default_under_both_launchers() -> None:
    src = (HEAD + 'parser.add_argument("--local_rank", type=int, default=-1)\n'
           "args, _ = parser.parse_known_args()\n" + TAIL)
    (f,) = lint_source(src, "train.py", ONLY)
    assert "parse_known_args() sets aside, so every process keeps the default `-1`" in f.message
    assert "torchrun passes no option" in f.message
    assert "takes the path of a run without a launcher" in f.message


def test_a_default_of_0_makes_every_process_local_rank_0() -> None:
    src = (HEAD + 'parser.add_argument("--local_rank", type=int, default=0)\n'
           "args = parser.parse_args()\n" + TAIL)
    (f,) = lint_source(src, "train.py", ONLY)
    assert "keeps the default `0` and acts as local rank 0" in f.message
    assert 'parse_args() rejects: every process exits with "unrecognized arguments"' in f.message


def test_a_program_that_forms_no_group_is_left_alone() -> None:
    # apex's wrapper under `if args.local_rank != -1:` and no init anywhere given: the group,
    # if any, is formed elsewhere, and this file shows no launch to speak of.
    src = (HEAD + 'parser.add_argument("--local_rank", type=int, default=-1)\n'
           "args = parser.parse_args()\ntorch.cuda.set_device(args.local_rank)\n"
           "dist.barrier()\n")
    assert lint_source(src, "train.py", ONLY) == []
