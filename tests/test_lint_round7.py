"""Issue 20, seventh round: the false-positive classes of the sixth round's blind half (tuning
data since), each pinned by code of our own that expects nothing and by the one-line change
that makes the same code wrong again; and the defaults that half's reviewer informed."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import lint_paths, lint_source

from ddpguard.lint import RULES

ZERO_FIRST = """import torch.distributed as dist
from contextlib import contextmanager


@contextmanager
def zero_first(rank):
    if rank not in [-1, 0]:
        dist.barrier()
    yield
    if rank == 0:
        dist.barrier()


def create_dataloader(path, rank=-1):
    with zero_first(rank):
        data = list(path)
    return data


class Trainer:
    def __init__(self, args):
        self.args = args
        self.rank = args.rank

    def train_loader(self):
        return create_dataloader("train", rank=self.args.local_rank)

    def val_loader(self):
        if self.rank in [-1, 0]:
            return create_dataloader("val", rank=-1)
        return None
"""


def test_a_literal_rank_argument_decides_the_callees_rank_tests() -> None:
    # The validation loader is built on rank 0 alone with the literal rank=-1: the
    # leader-first context manager then skips both barriers (YOLOv6's shape).
    assert lint_source(ZERO_FIRST) == []
    # With the caller's rank instead, rank 0 waits in the release barrier alone.
    got = lint_source(ZERO_FIRST.replace('create_dataloader("val", rank=-1)',
                                         'create_dataloader("val", rank=self.args.local_rank)'))
    assert [f.code for f in got] == ["DDP005"]
    # A literal default does the same for a call that leaves the parameter out.
    assert lint_source(ZERO_FIRST.replace('create_dataloader("val", rank=-1)',
                                          'create_dataloader("val")')) == []


def _project(tmp_path: Path, flag: str) -> list[tuple[str, str]]:
    (tmp_path / "checkpoint.py").write_text(textwrap.dedent("""
        import os
        import torch
        from torch.nn.parallel import DistributedDataParallel


        class Checkpointer:
            def __init__(self, model, save_dir="", save_to_disk=True):
                self.model = model
                self.save_dir = save_dir
                self.save_to_disk = save_to_disk

            def save(self, name):
                if not self.save_dir or not self.save_to_disk:
                    return
                torch.save(self.model.state_dict(), os.path.join(self.save_dir, name))


        class Periodic:
            def __init__(self, checkpointer, period):
                self.checkpointer, self.period = checkpointer, period

            def step(self, it):
                if (it + 1) % self.period == 0:
                    self.checkpointer.save(f"model_{it:07d}.pth")
        """))
    (tmp_path / "train.py").write_text(textwrap.dedent(f"""
        import torch.distributed as dist
        from checkpoint import Checkpointer, Periodic
        import comm


        def main(model):
            dist.init_process_group("nccl")
            ckpt = Checkpointer(model, "out", save_to_disk={flag})
            periodic = Periodic(ckpt, 100)
            for it in range(1000):
                periodic.step(it)
        """))
    return [(Path(f.path).name, f.code) for f in lint_paths([tmp_path])]


def test_a_rank_flag_passed_to_a_constructor_and_kept_on_self(tmp_path: Path) -> None:
    # fast-reid: every checkpointer that saves is built with
    # save_to_disk=comm.is_main_process() in another file.
    assert _project(tmp_path, "comm.is_main_process()") == []
    assert _project(tmp_path, "True") == [("checkpoint.py", "DDP007")]


def test_rules_whose_first_contact_findings_were_debatable_are_off_by_default() -> None:
    # DDP020: 0 true in 5 independent first-contact findings (all debatable: at most W-1
    # repeated samples); DDP017: 1 true in 5 (a shared file system the code does not show).
    assert RULES["DDP020"].default is False
    assert RULES["DDP017"].default is False


UNUSED_SAVE = """import os
import torch
import torch.distributed as dist


def save_checkpoint(state, save):
    torch.save(state, os.path.join(save, "checkpoint.pth.tar"))


def save(model, model_path):
    torch.save(model.state_dict(), model_path)


def log(writer, save):
    writer.save(os.path.join(save, "log.txt"))


def main(state, out, rank):
    dist.init_process_group("nccl")
    if rank == 0:
        save_checkpoint(state, out)
"""


def test_a_module_function_is_referenced_by_its_bare_name_only() -> None:
    # LSGM's `save(model, path)` is called nowhere: neither `writer.save(...)` nor a
    # directory variable named `save` is a use of it (the seventh round's blind half).
    assert lint_source(UNUSED_SAVE) == []
    used = UNUSED_SAVE + ("\n\nif __name__ == '__main__':\n"
                          "    save(torch.nn.Linear(2, 2), 'f.pth')\n")
    assert [f.code for f in lint_source(used)] == ["DDP007"]
    # Called nowhere, but named by its bare name as a value (`mp.spawn(save, ...)`-style).
    passed = UNUSED_SAVE + "\n\ndef launch(spawn):\n    spawn(save, nprocs=2)\n"
    assert [f.code for f in lint_source(passed)] == ["DDP007"]
