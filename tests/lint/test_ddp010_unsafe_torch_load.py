"""DDP010 torch.load.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import (
    codes_after_head,
    ddp_source,
    lint_source,
    snippet_codes,
)

from ddpguard.lint import Selection, lint_file


@pytest.mark.parametrize(
    ("deps", "expected"),
    [
        ('dependencies = ["torch>=2.1"]', 1),
        ('dependencies = ["torch>=2.6"]', 0),
        ('requires-python = ">=3.14"', 0),  # no torch older than 2.9 runs on 3.14
        ('requires-python = ">=3.9"', 1),
        ('dependencies = ["torchvision"]', 0),  # not torch: versions unknown, default is safe
    ],
)
def test_ddp010_follows_project_torch_versions(tmp_path: Path, deps: str, expected: int) -> None:
    (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "x"\n{deps}\n')
    script = tmp_path / "train.py"
    script.write_text("import torch\nsd = torch.load(args.ckpt)\nsd = torch.load('a.pt')\n")
    # DDP010 is off by default (precision below 90 %): select it.
    found = [
        f for f in lint_file(script, Selection(extend_select=("DDP010",))) if f.code == "DDP010"
    ]
    assert len(found) == expected
    assert all(f.line == 2 and "weights_only=False (before 2.6)" in f.message for f in found)


def test_ddp010_map_location_only_in_cuda_ddp_scripts() -> None:
    src = 'dist.init_process_group("nccl")\nsd = torch.load(args.ckpt)\n'
    assert codes_after_head(src).count("DDP010") == 1
    assert "DDP010" not in codes_after_head(src.replace("nccl", "gloo"))


def test_rank_guarded_load_keeps_its_device() -> None:
    src = """
    if dist.get_rank() == 0:
        meta = torch.load(args.ckpt)
    """
    assert snippet_codes(src) == []
    assert snippet_codes(src.replace("if dist.get_rank() == 0:", "if args.ckpt:")) == ["DDP010"]


def test_a_load_in_an_instance_method_called_on_rank_0_only_is_guarded() -> None:
    # DDP010 (off by default) skips loads that only rank 0 makes: the guard of the call
    # site `if rank == 0: engine.restore()` reaches the method.
    src = ddp_source("""
        class Engine:
            def restore(self, path):
                return torch.load(path, weights_only=True)

        def main(path, rank):
            dist.init_process_group("nccl")
            engine = Engine()
            if rank == 0:
                engine.restore(path)
        """)
    sel = Selection(extend_select=("DDP010",))
    assert [f.code for f in lint_source(src, selection=sel)] == []
    every = src.replace(
        "    if rank == 0:\n        engine.restore(path)", "    engine.restore(path)"
    )
    assert [f.code for f in lint_source(every, selection=sel)] == ["DDP010"]
