"""DDP017 local rank 0 writes in a multi-node script.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from helpers import (
    cache_leader_findings,
    cache_leader_lines,
)


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
