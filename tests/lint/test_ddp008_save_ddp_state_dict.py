"""DDP008 a wrapper checkpoint the script's own resume cannot read.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from helpers import (
    ALL_BUT_PRINT,
    LINT_FIXTURES,
    ddp_source,
    finding_lines,
    fixture_lines,
    lint_source,
    lint_with_defaults,
)


def test_the_bare_model_saved_in_the_mode_that_never_wraps() -> None:
    name = "DDP008_wrapper_save_by_mode.py"
    assert fixture_lines(name) == []
    # Wrapped on every run: the else arm now saves the wrapper, which the resume cannot read.
    got = fixture_lines(
        name, "    if ddp:\n        unet = DDP(", "    if True:\n        unet = DDP("
    )
    assert got == [("DDP008", 31)]
    # The same wrap written as `if not ddp: pass else: wrap` is the same mode.
    got = fixture_lines(
        name,
        "    if ddp:\n        unet = DDP(unet, device_ids=[device])\n",
        "    if not ddp:\n        pass\n    else:\n        unet = DDP(unet, device_ids=[device])\n",
    )
    assert got == []


def test_a_strict_load_of_another_model_is_not_this_checkpoints_resume() -> None:
    name = "DDP008_wrapper_save_by_mode.py"
    no_resume = (
        "    if args.resume:\n        unet.load_state_dict(torch.load(args.unet, "
        "map_location=device))\n"
    )
    wrapped = "    if True:\n        unet = DDP("
    # Only the autoencoder is loaded strictly: the wrapper's checkpoint is never read back.
    got = [
        c
        for c, _ in lint_with_defaults(
            (LINT_FIXTURES / name)
            .read_text(encoding="utf-8")
            .replace(no_resume, "")
            .replace("    if ddp:\n        unet = DDP(", wrapped),
            name,
            ALL_BUT_PRINT,
        )
    ]
    assert "DDP008" not in got


RESUME_STRIPPED = ddp_source("""
    def main(rank, resume):
        dist.init_process_group("nccl")
        model = torch.nn.Linear(2, 2).cuda()
        if resume:
            sd = torch.load(resume, map_location="cpu")
            sd = {k.replace("module.", ""): v for k, v in sd.items()}
            model.load_state_dict(sd)
        model = DDP(model, device_ids=[rank])
        if rank == 0:
            torch.save(model.state_dict(), "final.pth")
    """)


def test_a_resume_that_strips_the_prefix_reads_a_wrapper_checkpoint() -> None:
    assert [f.code for f in lint_source(RESUME_STRIPPED)] == []
    for strip in (
        "{k[7:]: v for k, v in sd.items()}",
        '{k.removeprefix("module."): v for k, v in sd.items()}',
    ):
        src = RESUME_STRIPPED.replace('{k.replace("module.", ""): v for k, v in sd.items()}', strip)
        assert [f.code for f in lint_source(src)] == [], strip
    plain = RESUME_STRIPPED.replace(
        '        sd = {k.replace("module.", ""): v for k, v in sd.items()}\n', ""
    )
    assert [f.code for f in lint_source(plain)] == ["DDP008"]


def test_the_bare_arm_of_a_wrap_test_saves_the_bare_model() -> None:
    src = RESUME_STRIPPED.replace(
        '        sd = {k.replace("module.", ""): v for k, v in sd.items()}\n', ""
    ).replace(
        'torch.save(model.state_dict(), "final.pth")',
        'torch.save(model.module.state_dict() if hasattr(model, "module") '
        'else model.state_dict(), "final.pth")',
    )
    assert [f.code for f in lint_source(src)] == []
    flipped = src.replace('if hasattr(model, "module")', "if rank > 1")
    assert [f.code for f in lint_source(flipped)] == ["DDP008"]


# The wrapper's state_dict saved under one name, a checkpoint of another name loaded strictly
# before the wrap (PVDM: `model_last.pth` is written by the trainer, unwrapped).
OTHER_FILES = """\
import os

import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def main(args, model, rank, rootdir):
    if args.resume:
        ckpt = torch.load(os.path.join(args.folder, "model_last.pth"), map_location="cpu")
        model.load_state_dict(ckpt)
    model = DDP(model, device_ids=[rank])
    train(model)
    if rank == 0:
        torch.save(model.state_dict(), rootdir + "net_meta.pth")
"""


def test_a_save_and_a_load_of_different_files_are_no_resume_mismatch() -> None:
    assert finding_lines(OTHER_FILES) == []


def test_the_same_file_saved_wrapped_and_loaded_unwrapped_is_reported() -> None:
    same = OTHER_FILES.replace('"model_last.pth"', '"net_meta.pth"')
    assert finding_lines(same) == [("DDP008", 14)]


# Issue 35, fifth round (tuning after the blind run): the wrap's own test, whatever it reads
# (`n_devices > 1` here), marks the arms that run unwrapped, matched by its structure.
BY_COUNT = "DDP008_wrapper_save_by_device_count.py"
COUNT_WRAP = "    if n_devices > 1:\n        net = DDP("


def test_the_wraps_own_test_marks_the_unwrapped_arm_whatever_it_reads() -> None:
    assert fixture_lines(BY_COUNT) == []
    # Wrapped on every run: the conditional's bare arm and the bare `if` arm save the wrapper.
    assert fixture_lines(BY_COUNT, COUNT_WRAP, "    if True:\n        net = DDP(") == [
        ("DDP008", 26),
        ("DDP008", 32),
    ]
    # Another test than the wrap's (`> 2`): its else arm runs wrapped with two devices.
    got = fixture_lines(BY_COUNT, "if n_devices > 1\n", "if n_devices > 2\n")
    assert got == [("DDP008", 26)]
    # The count spelled `len(gpus)`, and the wrap's test held in a flag: the same test.
    got = fixture_lines(
        BY_COUNT, "    n_devices = torch.cuda.device_count()", "    n_devices = len(opts.gpus)"
    )
    assert got == []
    got = fixture_lines(
        BY_COUNT, COUNT_WRAP, "    multi = n_devices > 1\n    if multi:\n        net = DDP("
    )
    assert got == []
    # A wrap under `if n_devices > 1 and ...`: still none where `n_devices > 1` fails.
    got = fixture_lines(
        BY_COUNT, COUNT_WRAP, "    if n_devices > 1 and not opts.local:\n        net = DDP("
    )
    assert got == []


def test_a_test_whose_names_change_between_wrap_and_save_is_another_test() -> None:
    got = fixture_lines(
        BY_COUNT,
        "    for step in range(opts.steps):",
        "    n_devices = opts.devices\n    for step in range(opts.steps):",
    )
    assert got == [("DDP008", 27), ("DDP008", 33)]


SAVE_HELPER = ddp_source("""
    def main(args, rank, num_gpus):
        model = torch.nn.Linear(2, 2).cuda(rank)
        if args.resume:
            model.load_state_dict(torch.load(args.resume)["net"])
        if num_gpus > 1:
            model = DDP(model, device_ids=[rank])

        def save(path):
            torch.save({"net": model.module.state_dict() if num_gpus > 1
                        else model.state_dict()}, path)

        save(args.resume)
    """)


def test_the_same_test_read_through_the_same_binding_in_another_function() -> None:
    # A nested function reads the enclosing `num_gpus`: the same test.
    assert finding_lines(SAVE_HELPER) == []
    # A parameter of its own is another binding, whatever its name.
    own = SAVE_HELPER.replace("def save(path):", "def save(path, num_gpus=2):")
    assert finding_lines(own) == [("DDP008", 14)]


SELF_TEST = """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, args, rank):
        self.args = args
        self.net = torch.nn.Linear(2, 2).cuda(rank)
        if args.resume:
            self.net.load_state_dict(torch.load(args.resume)["net"])
        if self.args.world_size > 1:
            self.net = DDP(self.net, device_ids=[rank])

    def save(self):
        torch.save({"net": self.net.module.state_dict() if self.args.world_size > 1
                    else self.net.state_dict()}, self.args.resume)
"""


def test_the_same_test_through_self_in_another_method() -> None:
    assert finding_lines(SELF_TEST) == []
    wrapped = SELF_TEST.replace(
        "        if self.args.world_size > 1:\n            self.net = DDP(",
        "        if True:\n            self.net = DDP(",
    )
    assert finding_lines(wrapped) == [("DDP008", 16)]
