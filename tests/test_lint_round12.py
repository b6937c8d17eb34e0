"""Issue 20, twelfth round: real bugs the linter missed on the round's tuning halves (an
independent audit of 162 files), each as code of our own that must be reported, with the
near-identical code that must not be.

- DDP004: a skip on a test of the batch's items; a rank that leaves or skips the step on its
  own non-finite loss.
- DDP013: a micro-step counter compared with `==`; accumulation in a method called once per
  batch; a trainer that gets the DDP wrapper from another file.
- DDP024 (new): the training forward through the wrapper's `.module`, which arms no gradient
  all-reduce.
"""

from __future__ import annotations

from pathlib import Path

from helpers import lint_paths, lint_source


def codes(src: str) -> list[tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(src)]


# -- DDP004 -----------------------------------------------------------------------------

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
    assert codes(EMPTY_TARGETS) == [("DDP004", 7)]
    # a test of something else than the batch (the enumerate index) skips no batch
    other = EMPTY_TARGETS.replace("any(len(t) < 1 for t in targets)",
                                  "any(len(t) < 1 for t in [it])")
    assert codes(other) == []


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
        "        scaler.scale(loss).backward()\n")
    assert [(f.code, f.line, "skips the step" in f.message) for f in lint_source(skip)] == [
        ("DDP004", 11, True)]
    # a gradient norm is read after DDP's all-reduce: every rank holds the same one
    norm = NAN_BREAK.replace("torch.isnan(loss_sum)", "torch.isnan(grad_norm)")
    assert codes(norm) == []


def test_a_single_process_script_may_skip_what_it_likes(tmp_path: Path) -> None:
    alone = NAN_BREAK.replace("import torch.distributed as dist\n", "")
    assert codes(alone) == []
    # a trainer module that never names torch.distributed: reported once a file that forms
    # the group imports it
    (tmp_path / "trainer.py").write_text(EMPTY_TARGETS.replace(
        "import torch.distributed as dist\n", ""))
    assert [f.code for f in lint_paths([tmp_path])] == []
    (tmp_path / "main.py").write_text("import torch.distributed as dist\nfrom trainer import "
                                      "train\ndist.init_process_group('gloo')\n")
    assert [(Path(f.path).name, f.code) for f in lint_paths([tmp_path])] == [
        ("trainer.py", "DDP004")]


def test_a_nan_test_every_rank_shares_is_no_finding() -> None:
    shared = NAN_BREAK.replace("        if torch.isnan(loss_sum):",
                               "        dist.all_reduce(loss_sum)\n"
                               "        if torch.isnan(loss_sum):")
    assert codes(shared) == []
    helper = NAN_BREAK.replace("        if torch.isnan(loss_sum):",
                               "        loss_sum = reduce_mean(loss_sum)\n"
                               "        if torch.isnan(loss_sum):")
    assert codes(helper) == []
    # a NaN check that ends the process is a failure the launcher sees, not a skipped step
    fail = NAN_BREAK.replace("            break", "            raise RuntimeError('nan')")
    assert codes(fail) == []
    # not a batch loop
    other = NAN_BREAK.replace("for data in train_dl:", "for data in range(10):")
    assert codes(other) == []


# -- DDP013 -----------------------------------------------------------------------------

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
    assert codes(COUNTER_EQ) == [("DDP013", 12)]
    # `==` against any other name is no micro-step count
    assert codes(COUNTER_EQ.replace("== gradient_interval", "== total_batches")) == []
    assert codes(COUNTER_EQ.replace("(model, device_ids=[device])",
                                    "(model, device_ids=[device])\n"
                                    "    ctx = model.no_sync")) == []


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
        "            if (batch_id + 1) % gradient_interval == 0:\n").replace(
        "            optimizer.step()\n            optimizer.zero_grad()\n"
        "            start_id = batch_id + 1\n",
        "                optimizer.step()\n                optimizer.zero_grad()\n"
        "        else:\n            loss.backward()\n            optimizer.step()\n")
    assert codes(src) == [("DDP013", 13)]


def test_accumulation_in_a_method_called_once_per_batch() -> None:
    assert codes(STEP_METHOD) == [("DDP013", 15)]
    # a step after every backward, whatever the counter says, is no accumulation
    every = STEP_METHOD.replace("        if global_steps % self.num_accum == 0:\n"
                                "            self.optimizer.step()\n",
                                "        self.optimizer.step()\n"
                                "        if global_steps % self.num_accum == 0:\n"
                                "            self.optimizer.step()\n")
    assert codes(every) == []
    # AMP's scaler.step(optimizer=...) is the optimizer's step too
    scaler = STEP_METHOD.replace("self.optimizer.step()",
                                 "self.scaler.step(optimizer=self.optimizer)")
    assert codes(scaler) == [("DDP013", 15)]


ENGINE = """\
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


def _tree(tmp_path: Path, main: str = MAIN, engine: str = ENGINE,
          extra: dict[str, str] | None = None) -> list[tuple[str, str, int]]:
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
    bare = MAIN.replace("torch.nn.parallel.DistributedDataParallel(net, device_ids=[opts.gpu])",
                        "net.cuda()")
    synced = MAIN.replace("    trainer.train_epoch(opts.loader)\n",
                          "    with model.no_sync():\n        trainer.train_epoch(opts.loader)\n")
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


# -- DDP024 -----------------------------------------------------------------------------

MODULE_FORWARD = """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


class Runner:
    def __init__(self, model, optim, args):
        self.model = DDP(model, device_ids=[args.gpu])
        self.optim = optim
        self.args = args

    def train(self, loader):
        for step_i, batch in enumerate(loader):
            if self.args.distributed:
                results = self.model.module.train_step(batch)
            else:
                results = self.model.train_step(batch)
            loss = results["loss"]
            loss.backward()
            self.optim.step()
            self.optim.zero_grad()
"""


def test_a_training_forward_through_module_syncs_no_gradient() -> None:
    assert codes(MODULE_FORWARD) == [("DDP024", 14)]
    [f] = lint_source(MODULE_FORWARD)
    assert "`self.model.module.train_step()`" in f.message and f.severity == "error"
    # through assignments and arithmetic to the loss that is backpropagated
    chained = MODULE_FORWARD.replace('            loss = results["loss"]\n',
                                     '            flow = results["loss"] * 0.5\n'
                                     '            loss = flow + 1.0\n')
    assert codes(chained) == [("DDP024", 14)]


def test_uses_of_module_that_are_no_training_forward() -> None:
    # the wrapper itself is called in the same step (an auxiliary forward beside it)
    both = MODULE_FORWARD.replace('            loss = results["loss"]\n',
                                  '            loss = results["loss"] + self.model(batch)\n')
    assert codes(both) == []
    # a target from a frozen copy: its output is cut from the graph
    detached = MODULE_FORWARD.replace("results = self.model.module.train_step(batch)",
                                      "results = self.model.module.train_step(batch).detach()")
    assert codes(detached) == []
    # evaluation under no_grad
    no_grad = MODULE_FORWARD.replace(
        "                results = self.model.module.train_step(batch)\n",
        "                with torch.no_grad():\n"
        "                    results = self.model.module.train_step(batch)\n")
    assert codes(no_grad) == []
    decorated = MODULE_FORWARD.replace("    def train(self, loader):",
                                       "    @torch.no_grad()\n    def train(self, loader):")
    assert codes(decorated) == []
    # the call inline in the backward's receiver: reported, unless cut from the graph
    inline = MODULE_FORWARD.replace('            loss = results["loss"]\n'
                                    '            loss.backward()\n',
                                    '            self.model.module(batch).sum().backward()\n')
    assert ("DDP024", 17) in codes(inline)
    assert ("DDP024", 17) not in codes(inline.replace(".sum().backward()",
                                                      ".detach().sum().backward()"))
    # no optimizer step in the loop: not a training step
    no_step = MODULE_FORWARD.replace("            self.optim.step()\n", "")
    assert codes(no_step) == []
    # the loss that is backpropagated does not come from it
    other = MODULE_FORWARD.replace('loss = results["loss"]', 'loss = batch["loss"]')
    assert codes(other) == []
    # gradients all-reduced by hand
    by_hand = MODULE_FORWARD.replace(
        "            self.optim.step()\n",
        "            for p in self.model.parameters():\n"
        "                torch.distributed.all_reduce(p.grad)\n"
        "            self.optim.step()\n")
    assert codes(by_hand) == []
    # reading the module is no forward
    params = MODULE_FORWARD.replace("self.model.module.train_step(batch)",
                                    "self.model.module.state_dict()")
    assert codes(params) == []


def test_a_local_name_is_the_wrapper_only_where_it_was_wrapped() -> None:
    src = """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(model):
    model = DDP(model)
    return model


def train(model, loader, optimizer):
    for batch in loader:
        loss = model.module(batch).sum()
        loss.backward()
        optimizer.step()
"""
    assert codes(src) == []
    here = src.replace("def train(model, loader, optimizer):\n",
                       "def train(model, loader, optimizer):\n    model = DDP(model)\n")
    assert codes(here) == [("DDP024", 13)]
