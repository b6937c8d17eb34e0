"""DDP025 the global rank as a device index, or the local rank as the global rank (its
fixture is tests/lint/fixtures/DDP025_rank_kind_mixup.py)."""

from __future__ import annotations

import pytest
from helpers import ALL_BUT_PRINT, HEAD_DIST, lint_with_defaults

from ddpguard.lint import RULES
from ddpguard.lint.registry import Finding

# The mix-up the analysis finds, whichever rule reports it: DDP025 where the program shows it
# runs on several nodes, DDP046 (preview) where nothing does.
MIXUP = ("DDP025", "DDP046")


def lint_all(src: str, path: str) -> list[Finding]:
    return lint_with_defaults(src, path, ALL_BUT_PRINT)


def test_the_message_says_it_bites_on_several_nodes() -> None:
    src = HEAD_DIST + ("import os\nnode = int(os.environ['NODE_RANK'])\n"
                       "rank = dist.get_rank()\ntorch.cuda.set_device(rank)\n")
    [f] = lint_with_defaults(src, "t.py")
    assert f.code == "DDP025" and "second node" in f.message and "get_rank()" in f.message
    assert "runs on more than one node: it reads `NODE_RANK` at t.py:6" in f.message


def test_without_evidence_of_a_second_node_it_is_the_preview_rule() -> None:
    # every blind first finding of this kind without it was judged debatable: right on the
    # one node every shipped launch uses
    src = HEAD_DIST + "rank = dist.get_rank()\ntorch.cuda.set_device(rank)\n"
    assert lint_with_defaults(src, "t.py") == []
    [f] = lint_all(src, "t.py")
    assert f.code == "DDP046" and "nothing in the program shows" in f.message
    assert RULES["DDP046"].preview


EVIDENCE = [
    "node = os.environ['SLURM_PROCID']\n",
    "parser.add_argument('--nnodes', type=int, default=1)\n",
    "world = ngpus_per_node * args.world_size\n",
    "os.environ['MASTER_ADDR'] = '10.1.2.3'\n",
    "import determined\n",
]
NO_EVIDENCE = [
    "os.environ['MASTER_ADDR'] = '127.0.0.1'\n",
    "cmd = 'torchrun --nnodes=1 train.py'\n",
    "world = ngpus * args.world_size\n",
    # a graph's nodes (corpus36c's 3D-EMGP, debatable at first contact for this evidence)
    "drop_num = int(node_num * self.aug_strength)\n",
    "n = data['num_nodes']\n",
]


@pytest.mark.parametrize("line", EVIDENCE + NO_EVIDENCE)
def test_what_shows_a_second_node(line: str) -> None:
    src = HEAD_DIST + "import os\n" + line + "torch.cuda.set_device(dist.get_rank())\n"
    # (a written-out address is DDP051's too: the group meets at one machine)
    [f] = [f for f in lint_all(src, "t.py") if f.code != "DDP051"]
    assert f.code == ("DDP025" if line in EVIDENCE else "DDP046")


def test_a_rank_read_in_another_function_is_not_this_ones() -> None:
    # `rank` of `worker` is mp.spawn's index; `main` reads LOCAL_RANK into its own `rank`.
    src = HEAD_DIST + (
        "import os\n\n"
        "def main():\n    rank = int(os.environ['LOCAL_RANK'])\n    torch.cuda.set_device(rank)\n\n"
        "def worker(rank, world):\n"
        "    dist.init_process_group('nccl', rank=rank, world_size=world)\n")
    assert lint_with_defaults(src, "t.py") == []


def test_on_by_default() -> None:
    assert RULES["DDP025"].default and not RULES["DDP025"].preview


TRAINER = """\
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, net, rank, world_size):
        self.rank = rank
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local_rank)
        device_ids = [rank] if torch.cuda.is_available() else None
        self.model = DDP(net.cuda(local_rank), device_ids=device_ids)


def main(net):
    proc = int(os.environ["SLURM_PROCID"])
    dist.init_process_group("nccl", rank=proc, world_size=int(os.environ["SLURM_NTASKS"]))
    Trainer(net, proc, world_size=2)
"""


def test_a_global_rank_handed_to_a_constructor_is_the_device_index_there() -> None:
    # aibalance's shape (corpus35n B125): SLURM_PROCID passed to the trainer's constructor,
    # used as DDP's device through a name assigned under an "is there a GPU" test
    [f] = lint_with_defaults(TRAINER, "t.py")
    assert (f.code, f.line) == ("DDP025", 13)
    assert "SLURM_PROCID" in f.message and "to Trainer() at t.py:20" in f.message
    # the attribute it keeps is the same rank, in another method too
    kept = TRAINER.replace(
        "        self.model = DDP(net.cuda(local_rank), device_ids=device_ids)\n",
        "\n    def wrap(self, net):\n        return DDP(net, device_ids=[self.rank])\n")
    assert [(f.code, f.line) for f in lint_with_defaults(kept, "t.py")] == [("DDP025", 16)]


def test_a_constructor_handed_the_local_rank_or_a_spawn_index_is_silent() -> None:
    local = TRAINER.replace('os.environ["SLURM_PROCID"]', 'os.environ["SLURM_LOCALID"]')
    assert [f.code for f in lint_all(local, "t.py") if f.code in MIXUP] \
        == ["DDP025"]   # only the group's rank=, the local rank: not the device index
    assert all(f.line != 13 for f in lint_with_defaults(local, "t.py"))
    # mp.spawn's index: the process's place on its own node, nothing to say
    spawned = TRAINER.replace('    proc = int(os.environ["SLURM_PROCID"])\n', "").replace(
        "def main(net):", "def main(proc, net):") + (
        "\n\nif __name__ == '__main__':\n"
        "    torch.multiprocessing.spawn(main, args=(None,), nprocs=2)\n")
    assert [f for f in lint_all(spawned, "t.py") if f.code in MIXUP] == []


def test_a_name_holds_what_was_assigned_before_the_read() -> None:
    # HyCTAS's shape (corpus35p tuning): the device is set from the launcher's --local_rank,
    # and only then is the attribute reassigned the global rank (read later for device_ids)
    src = HEAD_DIST + (
        "import argparse\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "def main(net):\n"
        "    parser = argparse.ArgumentParser()\n"
        "    parser.add_argument('--local_rank', type=int, default=0)\n"
        "    args = parser.parse_args()\n"
        "    torch.cuda.set_device(args.local_rank)\n"
        "    dist.init_process_group('nccl')\n"
        "    args.local_rank = dist.get_rank()\n"
        "    return DDP(net, device_ids=[args.local_rank])\n")
    lines = [f.line for f in lint_all(src, "t.py") if f.code in MIXUP]
    assert lines == [15]
    # inside a loop the later assignment reaches the read on the next turn
    looped = src.replace("    torch.cuda.set_device(args.local_rank)\n",
                         "    for _ in range(2):\n        torch.cuda.set_device(args.local_rank)\n"
                         "        args.local_rank = dist.get_rank()\n")
    assert 13 in [f.line for f in lint_all(looped, "t.py") if f.code in MIXUP]


def test_a_rank_passed_only_where_one_rank_is_let_through_is_that_rank() -> None:
    # so-vits-svc's evaluate() (corpus35o F9, false at first contact): called under `rank ==
    # 0 and ...`, its `rank` is 0, a device every node has
    src = HEAD_DIST + (
        "def evaluate(model, batch, rank):\n"
        "    return model(batch.cuda(rank))\n\n"
        "def train(model, loader, epochs):\n"
        "    rank = dist.get_rank()\n"
        "    for epoch in range(epochs):\n"
        "        if rank == 0 and epoch % 5 == 0:\n"
        "            evaluate(model, next(iter(loader)), rank)\n")
    assert [f for f in lint_all(src, "t.py") if f.code in MIXUP] == []
    every = src.replace("        if rank == 0 and epoch % 5 == 0:\n    ", "")
    assert [f.line for f in lint_all(every, "t.py") if f.code in MIXUP] == [6]


def test_a_constant_argument_is_the_single_process_path_and_tells_nothing() -> None:
    # `setup(0, 1)` (a debugging entry, no test around it) beside the launcher's call: the
    # launcher's call decides the kind
    src = HEAD_DIST + (
        "import os\n\n"
        "def setup(rank, world):\n"
        "    dist.init_process_group('nccl', rank=rank, world_size=world)\n\n"
        "def debug():\n    setup(0, 1)\n\n"
        "def launch():\n    setup(int(os.environ['LOCAL_RANK']), int(os.environ['WORLD_SIZE']))\n")
    assert [f.line for f in lint_all(src, "t.py") if f.code in MIXUP] == [8]
