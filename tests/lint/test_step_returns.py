"""DDP004: a step function that returns early on an empty value drawn from its batch, before
the step's sync, called every step by a loop over batches (corpus41b's grpo2 `train_step`,
the listed certain hang B501/B701). Each silence has a twin that reports."""

from __future__ import annotations

from pathlib import Path

from helpers import lint_paths, lint_source

STEP = """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, tok, loader):
        self.model = DDP(model)
        self.tok = tok
        self.loader = loader

    def train_step(self, batch):
        ids = batch["input_ids"]
        outputs = self.model.module.generate(input_ids=ids)
        texts = self.tok.batch_decode(outputs.sequences)
        if not texts or not texts[0].strip():
            return {"loss": 0.0}
        loss = self.model(ids).loss
        loss.backward()
        return {"loss": loss.item()}

    def train(self):
        dist.init_process_group("nccl")
        for epoch in range(3):
            for batch in self.loader:
                self.train_step(batch)
"""


def _ddp004(src: str) -> list[int]:
    return [f.line for f in lint_source(src) if f.code == "DDP004"]


def test_an_empty_value_of_the_batch_ends_the_step_on_one_rank() -> None:
    [f] = [f for f in lint_source(STEP) if f.code == "DDP004"]
    assert f.line == 15
    assert "train_step() returns early here when `not texts or not texts[0].strip()`" in \
        f.message and "sync at line 18" in f.message and "loop at line 25" in f.message


def test_a_value_not_drawn_from_the_batch_is_every_ranks() -> None:
    assert _ddp004(STEP.replace("if not texts or", "if not self.tok or")) == []


def _return_after_backward(then: str = "") -> str:
    """STEP with its early return moved past the backward, and `then` after it."""
    return STEP.replace("""        if not texts or not texts[0].strip():
            return {"loss": 0.0}
        loss = self.model(ids).loss
        loss.backward()
""", """        loss = self.model(ids).loss
        loss.backward()
        if not texts or not texts[0].strip():
            return {"loss": 0.0}
""" + then)


def test_a_return_after_the_sync_skips_nothing() -> None:
    assert _ddp004(_return_after_backward()) == []


def test_a_parameter_the_loop_does_not_fill_with_its_batch() -> None:
    # the epoch number, not the batch, goes to the helper's first parameter
    other = STEP.replace("self.train_step(batch)", "self.train_step(epoch)")
    assert _ddp004(other) == []


def test_a_loop_over_step_numbers_is_no_batch_loop() -> None:
    other = STEP.replace("for batch in self.loader:", "for batch in range(100):")
    assert _ddp004(other) == []


def test_a_step_function_of_another_file_is_reported_at_the_call(tmp_path: Path) -> None:
    (tmp_path / "steps.py").write_text(STEP.split("    def train(self):")[0])
    (tmp_path / "run.py").write_text(
        "import torch.distributed as dist\nfrom steps import Trainer\n\n\n"
        "def main(model, tok, loader):\n    dist.init_process_group('nccl')\n"
        "    trainer = Trainer(model, tok, loader)\n    for batch in loader:\n"
        "        trainer.train_step(batch)\n")
    found = [(Path(f.path).name, f.line, f.message) for f in lint_paths([tmp_path])
             if f.code == "DDP004"]
    assert [(name, line) for name, line, _ in found] == [("run.py", 9)]
    assert "returns early at steps.py:15" in found[0][2] and "sync at steps.py:18" in found[0][2]


def test_the_sync_named_is_the_first_after_the_return() -> None:
    later = _return_after_backward("        dist.all_reduce(loss)\n")
    [f] = [f for f in lint_source(later) if f.code == "DDP004"]
    assert f.line == 17 and "sync at line 19" in f.message


def test_an_optimizer_step_is_no_wait() -> None:
    after = STEP.replace("""        loss.backward()
        return {"loss": loss.item()}""", """        loss.backward()
        if not texts:
            return {"loss": 0.0}
        self.opt.step()
        return {"loss": loss.item()}""").replace("""        if not texts or not texts[0].strip():
            return {"loss": 0.0}
""", "")
    assert _ddp004(after) == []


def test_the_batch_is_read_at_its_own_position() -> None:
    second = STEP.replace("def train_step(self, batch):", "def train_step(self, epoch, batch):") \
        .replace("self.train_step(batch)", "self.train_step(epoch, batch)")
    assert _ddp004(second) == [15]
