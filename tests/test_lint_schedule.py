"""Issue 20: the collective schedule per rank class. One test per inference the analysis
makes; each fails when that inference is taken out."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from ddpguard.lint import Selection, lint_paths, lint_source
from ddpguard.lint.analysis.divergence import explain
from ddpguard.lint.analysis.ranks import FALSE, NODE_LEADERS, OTHERS, RANK0, TRUE, UNKNOWN, evaluate
from ddpguard.lint.analysis.walker import build

HEAD = """\
import os
import pickle
import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
"""
ALL = Selection(select=("ALL",), ignore=("DDP018",))


def found(src: str, selection: Selection = ALL) -> list[tuple[str, int]]:
    source = HEAD + textwrap.dedent(src)
    return [(f.code, f.line - HEAD.count("\n")) for f in lint_source(source, "t.py", selection)]


def codes(src: str) -> list[str]:
    return [c for c, _ in found(src)]


@pytest.mark.parametrize(("setup", "test", "values"), [
    ("", "rank == 0", (TRUE, FALSE, FALSE)),
    ("", "local_rank > 0", (FALSE, TRUE, FALSE)),
    ("", "RANK in {-1, 0}", (TRUE, FALSE, FALSE)),
    ("", "rank == dst", (TRUE, FALSE, FALSE)),             # dst: the designated rank
    ("", "rank == 1", (FALSE, UNKNOWN, UNKNOWN)),          # some ranks > 0 only
    ("", "i % world_size != rank", (UNKNOWN, UNKNOWN, UNKNOWN)),
    ("", "is_main_process()", (TRUE, FALSE, FALSE)),
    ("", "du.is_master_proc()", (TRUE, FALSE, FALSE)),     # a predicate by its shape
    ("", "is_local_master_proc()", (TRUE, FALSE, TRUE)),
    ("", "args.rank % ngpus_per_node == 0", (TRUE, FALSE, TRUE)),
    ("", "rank % 2 == 0", (UNKNOWN, UNKNOWN, UNKNOWN)),      # rank 2 is even too
    ("ddp_rank = int(os.environ['RANK'])\nmaster_process = ddp_rank == 0\n"
     "master_process = True\n", "master_process", (TRUE, FALSE, FALSE)),
    ("ddp_rank = int(os.environ['RANK'])\nleader = ddp_rank == 0\nleader = True\n",
     "leader", (TRUE, FALSE, FALSE)),                     # a flag by its provenance
    ("", "not args.distributed or rank == 0", (TRUE, FALSE, FALSE)),
    ("", "epoch % 10 == 0 and rank == 0", (UNKNOWN, FALSE, FALSE)),
    ("", "dist.get_world_size() > 1", (TRUE, TRUE, TRUE)),
    # the file's own definition wins over a predicate-like name
    ("def is_main_process():\n    return int(os.environ['LOCAL_RANK']) == 0\n",
     "is_main_process()", (TRUE, FALSE, TRUE)),
])
def test_rank_classes(setup: str, test: str, values: tuple[int, int, int]) -> None:
    info = build(ast.parse(HEAD + setup))
    node = ast.parse(test, mode="eval").body
    assert tuple(evaluate(info, node, c) for c in (RANK0, OTHERS, NODE_LEADERS)) == values


def test_flag_provenance_is_needed() -> None:
    """`master_process = ddp_rank == 0` (True without DDP): the barrier under it diverges."""
    src = """
    ddp_rank = int(os.environ["RANK"])
    leader = ddp_rank == 0
    if not leader:
        pass
    if leader:
        dist.barrier()
    """
    assert found(src) == [("DDP005", 7)]


def test_leader_first_reasoning() -> None:
    """ranks with local_rank > 0 call barrier() before the yield, rank 0 after it: equal."""
    src = HEAD + textwrap.dedent("""
    def first(local_rank):
        if local_rank > 0:
            dist.barrier()
        yield
        if local_rank == 0:
            dist.barrier()
    """)
    info = build(ast.parse(src))
    text = explain(info, info.funcs["first"][0])
    assert "rank 0: yield@" in text and "ranks > 0: barrier@" in text
    assert lint_source(src, "t.py", ALL) == []


def test_leader_first_with_collective_in_body_hangs() -> None:
    """The same manager around an all_reduce: rank 0 reduces while the others wait in the
    barrier: the orders differ."""
    src = """
    def first(local_rank):
        if local_rank > 0:
            dist.barrier()
        yield
        if local_rank == 0:
            dist.barrier()
    def f(t, local_rank):
        with first(local_rank):
            dist.all_reduce(t)
    """
    assert "DDP005" in codes(src)


def test_designated_rank_is_rank_zero() -> None:
    src = """
    def f(t, dst=0):
        if dist.get_rank() == dst:
            dist.barrier()
    """
    assert found(src) == [("DDP005", 4)]


def test_helper_called_in_both_arms_aligns() -> None:
    src = """
    def step(t):
        dist.all_reduce(t)
    def f(t, rank):
        if rank == 0:
            print("x")
            step(t)
        else:
            step(t)
    """
    assert codes(src) == []
    assert found(src.replace("        else:\n            step(t)\n", "")) == [("DDP005", 7)]


def test_callee_summary_is_inlined() -> None:
    """Rank 0 alone calls a helper that broadcasts inside: reported at the call."""
    src = """
    def sync(t):
        dist.broadcast(t, 0)
    def f(t, rank):
        if rank == 0:
            sync(t)
    """
    assert found(src) == [("DDP005", 6)]


def test_unknown_callee_is_not_collective() -> None:
    src = """
    def f(t, rank):
        if rank == 0:
            helpers.sync(t)
    """
    assert codes(src) == []


def test_parameter_forward_binds_to_the_ddp_model() -> None:
    src = """
    def validate(net, x):
        return net(x)
    model = DDP(torch.nn.Linear(2, 2))
    if dist.get_rank() == 0:
        validate(model, x)
    validate(model.module, x)
    """
    assert found(src) == [("DDP006", 6)]


def test_launch_mode_arm_is_not_every_rank() -> None:
    src = """
    dist.init_process_group("nccl")
    if not args.distributed:
        torch.save(state, "single.pt")
    if args.distributed and dist.get_rank() == 0:
        torch.save(state, "ckpt.pt")
    """
    assert codes(src) == []
    assert "DDP007" in codes(src.replace("not args.distributed", "args.fast"))


def test_per_rank_paths() -> None:
    src = """
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    path = os.path.join(out, "queue" + str(rank) + ".pth")
    torch.save(q, path)
    for i in range(rank, 10, dist.get_world_size()):
        np.save(f"day_{i}.npy", local_x)
    torch.save(q, "shared.pth")
    """
    assert found(src) == [("DDP007", 8)]


def test_same_contents_pickle_is_not_reported() -> None:
    src = """
    dist.init_process_group("nccl")
    pickle.dump(params, open("params.pkl", "wb"))
    pickle.dump(local_feats, open("feats.pkl", "wb"))
    """
    assert found(src) == [("DDP007", 4)]


def test_guard_after_early_return_in_reduce_helper() -> None:
    src = """
    def mean(t):
        dist.reduce(t, dst=0)
        if dist.get_rank() != 0:
            return None
        return t.item()
    """
    assert codes(src) == []
    assert "DDP016" in codes(src.replace("        if dist.get_rank() != 0:\n"
                                         "            return None\n", ""))


def test_exit_in_callee_is_not_the_callers_exit() -> None:
    src = """
    def log(x):
        if x is None:
            return
        torch.save(x, f"log{dist.get_rank()}.pt")
    def f(t, rank):
        if rank == 0:
            log(t)
        dist.broadcast(t, 0)
    """
    assert codes(src) == []
    assert found(src.replace("log(t)", "assert t.sum() > 0")) == [("DDP022", 8)]


def test_continue_in_an_inner_loop_is_no_exit() -> None:
    src = """
    def f(t, stats, rank):
        if rank == 0:
            for k, v in stats.items():
                if v is None:
                    continue
                print(k, v)
        dist.barrier()
    """
    assert codes(src) == []
    assert found(src.replace("continue", "return")) == [("DDP019", 6)]
    # With a collective of rank 0's own after the loop, the inner `continue` is still no
    # exit: the one finding is the barrier the others never make.
    extra = src.replace("                print(k, v)\n",
                        "                print(k, v)\n            dist.barrier()\n")
    assert [c for c, _ in found(extra)] == ["DDP005"]


def test_validation_sampler_needs_no_set_epoch() -> None:
    src = """
    val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set))
    for epoch in range(3):
        for b in val_loader:
            pass
    """
    assert codes(src) == []
    assert codes(src.replace("val_set", "train_set")) == ["DDP001"]


@pytest.mark.parametrize("args", ["world_size=1, rank=0", "store=dist.HashStore()"])
def test_one_process_group_needs_no_destroy(args: str) -> None:
    src = f'dist.init_process_group({args})\nif __name__ == "__main__":\n    pass\n'
    assert codes(src) == []
    assert codes(src.replace(args, "'nccl'")) == ["DDP012"]


def test_rank_guarded_load_keeps_its_device() -> None:
    src = """
    if dist.get_rank() == 0:
        meta = torch.load(args.ckpt)
    """
    assert codes(src) == []
    assert codes(src.replace("if dist.get_rank() == 0:", "if args.ckpt:")) == ["DDP010"]


def test_bom_file_is_linted(tmp_path: Path) -> None:
    p = tmp_path / "bom.py"
    p.write_bytes(b"\xef\xbb\xbf" + (HEAD + "dist.barrier() if 0 else None\n").encode())
    assert [f.code for f in lint_paths([p], ALL)] == []
    p.write_bytes(b"# -*- coding: latin-1 -*-\nx = '\xe9'\n")
    assert lint_paths([p], ALL) == []
    p.write_bytes(b"x = '\xe9'\n")  # not UTF-8 and no cookie: Python refuses it too
    [f] = lint_paths([p], ALL)
    assert f.code == "DDP000" and "encoding" in f.message


def test_cross_file_summary(tmp_path: Path) -> None:
    """A helper in another file on the command line broadcasts: rank 0 alone calling it
    diverges; without that file the callee is unknown and nothing is said."""
    (tmp_path / "comm.py").write_text(HEAD + "def sync(t):\n    dist.broadcast(t, 0)\n")
    script = tmp_path / "train.py"
    script.write_text(HEAD + "from comm import sync\n"
                      "def f(t):\n    if dist.get_rank() == 0:\n        sync(t)\n")
    got = [(f.code, f.line) for f in lint_paths([tmp_path], ALL)]
    assert got == [("DDP005", HEAD.count("\n") + 4)]
    assert [f.code for f in lint_paths([script], ALL)] == []


def test_cross_file_stays_in_its_tree(tmp_path: Path) -> None:
    """Two repositories on one command line: `from comm import sync` in repo a does not
    resolve to repo b's comm.py."""
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "comm.py").write_text(HEAD + "def sync(t):\n    dist.broadcast(t, 0)\n")
    (tmp_path / "a" / "train.py").write_text(
        HEAD + "from comm import sync\ndef f(t):\n    if dist.get_rank() == 0:\n"
        "        sync(t)\n")
    assert [f.code for f in lint_paths([tmp_path], ALL)] == []
    (tmp_path / "a" / "comm.py").write_text(HEAD + "def sync(t):\n    dist.barrier()\n")
    assert [f.code for f in lint_paths([tmp_path], ALL)] == ["DDP005"]


def test_dotted_import_resolves_across_top_folders(tmp_path: Path) -> None:
    """One repository linted alone: scripts/train.py's `from olmo.comm import sync` names
    olmo/comm.py, whatever top folder each sits in; a message names the callee's file."""
    (tmp_path / "olmo").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "olmo" / "comm.py").write_text(HEAD + "def sync():\n    dist.barrier()\n")
    (tmp_path / "scripts" / "train.py").write_text(
        HEAD + "from olmo.comm import sync\ndef main(cfg):\n    if dist.get_rank() == 0:\n"
        "        if cfg.bad:\n            return None\n    sync()\n")
    [f] = lint_paths([tmp_path], ALL)
    assert f.code == "DDP019" and "barrier() at comm.py:" in f.message
