"""DDP013 accumulation without no_sync.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from pathlib import Path

from helpers import (
    ddp_source,
    finding_lines,
    lint_paths,
    lint_source,
)

NO_SYNC = ddp_source("""
    from contextlib import nullcontext
    def train(model, loader, opt, accum, rank):
        model = DDP(model, device_ids=[rank])
        for step, batch in enumerate(loader):
            ctx = model.no_sync if step % accum != 0 else nullcontext
            with ctx():
                model(batch).sum().backward()
            if step % accum == 0:
                opt.step()
                opt.zero_grad()
    """)


def test_no_sync_bound_to_a_name_counts() -> None:
    assert [f.code for f in lint_source(NO_SYNC)] == []
    without = NO_SYNC.replace("model.no_sync if step % accum != 0 else nullcontext", "nullcontext")
    assert [f.code for f in lint_source(without)] == ["DDP013"]


# DDP only for evaluation runs, FSDP for training (coconut): the accumulating loop never
# drives the DDP model.
MODES = """\
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.nn.parallel import DistributedDataParallel as DDP


def main(configs, model, loader, optimizer, rank):
    dist.init_process_group("nccl")
    if configs.only_eval:
        parallel_model = DDP(model, device_ids=[rank])
    else:
        parallel_model = FSDP(model, device_id=rank)
    if not configs.only_eval:
        for step, batch in enumerate(loader):
            loss = parallel_model(**batch).loss / configs.gradient_accumulation_steps
            loss.backward()
            if (step + 1) % configs.gradient_accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
"""


def test_accumulation_in_a_mode_whose_model_is_not_ddp_is_no_finding() -> None:
    assert finding_lines(MODES) == []


def test_accumulation_on_the_ddp_mode_is_reported() -> None:
    swapped = MODES.replace(
        "    if not configs.only_eval:\n        for", "    if configs.only_eval:\n        for"
    )
    assert finding_lines(swapped) == [("DDP013", 17)]
    always = MODES.replace(
        "    if not configs.only_eval:\n        for", "    if configs.train:\n        for"
    )
    assert finding_lines(always) == [("DDP013", 17)]


COUNTER_EQ = """\
import torch
from torch.nn.parallel import DistributedDataParallel


def train(model, loader, optimizer, gradient_interval, device):
    model = DistributedDataParallel(model, device_ids=[device])
    start_id = 0
    for batch_id, batch in enumerate(loader):
        loss = model(batch) / gradient_interval
        loss.backward()
        if batch_id - start_id + 1 == gradient_interval:
            optimizer.step()
            optimizer.zero_grad()
            start_id = batch_id + 1
"""


def test_a_micro_step_counter_compared_with_eq_is_accumulation() -> None:
    assert finding_lines(COUNTER_EQ) == [("DDP013", 12)]
    # `==` against any other name is no micro-step count
    assert finding_lines(COUNTER_EQ.replace("== gradient_interval", "== total_batches")) == []
    assert (
        finding_lines(
            COUNTER_EQ.replace(
                "(model, device_ids=[device])",
                "(model, device_ids=[device])\n    ctx = model.no_sync",
            )
        )
        == []
    )


STEP_METHOD = """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, model, optimizer, num_accum):
        self.model = DDP(model)
        self.optimizer = optimizer
        self.num_accum = num_accum

    def step(self, x, global_steps=1):
        loss = self.model(x).mean()
        loss.div(self.num_accum).backward()
        if global_steps % self.num_accum == 0:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
"""


def test_the_counting_if_inside_an_accumulation_mode_if() -> None:
    """Swin's shape: the backward sits inside `if steps > 1:`, outside the counting `if`."""
    src = COUNTER_EQ.replace(
        "        loss = model(batch) / gradient_interval\n"
        "        loss.backward()\n"
        "        if batch_id - start_id + 1 == gradient_interval:\n",
        "        loss = model(batch) / gradient_interval\n"
        "        if gradient_interval > 1:\n"
        "            loss.backward()\n"
        "            if (batch_id + 1) % gradient_interval == 0:\n",
    ).replace(
        "            optimizer.step()\n            optimizer.zero_grad()\n"
        "            start_id = batch_id + 1\n",
        "                optimizer.step()\n                optimizer.zero_grad()\n"
        "        else:\n            loss.backward()\n            optimizer.step()\n",
    )
    assert finding_lines(src) == [("DDP013", 13)]


def test_accumulation_in_a_method_called_once_per_batch() -> None:
    assert finding_lines(STEP_METHOD) == [("DDP013", 15)]
    # a step after every backward, whatever the counter says, is no accumulation
    every = STEP_METHOD.replace(
        "        if global_steps % self.num_accum == 0:\n            self.optimizer.step()\n",
        "        self.optimizer.step()\n"
        "        if global_steps % self.num_accum == 0:\n"
        "            self.optimizer.step()\n",
    )
    assert finding_lines(every) == []
    # AMP's scaler.step(optimizer=...) is the optimizer's step too
    scaler = STEP_METHOD.replace(
        "self.optimizer.step()", "self.scaler.step(optimizer=self.optimizer)"
    )
    assert finding_lines(scaler) == [("DDP013", 15)]


TRAINER_ENGINE = """\
import torch


class Trainer:
    def __init__(self, opts, model, optimizer, accum_freq):
        self.model = model
        self.optimizer = optimizer
        self.accum_freq = accum_freq

    def train_epoch(self, loader):
        for batch_id, batch in enumerate(loader):
            loss = self.model(batch)
            loss.backward()
            if (batch_id + 1) % self.accum_freq == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()
"""


MAIN = """\
import torch
import torch.distributed as dist
from engine.training import Trainer


def main(opts, net, optimizer):
    dist.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[opts.gpu])
    trainer = Trainer(opts=opts, model=model, optimizer=optimizer, accum_freq=4)
    trainer.train_epoch(opts.loader)
"""


def _tree(
    tmp_path: Path,
    main: str = MAIN,
    engine: str = TRAINER_ENGINE,
    extra: dict[str, str] | None = None,
) -> list[tuple[str, str, int]]:
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "training.py").write_text(engine)
    (tmp_path / "main_train.py").write_text(main)
    for name, src in (extra or {}).items():
        (tmp_path / name).write_text(src)
    return [(Path(f.path).name, f.code, f.line) for f in lint_paths([tmp_path])]


def test_a_trainer_handed_the_wrapper_by_another_file_accumulates(tmp_path: Path) -> None:
    assert _tree(tmp_path) == [("training.py", "DDP013", 15)]
    [f] = lint_paths([tmp_path])
    assert "(the DDP wrapper comes from main_train.py:8)" in f.message


def test_the_wrapper_handed_over_needs_a_wrapper_and_no_no_sync(tmp_path: Path) -> None:
    bare = MAIN.replace(
        "torch.nn.parallel.DistributedDataParallel(net, device_ids=[opts.gpu])", "net.cuda()"
    )
    synced = MAIN.replace(
        "    trainer.train_epoch(opts.loader)\n",
        "    with model.no_sync():\n        trainer.train_epoch(opts.loader)\n",
    )
    # the file wraps a model in DDP but hands the trainer the bare one
    other = MAIN.replace("Trainer(opts=opts, model=model,", "Trainer(opts=opts, model=net,")
    for name, main in [("bare", bare), ("synced", synced), ("other", other)]:
        (tmp_path / name).mkdir()
        assert _tree(tmp_path / name, main=main) == [], name


def test_a_trainer_name_defined_twice_in_the_tree_is_not_followed(tmp_path: Path) -> None:
    other = "class Trainer:\n    def fit(self):\n        pass\n"
    # linted before and after engine/training.py: neither order picks one of the two
    (tmp_path / "a").mkdir()
    assert _tree(tmp_path / "a", extra={"toy.py": other}) == []
    (tmp_path / "b" / "zoo").mkdir(parents=True)
    assert _tree(tmp_path / "b", extra={"zoo/toy.py": other}) == []
