"""DDP017 local rank 0 writes in a multi-node script.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from pathlib import Path

from helpers import (
    cache_leader_findings,
    cache_leader_lines,
    lint_paths,
)

from ddpguard.lint import Selection


def test_the_old_example_trainer_shape_is_quiet_but_for_the_node_local_saves() -> None:
    # The cache write and the checkpoint block: local rank 0 of every node writes them
    # (the script reads get_rank(), so it runs on several nodes). Once per block.
    assert cache_leader_lines() == [("DDP017", 24), ("DDP017", 51)]


def test_a_node_local_save_is_reported_where_it_is_not_at_every_call() -> None:
    got = cache_leader_findings()
    assert all(
        "load_features() writes" not in m and "evaluate() writes" not in m for _, _, m in got
    )
    # A helper whose save has no test of its own is reported at the guarded call.
    got = cache_leader_lines(
        "        if args.local_rank in [-1, 0]:\n"
        "            torch.save(feats, path)  # expect: DDP017\n",
        "        torch.save(feats, path)\n",
    )
    assert ("DDP017", 69) in got and ("DDP017", 23) not in got


def test_multi_node_is_a_fact_of_the_program(tmp_path: Path) -> None:
    # The set-up module reads SLURM_PROCID; the trainer that imports it saves on local rank 0:
    # every node's local rank 0 writes. A trainer beside it that imports nothing of it is a
    # program of its own.
    (tmp_path / "dist_setup.py").write_text(
        "import os\nimport torch.distributed as dist\n\n\ndef init():\n"
        "    rank = int(os.environ['SLURM_PROCID'])\n"
        "    dist.init_process_group('nccl', rank=rank)\n")
    body = ("import os\nimport torch\n{imp}\n\ndef main(state):\n{call}"
            "    local_rank = int(os.environ['LOCAL_RANK'])\n"
            "    if local_rank == 0:\n        torch.save(state, 'ckpt.pt')\n")
    (tmp_path / "train.py").write_text(
        body.format(imp="from dist_setup import init", call="    init()\n"))
    (tmp_path / "other.py").write_text(
        body.format(imp="import torch.distributed as dist",
                    call="    dist.init_process_group('nccl')\n"))
    found = lint_paths(sorted(tmp_path.glob("*.py")), Selection(select=("DDP017",)))
    assert [(Path(f.path).name, f.line) for f in found] == [("train.py", 9)]
