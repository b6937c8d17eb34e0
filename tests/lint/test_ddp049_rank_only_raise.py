"""DDP049 a call that always raises, made only on the ranks a rank test lets through
(fixture: tests/lint/fixtures/DDP049_rank_only_raise.py). Here: the rule's list of removed
numpy names against the installed numpy, and what the message says."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import numpy
import pytest
from helpers import lint_paths, lint_source

from ddpguard.lint import Selection
from ddpguard.lint.analysis.raising_calls import REMOVED_ATTRS

ONLY = Selection(select=("DDP049",))


def test_the_removed_numpy_names_are_absent_from_the_installed_numpy() -> None:
    # A name the list holds and numpy still has would be reported on working code.
    names = [q.split(".", 1)[1] for q in REMOVED_ATTRS if q.startswith("numpy.")]
    assert len(names) > 10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        present = [n for n in names if hasattr(numpy, n)]
    assert present == []


def test_the_message_names_the_removal_the_rank_test_and_what_waits() -> None:
    src = textwrap.dedent("""\
        import pandas as pd
        import torch.distributed as dist


        def train(model, loader, optimizer, epochs):
            dist.init_process_group("nccl")
            log = pd.DataFrame(columns=["epoch"])
            for epoch in range(epochs):
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()
                if dist.get_rank() == 0:
                    log = log.append({"epoch": epoch}, ignore_index=True)
        """)
    (f,) = lint_source(src, "train.py", ONLY)
    assert f.line == 13
    assert "pandas 2.0" in f.message and "`dist.get_rank() == 0`" in f.message
    assert "line 10 (the loop's next turn)" in f.message


def test_a_raise_with_no_collective_after_it_is_left_alone() -> None:
    # Rank 0's last act: nothing waits for it, so no hang (the crash is not this rule's).
    src = textwrap.dedent("""\
        import pandas as pd
        import torch.distributed as dist


        def train(model, loader, optimizer):
            dist.init_process_group("nccl")
            for x in loader:
                model(x).sum().backward()
            if dist.get_rank() == 0:
                log = pd.read_csv("log.csv")
                log = log.append({"done": 1}, ignore_index=True)
        """)
    assert lint_source(src, "train.py", ONLY) == []


def test_a_helper_of_another_file_called_without_a_required_parameter(tmp_path: Path) -> None:
    # corpus36c's diffusion trainer: utils/checkpoint.py's save_ckpt gained a parameter that
    # the sr/ trainer's rank-0 call never passes; its twin passes it.
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "checkpoint.py").write_text(textwrap.dedent("""\
        def save_ckpt(epoch, model, interval, interval_epochs, image_size=None):
            return epoch, model, interval, interval_epochs, image_size
        """))
    body = textwrap.dedent("""\
        import torch.distributed as dist
        from utils.checkpoint import save_ckpt


        def train(model, loader, epochs):
            dist.init_process_group("nccl")
            for epoch in range(epochs):
                for x in loader:
                    model(x).sum().backward()
                if dist.get_rank() == 0:
                    save_ckpt(epoch=epoch, model=model, interval=5{more})
                dist.barrier()
        """)
    (tmp_path / "sr.py").write_text(body.format(more=""))
    (tmp_path / "tools.py").write_text(body.format(more=", interval_epochs=10"))
    found = lint_paths([tmp_path], ONLY)
    assert [(Path(f.path).name, f.line) for f in found] == [("sr.py", 11)]
    assert "`save_ckpt()` (checkpoint.py:1) requires `interval_epochs`" in found[0].message
    assert "barrier() at line 12" in found[0].message


SAVE = textwrap.dedent("""\
    import os
    import torch
    import torch.distributed as dist


    def train(model, loader, optimizer, epochs, out):
        dist.init_process_group("nccl")
        {make}
        for epoch in range(epochs):
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
            if dist.get_rank() == 0:
                torch.save(model.state_dict(), {path})
    """)


@pytest.mark.parametrize("make, path, found", [
    # corpus39b's multipinn and corpus38b's TGDR: a folder written out that nothing creates
    ("pass", 'f"results/mod/mod_{epoch}.pth"', True),
    ("pass", '"Weights/net_%d.pth" % epoch', True),
    # the program creates it, or creates folders it names at run time
    ('os.makedirs("results/mod", exist_ok=True)', 'f"results/mod/mod_{epoch}.pth"', False),
    ("os.makedirs(out, exist_ok=True)", 'f"results/mod/mod_{epoch}.pth"', False),
    # a folder the code computes
    ("pass", 'f"{out}/mod_{epoch}.pth"', False),
    ("pass", 'os.path.join(out, "mod.pth")', False),
])
def test_a_rank_0_save_into_a_folder_nothing_creates(tmp_path: Path, make: str, path: str,
                                                     found: bool) -> None:
    (tmp_path / "train.py").write_text(SAVE.format(make=make, path=path))
    got = lint_paths([tmp_path], ONLY)
    assert [f.line for f in got] == ([14] if found else [])
    if found:
        assert "which nothing in the program creates" in got[0].message


def test_a_folder_the_checkout_holds_is_no_finding(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SAVE.format(make="pass",
                                                   path='f"results/mod/mod_{epoch}.pth"'))
    (tmp_path / "results" / "mod").mkdir(parents=True)
    assert lint_paths([tmp_path], ONLY) == []


OPEN = SAVE.replace("torch.save(model.state_dict(), {path})",
                    "with open({path}, {mode}) as fd:\n                fd.write('done')")


@pytest.mark.parametrize("path, mode, found", [
    # corpus41a tuning's CS769_HW5: rank 0's log into `logs/`, which nothing creates
    ('"logs/finetune_{}_{}.txt".format(epoch, out)', '"a"', True),
    ('"logs/run.txt"', '"w"', True),
    # reading creates nothing; a folder the code computes is unknown
    ('"logs/run.txt"', '"r"', False),
    ('f"{out}/run.txt"', '"w"', False),
])
def test_a_rank_0_file_opened_for_writing_in_a_folder_nothing_creates(
        tmp_path: Path, path: str, mode: str, found: bool) -> None:
    (tmp_path / "train.py").write_text(OPEN.format(make="pass", path=path, mode=mode))
    got = lint_paths([tmp_path], ONLY)
    assert [f.line for f in got] == ([14] if found else [])
    if found:
        assert "`open()` writes into `logs/`" in got[0].message


def test_a_launch_script_that_makes_the_folder_is_no_finding(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(OPEN.format(make="pass", path='"logs/run.txt"',
                                                   mode='"w"'))
    (tmp_path / "run.sh").write_text("mkdir -p logs\ntorchrun --nproc_per_node=2 train.py\n")
    assert lint_paths([tmp_path], ONLY) == []
