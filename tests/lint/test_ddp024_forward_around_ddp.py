"""DDP024 a training forward around the DDP wrapper.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from helpers import (
    finding_lines,
    lint_source,
)

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
    assert finding_lines(MODULE_FORWARD) == [("DDP024", 14)]
    [f] = lint_source(MODULE_FORWARD)
    assert "`self.model.module.train_step()`" in f.message and f.severity == "error"
    # through assignments and arithmetic to the loss that is backpropagated
    chained = MODULE_FORWARD.replace(
        '            loss = results["loss"]\n',
        '            flow = results["loss"] * 0.5\n            loss = flow + 1.0\n',
    )
    assert finding_lines(chained) == [("DDP024", 14)]


def test_uses_of_module_that_are_no_training_forward() -> None:
    # the wrapper itself is called in the same step (an auxiliary forward beside it)
    both = MODULE_FORWARD.replace(
        '            loss = results["loss"]\n',
        '            loss = results["loss"] + self.model(batch)\n',
    )
    assert finding_lines(both) == []
    # a target from a frozen copy: its output is cut from the graph
    detached = MODULE_FORWARD.replace(
        "results = self.model.module.train_step(batch)",
        "results = self.model.module.train_step(batch).detach()",
    )
    assert finding_lines(detached) == []
    # evaluation under no_grad
    no_grad = MODULE_FORWARD.replace(
        "                results = self.model.module.train_step(batch)\n",
        "                with torch.no_grad():\n"
        "                    results = self.model.module.train_step(batch)\n",
    )
    assert finding_lines(no_grad) == []
    decorated = MODULE_FORWARD.replace(
        "    def train(self, loader):", "    @torch.no_grad()\n    def train(self, loader):"
    )
    assert finding_lines(decorated) == []
    # the call inline in the backward's receiver: reported, unless cut from the graph
    inline = MODULE_FORWARD.replace(
        '            loss = results["loss"]\n            loss.backward()\n',
        "            self.model.module(batch).sum().backward()\n",
    )
    assert ("DDP024", 17) in finding_lines(inline)
    assert ("DDP024", 17) not in finding_lines(
        inline.replace(".sum().backward()", ".detach().sum().backward()")
    )
    # no optimizer step in the loop: not a training step
    no_step = MODULE_FORWARD.replace("            self.optim.step()\n", "")
    assert finding_lines(no_step) == []
    # the loss that is backpropagated does not come from it
    other = MODULE_FORWARD.replace('loss = results["loss"]', 'loss = batch["loss"]')
    assert finding_lines(other) == []
    # gradients all-reduced by hand
    by_hand = MODULE_FORWARD.replace(
        "            self.optim.step()\n",
        "            for p in self.model.parameters():\n"
        "                torch.distributed.all_reduce(p.grad)\n"
        "            self.optim.step()\n",
    )
    assert finding_lines(by_hand) == []
    # reading the module is no forward
    params = MODULE_FORWARD.replace(
        "self.model.module.train_step(batch)", "self.model.module.state_dict()"
    )
    assert finding_lines(params) == []


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
    assert finding_lines(src) == []
    here = src.replace(
        "def train(model, loader, optimizer):\n",
        "def train(model, loader, optimizer):\n    model = DDP(model)\n",
    )
    assert finding_lines(here) == [("DDP024", 13)]
