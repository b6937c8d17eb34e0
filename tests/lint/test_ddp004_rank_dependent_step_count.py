"""DDP004 rank-dependent step counts.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from pathlib import Path

from helpers import (
    finding_lines,
    inline_lines,
    lint_paths,
    lint_source,
)


def test_skipping_the_first_index_is_no_empty_batch() -> None:
    src = """\
def evaluate(loader, warm):
    for it, data in enumerate(loader):
        if warm and it == 0:
            continue
        dist.all_reduce(data)
"""
    assert inline_lines(src) == []
    assert inline_lines(src.replace("warm and it == 0", "data is None")) == [("DDP004", 3)]


# An evaluation loop under no_grad that skips empty batches (DiffSinger's trainer): no rank
# waits on another inside it.
EVAL_SKIP = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader


class Trainer:
    def evaluate(self, model, loader):
        torch.set_grad_enabled(False)
        outputs = []
        for batch_idx, batch in enumerate(loader):
            if batch is None:
                continue
            outputs.append(self.forward_step(model, batch))
        return outputs

    def forward_step(self, model, batch):
        return model(batch)
"""


def test_a_skipped_batch_in_a_loop_that_never_syncs_is_no_step_mismatch() -> None:
    assert finding_lines(EVAL_SKIP) == []


def test_a_skipped_batch_in_a_training_loop_is_reported() -> None:
    direct = EVAL_SKIP.replace(
        "            outputs.append(self.forward_step(model, batch))",
        "            model(batch).sum().backward()",
    )
    assert finding_lines(direct) == [("DDP004", 11)]
    # the backward one call away, in a method of this file
    helper = EVAL_SKIP.replace(
        "        return model(batch)\n", "        loss = model(batch)\n        loss.backward()\n"
    )
    assert finding_lines(helper) == [("DDP004", 11)]


# A collate_fn that checks something about the samples without dropping any (deepmd's atom
# counts): every rank keeps its batch size.
COLLATE = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader


def collate(batch):
    atypes = [d.get("atype") for d in batch if d.get("atype") is not None]
    if atypes and any(len(a) != len(atypes[0]) for a in atypes):
        raise NotImplementedError("frames with different atom counts")
    return torch.stack([d["coord"] for d in batch])


loader = DataLoader(dataset, batch_size=4, collate_fn=collate)
"""


def test_a_collate_fn_that_only_inspects_its_samples_drops_none() -> None:
    assert finding_lines(COLLATE) == []


def test_a_collate_fn_that_filters_samples_keeps_the_step_count() -> None:
    # a smaller batch, not fewer steps: every rank still gets one batch per index
    drops = COLLATE.replace('    atypes = [d.get("atype") for d', "    batch = atypes = [d for d")
    assert finding_lines(drops) == []
    assert (
        finding_lines(
            COLLATE.replace(
                '    atypes = [d.get("atype") for d in batch if',
                "    atypes = list(filter(lambda d:",
            ).replace('d.get("atype") is not None]', "d is not None, batch))")
        )
        == []
    )


def test_a_collate_fn_that_can_return_none_is_reported() -> None:
    none = COLLATE.replace(
        "    if atypes and", "    if not atypes:\n        return None\n    if atypes and"
    )
    assert finding_lines(none) == [("DDP004", 9)]


EMPTY_TARGETS = """\
import torch
import torch.distributed as dist


def train(model, loader, optimizer):
    for it, (images, targets, _) in enumerate(loader):
        if any(len(t) < 1 for t in targets):
            continue
        loss = model(images, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def test_a_skip_on_the_batchs_items_is_a_skipped_step() -> None:
    assert finding_lines(EMPTY_TARGETS) == [("DDP004", 7)]
    # a test of something else than the batch (the enumerate index) skips no batch
    other = EMPTY_TARGETS.replace(
        "any(len(t) < 1 for t in targets)", "any(len(t) < 1 for t in [it])"
    )
    assert finding_lines(other) == []


NAN_BREAK = """\
import torch
import torch.distributed as dist


def train(model, train_dl, optimizer, scaler):
    loss_sum = 0.0
    for data in train_dl:
        optimizer.zero_grad()
        loss = model(data)
        loss_sum += loss.data.float()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if torch.isnan(loss_sum):
            break
"""


def test_a_rank_that_leaves_on_its_own_nan_loss_is_reported() -> None:
    [f] = lint_source(NAN_BREAK)
    assert (f.code, f.line) == ("DDP004", 14)
    assert "`loss_sum` is not finite leaves the loop" in f.message
    skip = NAN_BREAK.replace("        if torch.isnan(loss_sum):\n            break\n", "").replace(
        "        scaler.scale(loss).backward()\n",
        "        if not torch.isfinite(loss):\n            continue\n"
        "        scaler.scale(loss).backward()\n",
    )
    assert [(f.code, f.line, "skips the step" in f.message) for f in lint_source(skip)] == [
        ("DDP004", 11, True)
    ]
    # a gradient norm is read after DDP's all-reduce: every rank holds the same one
    norm = NAN_BREAK.replace("torch.isnan(loss_sum)", "torch.isnan(grad_norm)")
    assert finding_lines(norm) == []


def test_a_single_process_script_may_skip_what_it_likes(tmp_path: Path) -> None:
    alone = NAN_BREAK.replace("import torch.distributed as dist\n", "")
    assert finding_lines(alone) == []
    # a trainer module that never names torch.distributed: reported once a file that forms
    # the group imports it
    (tmp_path / "trainer.py").write_text(
        EMPTY_TARGETS.replace("import torch.distributed as dist\n", "")
    )
    assert [f.code for f in lint_paths([tmp_path])] == []
    (tmp_path / "main.py").write_text(
        "import torch.distributed as dist\nfrom trainer import "
        "train\ndist.init_process_group('gloo')\n"
    )
    assert [(Path(f.path).name, f.code) for f in lint_paths([tmp_path])] == [
        ("trainer.py", "DDP004")
    ]


def test_a_nan_test_every_rank_shares_is_no_finding() -> None:
    shared = NAN_BREAK.replace(
        "        if torch.isnan(loss_sum):",
        "        dist.all_reduce(loss_sum)\n        if torch.isnan(loss_sum):",
    )
    assert finding_lines(shared) == []
    helper = NAN_BREAK.replace(
        "        if torch.isnan(loss_sum):",
        "        loss_sum = reduce_mean(loss_sum)\n        if torch.isnan(loss_sum):",
    )
    assert finding_lines(helper) == []
    # a NaN check that ends the process is a failure the launcher sees, not a skipped step
    fail = NAN_BREAK.replace("            break", "            raise RuntimeError('nan')")
    assert finding_lines(fail) == []
    # not a batch loop
    other = NAN_BREAK.replace("for data in train_dl:", "for data in range(10):")
    assert finding_lines(other) == []


BASE = """\
class Trainer:
    def train_one_step(self, batch):
        raise NotImplementedError

    def train_epoch(self, loader):
        for batch in loader:
            ok = self.train_one_step(batch)
            if not ok and self.stop_on_error:
                break
"""

STEP = """\
import torch
from torch.nn.parallel import DistributedDataParallel

from trainer.base import Trainer


class DdpTrainer(Trainer):
    def train_one_step(self, batch):
        try:
            loss = self.model(batch).mean()
        except RuntimeError as e:
            if "out of memory" in str(e):
                return False
            raise
        loss.backward()
        return True
"""


def test_a_subclass_step_in_another_file(tmp_path: Path) -> None:
    """The loop is the base class's (`self.train_one_step(batch)`), the step a subclass's in
    another file: its caught out-of-memory error skips the backward on this rank alone, and
    the loop's break on what it returned is this rank's too."""
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "base.py").write_text(BASE)
    (tmp_path / "trainer" / "ddp.py").write_text(STEP)
    found = {(Path(f.path).name, f.line) for f in lint_paths([tmp_path]) if f.code == "DDP004"}
    assert found == {("ddp.py", 13), ("base.py", 8)}
    # another class's step of the same name is no override of this loop's
    (tmp_path / "trainer" / "ddp.py").write_text(STEP.replace("(Trainer)", "(object)"))
    assert not [f for f in lint_paths([tmp_path]) if f.code == "DDP004"]


NESTED_NAN = """\
import torch
import torch.distributed as dist


def train(model, loader, optimizer):
    dist.init_process_group("nccl")
    for i, batch in enumerate(loader):
        loss = model(batch).sum()
        loss.backward()
        optimizer.step()
        if i % 5 == 0:
            if torch.isnan(loss):
                exit()
"""


def test_a_non_finite_exit_inside_a_progress_test_is_the_step_s_own() -> None:
    """corpus42b's bengali-speech-recognition: `if i % updatefreq == 0: if isnan(loss):
    exit()`: every rank passes the progress test at the same step; the exit is one rank's."""
    assert inline_lines(NESTED_NAN) == [("DDP004", 12)]


def test_not_inside_a_rank_test_or_a_test_with_an_else() -> None:
    assert inline_lines(NESTED_NAN.replace("if i % 5 == 0:", "if dist.get_rank() % 5 == 0:")) \
        == []
    with_else = NESTED_NAN.replace("                exit()\n",
                                   "                exit()\n        else:\n            pass\n")
    assert inline_lines(with_else) == []
