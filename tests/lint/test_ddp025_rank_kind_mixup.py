"""DDP025 the global rank as a device index, or the local rank as the global rank (its
fixture is tests/lint/fixtures/DDP025_rank_kind_mixup.py)."""

from __future__ import annotations

from helpers import HEAD_DIST, lint_with_defaults

from ddpguard.lint import RULES


def test_the_message_says_it_bites_on_several_nodes() -> None:
    src = HEAD_DIST + "rank = dist.get_rank()\ntorch.cuda.set_device(rank)\n"
    [f] = lint_with_defaults(src, "t.py")
    assert f.code == "DDP025" and "second node" in f.message and "get_rank()" in f.message


def test_a_rank_read_in_another_function_is_not_this_ones() -> None:
    # `rank` of `worker` is mp.spawn's index; `main` reads LOCAL_RANK into its own `rank`.
    src = HEAD_DIST + (
        "import os\n\n"
        "def main():\n    rank = int(os.environ['LOCAL_RANK'])\n    torch.cuda.set_device(rank)\n\n"
        "def worker(rank, world):\n"
        "    dist.init_process_group('nccl', rank=rank, world_size=world)\n")
    assert lint_with_defaults(src, "t.py") == []


def test_on_by_default() -> None:
    assert RULES["DDP025"].default and not RULES["DDP025"].preview
