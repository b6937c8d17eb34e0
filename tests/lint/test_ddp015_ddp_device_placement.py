"""DDP015 device placement.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from pathlib import Path

from helpers import (
    ALL_BUT_PRINT,
    ddp_source,
    inline_lines,
    lint_paths_with_defaults,
    lint_source,
)


def test_set_device_in_another_file_places_the_model(tmp_path: Path) -> None:
    (tmp_path / "dist_utils.py").write_text(
        "import os\nimport torch\nimport torch.distributed as dist\n"
        "def enable():\n    torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
        "    dist.init_process_group('nccl')\n"
    )
    (tmp_path / "linear.py").write_text(
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
        "def setup(model):\n    model = model.cuda()\n    return DDP(model)\n"
    )
    assert [f.code for f in lint_paths_with_defaults([tmp_path], ALL_BUT_PRINT)] == []
    assert [f.code for f in lint_paths_with_defaults([tmp_path / "linear.py"], ALL_BUT_PRINT)] == [
        "DDP015"
    ]


def test_move_inside_the_wraps_arguments_comes_first() -> None:
    src = """\
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(model, rank):
    torch.cuda.set_device(rank)
    model = DDP(
        model.cuda(), device_ids=[rank])
    return model
"""
    assert inline_lines(src) == []
    moved_after = src.replace(
        "        model.cuda(), device_ids=[rank])\n",
        "        model, device_ids=[rank])\n    model.cuda()\n",
    )
    assert inline_lines(moved_after) == [("DDP015", 8)]


def test_the_same_move_again_after_the_wrap_is_a_no_op() -> None:
    src = """\
from torch.nn.parallel import DistributedDataParallel as DDP


def main(model, device, load):
    model.to(device)
    model = DDP(model, device_ids=[device])
    model = load(model)
    model.to(device)
    return model
"""
    assert inline_lines(src) == []
    assert inline_lines(
        src.replace("    model.to(device)\n    model = DDP", "    model = DDP")
    ) == [("DDP015", 7)]


CPU_ARM = ddp_source("""
    class Engine:
        def __init__(self, task, device):
            if device.type == "cuda":
                task = task.cuda(device)
            self.model, self.device = task, device

        def train(self):
            model = self.model
            if self.device.type == "cuda":
                model = DDP(model, device_ids=[self.device])
            else:
                model = DDP(model)
            return model
    """)


def test_the_arm_beside_a_gpu_wrap_is_the_cpu_path() -> None:
    assert [f.code for f in lint_source(CPU_ARM)] == []
    # A bare .cuda() in that arm is the pytorch/examples fallback for a launch that names no
    # device; not reported (0 true in 4 independent reviews).
    bare = CPU_ARM.replace(
        "            model = DDP(model)\n",
        "            model = model.cuda()\n            model = DDP(model)\n",
    )
    assert [f.code for f in lint_source(bare)] == []
    # With no arm that passes device_ids, the bare .cuda() is every process's placement.
    alone = bare.replace(", device_ids=[", ", output_device=[")
    assert [f.code for f in lint_source(alone)] == ["DDP015"]


def test_ddp_without_device_ids_needs_a_visible_bare_cuda() -> None:
    # A model placed by the caller (on its own rank's device, for all this file shows) is no
    # evidence that every process uses cuda:0.
    placed_elsewhere = (
        "import torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel\n\n\n"
        "def wrap(model):\n    dist.init_process_group('nccl')\n"
        "    return DistributedDataParallel(model)\n"
    )
    assert lint_source(placed_elsewhere) == []
    bare = placed_elsewhere.replace("    return Dist", "    model.cuda()\n    return Dist")
    assert [f.code for f in lint_source(bare)] == ["DDP015"]
    inline = placed_elsewhere.replace(
        "DistributedDataParallel(model)", "DistributedDataParallel(model.to('cuda'))"
    )
    assert [f.code for f in lint_source(inline)] == ["DDP015"]
