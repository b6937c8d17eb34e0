"""DDP003 uneven manual shard.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from pathlib import Path

from helpers import (
    ALL_BUT_PRINT,
    LINT_FIXTURES,
    fixture_lines,
    inline_lines,
    lint_paths_with_defaults,
    lint_with_defaults,
)

from ddpguard.lint import RULES, Selection


def test_tensor_split_into_a_multiple_of_the_world_size_is_even() -> None:
    name = "DDP005_leader_first_plain_if.py"
    got = fixture_lines(name, "// (max_batch * world) + 1) * world", "// max_batch + 1)")
    assert got == [("DDP003", 23)]
    # chunk() may return fewer pieces than asked: not proven even.
    assert fixture_lines(name, ".tensor_split(num_batches)", ".chunk(num_batches)") == [
        ("DDP003", 23)
    ]


def test_join_anywhere_on_the_command_line_handles_uneven_shards(tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text(
        "import torch.distributed as dist\n"
        "def shard(files):\n"
        "    return files[dist.get_rank()::dist.get_world_size()]\n"
    )
    trainer = tmp_path / "trainer.py"
    trainer.write_text(
        "from contextlib import nullcontext\n"
        "def train(model, loader, uneven):\n"
        "    ctx = model.join if uneven else nullcontext\n"
        "    with ctx():\n"
        "        for batch in loader:\n"
        "            model(batch).sum().backward()\n"
    )
    assert [f.code for f in lint_paths_with_defaults([tmp_path], ALL_BUT_PRINT)] == []
    trainer.write_text(trainer.read_text().replace("model.join", "model.no_sync"))
    assert [f.code for f in lint_paths_with_defaults([tmp_path], ALL_BUT_PRINT)] == ["DDP003"]


def test_shard_sized_by_len_floordiv_world_is_handled() -> None:
    src = """\
def validate(keys, rank):
    last_barrier_at = len(keys) // dist.get_world_size() - 1
    keys = keys[rank::dist.get_world_size()]
    for i, k in enumerate(keys):
        if i < last_barrier_at:
            dist.barrier()
    dist.barrier()
"""
    assert inline_lines(src) == []
    assert inline_lines(src.replace("len(keys) // dist.get_world_size() - 1", "10")) == [
        ("DDP003", 3)
    ]


def test_manual_shard_rule_is_off_by_default() -> None:
    # 0 true in 11 findings on real code over every corpus: below the 90 % bar.
    assert RULES["DDP003"].default is False
    src = (LINT_FIXTURES / "DDP003_manual_shard.py").read_text(encoding="utf-8")
    assert [f.code for f in lint_with_defaults(src, "t.py")] == []
    assert [
        f.code for f in lint_with_defaults(src, "t.py", Selection(extend_select=("DDP003",)))
    ] == ["DDP003", "DDP003"]


def test_shares_of_a_padded_list_stay_quiet_with_the_rule_selected() -> None:
    # The rule is off by default; these shards must stay even under it.
    assert fixture_lines("DDP003_even_sharding.py") == []
    assert fixture_lines(
        "DDP003_even_sharding.py",
        "    padded = files + files[: (-len(files)) % world_size]\n"
        "    return padded[rank::world_size]",
        "    return files[rank::world_size]",
    ) == [("DDP003", 21)]


def test_a_share_padded_from_itself_is_even() -> None:
    name = "DDP003_padded_sampler.py"
    assert fixture_lines(name) == []
    # Without the padding and the assert, the stride cut is uneven again.
    got = fixture_lines(name, "        indices += indices[: self.total_size - len(indices)]\n", "")
    assert got == []  # the assert on the share's length still proves it
    got = fixture_lines(
        name,
        "        indices += indices[: self.total_size - len(indices)]\n"
        "        indices = indices[self.rank:self.total_size:self.num_replicas]\n"
        "        assert len(indices) == self.num_samples\n",
        "        indices = indices[self.rank:self.total_size:self.num_replicas]\n",
    )
    assert got == [("DDP003", 22)]
    # An assert about another list proves nothing about this share.
    got = fixture_lines(
        name,
        "        indices += indices[: self.total_size - len(indices)]\n"
        "        indices = indices[self.rank:self.total_size:self.num_replicas]\n"
        "        assert len(indices) == self.num_samples\n",
        "        indices = indices[self.rank:self.total_size:self.num_replicas]\n"
        "        assert len(self.dataset) == self.num_samples\n",
    )
    assert got == [("DDP003", 22)]
