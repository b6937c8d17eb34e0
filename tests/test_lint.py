"""Rules DDP001-DDP018: a positive and a negative case each, plus the seed corpus."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddpguard.lint import RULES, Selection, lint_file, lint_source

CORPUS = Path(__file__).parent / "lint_corpus"
HEAD = """\
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
"""


def codes(src: str, select: tuple[str, ...] = ("ALL",)) -> list[str]:
    source = HEAD + textwrap.dedent(src)
    return [f.code for f in lint_source(source, "t.py", Selection(select=select))]


CASES: dict[str, tuple[str, str]] = {
    "DDP001": ("""
        s = DistributedSampler(ds)
        loader = DataLoader(ds, sampler=s, drop_last=True)
        for epoch in range(3):
            for b in loader:
                pass
        """, """
        s = DistributedSampler(ds)
        train_loader = DataLoader(ds, sampler=s, drop_last=True)
        for epoch in range(3):
            train_loader.sampler.set_epoch(epoch)
            for b in train_loader:
                pass
        """),
    "DDP002": ("DataLoader(ds, sampler=DistributedSampler(ds), shuffle=True, drop_last=True)\n",
               "DataLoader(ds, sampler=None, shuffle=True)\n"),
    "DDP003": ("train_loader = DataLoader(ds, sampler=DistributedSampler(ds))\n",
               "val_loader = DataLoader(ds, sampler=DistributedSampler(ds, shuffle=False))\n"
               "train_loader = DataLoader(ds, sampler=DistributedSampler(ds, drop_last=True))\n"),
    "DDP004": ("""
        def collate(batch):
            batch = [b for b in batch if b is not None]
            return batch
        loader = DataLoader(ds, collate_fn=collate)
        for batch in loader:
            if batch is None:
                continue
        """, """
        def collate(batch):
            return torch.stack(batch)
        loader = DataLoader(ds, collate_fn=collate)
        for batch in loader:
            if batch is None:
                raise RuntimeError("empty batch")
        """),
    "DDP005": ("""
        rank = dist.get_rank()
        is_master = rank == 0
        if is_master:
            dist.barrier()
        if dist.get_rank() == 0:
            dist.all_reduce(t)
        """, """
        if dist.get_rank() == 0:
            print("hi")
        dist.barrier()
        if world_size > 1:
            dist.all_reduce(t)
        """),
    "DDP006": ("""
        model = DDP(net)
        if dist.get_rank() == 0:
            out = model(x)
        """, """
        model = DDP(net)
        out = model(x)
        if dist.get_rank() == 0:
            out = model.module(x)
        """),
    "DDP007": ("""
        dist.init_process_group("gloo")
        torch.save(state, "ckpt.pt")
        """, """
        dist.init_process_group("gloo")
        def save(state):
            torch.save(state, "ckpt.pt")
        if dist.get_rank() == 0:
            save(state)
        """),
    "DDP008": ("""
        model = DDP(net)
        torch.save(model.state_dict(), "x")
        """, """
        model = DDP(net)
        torch.save(model.module.state_dict(), "x")
        """),
    "DDP009": ("""
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3), torch.nn.BatchNorm2d(3))
        model = DDP(net)
        """, """
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 3), torch.nn.BatchNorm2d(3))
        net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(net)
        model = DDP(net)
        """),
    "DDP010": ('sd = torch.load("x.pt")\n',
               'sd = torch.load("x.pt", map_location="cpu", weights_only=True)\n'),
    "DDP011": ('os.environ["NCCL_TIMEOUT"] = "1000"\n',
               'os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"\nos.environ["NCCL_DEBUG"] = "1"\n'),
    "DDP012": ('dist.init_process_group("gloo")\n',
               'dist.init_process_group("gloo")\ndist.destroy_process_group()\n'),
    "DDP013": ("""
        model = DDP(net)
        for i, b in enumerate(loader):
            model(b).sum().backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
        """, """
        model = DDP(net)
        for i, b in enumerate(loader):
            with model.no_sync() if (i + 1) % 4 else contextlib.nullcontext():
                model(b).sum().backward()
            if (i + 1) % 4 == 0:
                optimizer.step()
        """),
    "DDP014": ("model = torch.nn.DataParallel(net)\n", "model = DDP(net)\n"),
    "DDP015": ("""
        model = DDP(net.cuda())
        model = model.cuda()
        """, """
        model = DDP(net.cuda(), device_ids=[0])
        """),
    "DDP016": ("""
        def mean(t):
            dist.reduce(t, dst=0)
            return t.item()
        """, """
        def mean(t):
            dist.reduce(t, dst=0)
            if dist.get_rank() == 0:
                return t.item()
            return None
        """),
    "DDP017": ("""
        rank = int(os.environ["RANK"])
        local_rank = int(os.environ["LOCAL_RANK"])
        if local_rank == 0:
            torch.save(state, "ckpt.pt")
        """, """
        rank = int(os.environ["RANK"])
        if rank == 0:
            torch.save(state, "ckpt.pt")
        """),
    "DDP018": ('dist.init_process_group("gloo")\nprint("loss")\n',
               'dist.init_process_group("gloo")\nif dist.get_rank() == 0:\n    print("loss")\n'
               'print(f"rank {dist.get_rank()}")\n'),
}


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_positive(code: str) -> None:
    assert code in codes(CASES[code][0])


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_negative(code: str) -> None:
    assert code not in codes(CASES[code][1])


def test_every_rule_has_cases() -> None:
    assert sorted(CASES) == sorted(set(RULES) - {"DDP000"})


def test_aliased_collective_and_rank_helpers() -> None:
    src = """
    from torch.distributed import barrier as sync
    def is_main_process():
        return dist.get_rank() == 0
    if is_main_process():
        sync()
    if args.local_rank in [-1, 0]:
        dist.broadcast(t, 0)
    """
    assert codes(src).count("DDP005") == 2


def test_batch_sampler_and_class_attribute_aliases() -> None:
    src = """
    class T:
        def __init__(self):
            self.sampler = DistributedSampler(ds)
            bs = torch.utils.data.BatchSampler(self.sampler, 8, drop_last=True)
            self.loader = DataLoader(ds, batch_sampler=bs)
        def fit(self):
            for epoch in range(3):
                for b in self.loader:
                    pass
    """
    assert codes(src).count("DDP001") == 1
    fixed = src.replace("for b in self.loader", "self.sampler.set_epoch(epoch)\n"
                        "                for b in self.loader")
    assert "DDP001" not in codes(fixed)


def test_wrong_sampler_set_epoch_does_not_count() -> None:
    src = """
    a = DistributedSampler(ds)
    b = DistributedSampler(ds2)
    la = DataLoader(ds, sampler=a, drop_last=True)
    for epoch in range(3):
        b.set_epoch(epoch)
        for x in la:
            pass
    """
    assert "DDP001" in codes(src)


def test_noqa() -> None:
    src = 'os.environ["NCCL_TIMEOUT"] = "1"  # noqa: DDP011\n'
    src += 'os.environ["NCCL_TIMEOUT"] = "1"  # noqa\n'
    src += 'os.environ["NCCL_TIMEOUT"] = "1"  # noqa: DDP001\n'
    assert codes(src) == ["DDP011"]


def test_default_selection_excludes_info_rule() -> None:
    src = HEAD + 'dist.init_process_group("gloo")\nprint("x")\n'
    assert [f.code for f in lint_source(src)] == ["DDP012"]
    assert Selection(ignore=("DDP01",)).codes() == [f"DDP00{i}" for i in range(1, 10)]
    with pytest.raises(ValueError, match="DDP999"):
        Selection(select=("DDP999",))


def test_syntax_error_reported_with_line() -> None:
    [f] = lint_source("x = 1\ndef f(:\n", "bad.py")
    assert (f.code, f.line, f.path) == ("DDP000", 2, "bad.py")
    assert "syntax" in f.message


# -- the seeds' scripts ---------------------------------------------------------------------

def corpus_codes(name: str) -> set[str]:
    return {f.code for f in lint_file(CORPUS / name, Selection(select=("ALL",)))}


def test_seed004_wrong_flagged() -> None:
    assert {"DDP001", "DDP002", "DDP003"} <= corpus_codes("seed004_train_ddp_wrong.py")


def test_seed004_fixed_clean_for_data_rules() -> None:
    assert not corpus_codes("seed004_train_ddp_fixed.py") & {"DDP001", "DDP002", "DDP003",
                                                             "DDP004", "DDP005", "DDP006"}


def test_seed000_eval_on_rank0_through_ddp() -> None:
    assert "DDP006" in corpus_codes("seed000_eval_rank0.py")
    assert "DDP012" in corpus_codes("seed000_setup.py")


def test_seed001_get_reduced() -> None:
    found = corpus_codes("seed001_torchrun.py")
    assert {"DDP016", "DDP003"} <= found
    assert "DDP009" not in found  # it converts to SyncBatchNorm before wrapping


def test_seed003_and_004_nccl_variables() -> None:
    msgs = [f.message for f in lint_file(CORPUS / "seed003_nccl_timeout.py")]
    assert any("NCCL_TIMEOUT does not exist" in m for m in msgs)
    assert any("NCCL_BLOCKING_WAIT is deprecated" in m for m in msgs)
    assert len(msgs) == 2  # TORCH_NCCL_BLOCKING_WAIT is the right name
    assert corpus_codes("seed004_debug_env.py") == {"DDP011"}


@pytest.mark.parametrize("name", ["good_function_loop.py", "good_class_trainer.py",
                                  "good_hf_style.py", "seed004_train_ddp_fixed.py"])
def test_correct_styles_no_false_positives(name: str) -> None:
    bad = {f"DDP00{i}" for i in range(1, 8)}
    assert not corpus_codes(name) & bad


def test_lint_does_not_import_torch() -> None:
    code = ("import sys; from ddpguard.lint import lint_paths; "
            f"lint_paths([{str(CORPUS)!r}]); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "False"
