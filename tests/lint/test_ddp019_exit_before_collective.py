"""DDP019 an exit before a collective on some ranks only.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from pathlib import Path

from helpers import (
    ALL_BUT_PRINT,
    HEAD_DIST,
    HEAD_SCHEDULE,
    LINT_FIXTURES,
    ddp_source,
    inline_lines,
    lint_paths_with_defaults,
    lint_source,
    lint_with_defaults,
)


def test_dotted_import_resolves_across_top_folders(tmp_path: Path) -> None:
    """One repository linted alone: scripts/train.py's `from olmo.comm import sync` names
    olmo/comm.py, whatever top folder each sits in; a message names the callee's file."""
    (tmp_path / "olmo").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "olmo" / "comm.py").write_text(HEAD_SCHEDULE + "def sync():\n    dist.barrier()\n")
    (tmp_path / "scripts" / "train.py").write_text(
        HEAD_SCHEDULE + "from olmo.comm import sync\ndef main(cfg):\n    if dist.get_rank() == 0:\n"
        "        if cfg.bad:\n            return None\n    sync()\n"
    )
    [f] = lint_paths_with_defaults([tmp_path], ALL_BUT_PRINT)
    assert f.code == "DDP019" and "barrier() at comm.py:" in f.message


TRAINER_PKG = HEAD_DIST + """\
def is_main_process():
    return dist.get_rank() == 0


class Trainer:
    def __init__(self, model, loader):
        self.model = model
        self.loader = loader

    def _steps(self):
        for x in self.loader:
            self.model(x).sum().backward()

    def fit(self, epochs):
        for epoch in range(epochs):
            self._steps()
            if is_main_process():
                if self._stop():
                    break

    def _stop(self):
        return True
"""

TRAINER_ENTRY = HEAD_DIST + """\
from torch.nn.parallel import DistributedDataParallel as DDP
from {module} import Trainer


def main():
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(2, 2))
    trainer = Trainer(model=model, loader=[])
    trainer.fit(3)
    dist.destroy_process_group()
"""


def test_a_checkout_whose_files_all_sit_in_its_package_is_one_tree(tmp_path: Path) -> None:
    """`lint repo/` where every file is under repo/pkg/: the entry in pkg/bin/ hands the DDP
    wrapper to pkg/trainer/Trainer.py's class, whose rank-0 `break` leaves the others in the
    next epoch's forward (sslsv's shape). The trees are the folders below what the command
    line names, so bin/ and trainer/ are not two repositories; two repositories named
    together stay apart (test_cross_file_stays_in_its_tree)."""
    repo = tmp_path / "repo"
    (repo / "pkg" / "bin").mkdir(parents=True)
    (repo / "pkg" / "trainer").mkdir()
    (repo / "pkg" / "trainer" / "Trainer.py").write_text(TRAINER_PKG)
    entry = TRAINER_ENTRY.format(module="pkg.trainer.Trainer")
    (repo / "pkg" / "bin" / "train.py").write_text(entry)
    [f] = lint_paths_with_defaults([repo], ALL_BUT_PRINT)
    assert f.code == "DDP019" and f.path.endswith("Trainer.py") and "self.model" in f.message
    # The near twin: the same class handed a bare model teaches nothing.
    (repo / "pkg" / "bin" / "train.py").write_text(
        entry.replace("DDP(torch.nn.Linear(2, 2))", "torch.nn.Linear(2, 2)"))
    assert lint_paths_with_defaults([repo], ALL_BUT_PRINT) == []


EVALUATE = """\
def evaluate(args, data, is_master):
    sharded = getattr(args, "fsdp", False)
    leader = is_master(args)
    if not sharded and not leader:
        return {}
    signal = torch.zeros(1)
    if sharded:
        dist.broadcast(signal, src=0)
    return {"n": len(data)}
"""


def test_flag_from_a_predicate_call_is_true_on_rank_0() -> None:
    # `leader = is_master(args)` holds on rank 0 (a test of the rank, not the rank itself);
    # read as the rank value it came out false on rank 0 and the classes swapped places.
    src = EVALUATE.replace(
        "    if sharded:\n        dist.broadcast", "    if True:\n        dist.broadcast"
    )
    [(code, line)] = inline_lines(src)
    [f] = [f for f in lint_with_defaults(HEAD_DIST + src, "t.py", ALL_BUT_PRINT)]
    assert (code, line) == ("DDP019", 5)
    assert f.message.startswith("ranks > 0 can leave at line")


def test_exit_and_collective_behind_the_same_flag_are_exclusive() -> None:
    assert inline_lines(EVALUATE) == []
    # Another flag guards the collective: nothing ties the two, the hang is possible.
    src = EVALUATE.replace("    if sharded:\n", "    if args.sync:\n")
    assert inline_lines(src) == [("DDP019", 5)]


EARLY_STOP = ddp_source("""
    def train(model, loader, rank, epochs, stopper):
        model = DDP(model, device_ids=[rank])
        for epoch in range(epochs):
            for x in loader:
                model(x).sum().backward()
            loss = torch.zeros(1)
            dist.all_reduce(loss)
            if rank == 0:
                if stopper(loss):
                    break
    """)


def test_early_stopping_decided_on_rank_0_leaves_the_others_in_the_next_epoch() -> None:
    [f] = lint_source(EARLY_STOP)
    assert f.code == "DDP019" and "next iteration" in f.message
    # Decided on every rank (the reduced loss), the break is taken by all: nothing to report.
    assert (
        lint_source(
            EARLY_STOP.replace(
                "        if rank == 0:\n            if stopper(loss):\n                break",
                "        if stopper(loss):\n            break",
            )
        )
        == []
    )


RETRY = """import torch.distributed as dist


def serve(model, rank):
    while True:
        if rank == 0:
            line = input("> ")
            if not line:
                continue
            request = [line]
        else:
            request = [None]
        dist.broadcast_object_list(request, src=0)
        if request[0] == "quit":
            break
        model(request[0])
"""


def test_a_while_loops_continue_that_comes_back_to_the_collective() -> None:
    # metaseq's interactive loop: rank 0 reads again until it has a line; the others wait
    # in the broadcast rank 0 comes back to.
    assert lint_source(RETRY) == []
    # Over a fixed sequence the same `continue` drops rank 0's broadcast for that step.
    over_data = RETRY.replace("    while True:\n", "    for _ in range(100):\n")
    assert [f.code for f in lint_source(over_data)] == ["DDP019"]


MERGE = """import torch.distributed as dist


def merge(load_all, only_load_in_master):
    dist.barrier()
    if only_load_in_master:
        if not is_first_worker():
            dist.barrier()
            return None
    out = load_all()
    dist.barrier()
    return out
"""


def test_one_barrier_per_rank_on_every_path_of_a_flag() -> None:
    # OpenMatch's barrier_array_merge: with the flag set the others barrier and leave, rank 0
    # loads and then barriers; without it everyone barriers once at the end.
    assert lint_source(MERGE) == []
    # The others leave without their barrier: rank 0 waits in the last one alone.
    gone = MERGE.replace(
        "            dist.barrier()\n            return None\n", "            return None\n"
    )
    assert [f.code for f in lint_source(gone)] == ["DDP019"]


def test_an_exit_outside_the_process_grid_says_what_it_assumed() -> None:
    src = ("import torch.distributed as dist\n\n\ndef run(rank, size, replication):\n"
           "    rank_c = rank // replication\n"
           "    if rank_c >= size // replication:\n        return\n    dist.barrier()\n")
    [f] = lint_with_defaults(src, "t.py")
    assert (f.code, f.line) == ("DDP019", 7)
    assert "assumed: `rank_c >= size // replication` holds on some rank" in f.message


def test_an_exit_on_a_flag_one_class_computes_names_the_flag() -> None:
    # the exit's own test (`if halt:`) reads no rank: the message says where the flag is set
    src = HEAD_DIST + (
        "from torch.nn.parallel import DistributedDataParallel as DDP\n\n\n"
        "def fit(net, batches, opt, stopper):\n"
        "    model = DDP(net)\n"
        "    halt = False\n"
        "    for _ in range(9):\n"
        "        for x in batches:\n"
        "            model(x).mean().backward()\n"
        "            opt.step()\n"
        "        if dist.get_rank() == 0:\n"
        "            halt = stopper.step()\n"
        "        if halt:\n"
        "            break\n")
    [f] = lint_with_defaults(src, "t.py")
    assert f.code == "DDP019" and "`halt` is set only where `dist.get_rank() == 0`" in f.message


def test_a_counter_handed_back_by_a_rank_0_validation_names_where_it_comes_from() -> None:
    # corpus35i B166's shape: `best, stale = validate(..., best, stale)`, where validate moves
    # `stale` only on rank 0, then `if stale > patience: break` on every rank
    path = LINT_FIXTURES / "DDP019_counter_handed_back.py"
    [f] = [f for f in lint_with_defaults(path.read_text(), str(path)) if f.line == 42]
    assert f.code == "DDP019" and "`stale` comes back from validate() at line 40" in f.message
    assert "`rank == 0 or rank == 'cpu'` holds (line 13)" in f.message


FIT_LOOP = HEAD_DIST + """\


def fit(model, loader, optimizer, epochs, rank=0):
    bad = 0
    for _ in range(epochs):
        for x in loader:
            loss = model(x).mean()
            loss.backward()
            optimizer.step()
        if rank == 0:
            bad += 1
            if bad >= 5:
                break
"""

FIT_ENTRY = HEAD_DIST + """\
from torch.nn.parallel import DistributedDataParallel as DDP
from {module} import fit


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(2, 2))
    fit(model, [], torch.optim.SGD(model.parameters(), 0.1), 10, rank=rank)
    dist.destroy_process_group()
"""


def test_a_function_imported_from_a_sibling_folder_by_its_dotted_name(tmp_path: Path) -> None:
    """`lint repo/` where the entry sits in repo/finetune/ and imports `from models.loop
    import fit` (repo/models/loop.py; the script runs with the checkout's root on its path):
    finetune/ and models/ are folders below what the command line names, but the dotted
    import names the very module, so the wrapper handed to `fit` is read there (corpus36b's
    pangu, found after first contact). A bare import of a neighbour tree's module still
    resolves nothing (test_cross_file_stays_in_its_tree)."""
    repo = tmp_path / "repo"
    (repo / "finetune").mkdir(parents=True)
    (repo / "models").mkdir()
    (repo / "models" / "loop.py").write_text(FIT_LOOP)
    entry = FIT_ENTRY.format(module="models.loop")
    (repo / "finetune" / "main.py").write_text(entry)
    [f] = lint_paths_with_defaults([repo], ALL_BUT_PRINT)
    assert f.code == "DDP019" and f.path.endswith("loop.py"), f
    # The near twin: the same function handed a bare model teaches nothing.
    (repo / "finetune" / "main.py").write_text(
        entry.replace("DDP(torch.nn.Linear(2, 2))", "torch.nn.Linear(2, 2)"))
    assert lint_paths_with_defaults([repo], ALL_BUT_PRINT) == []


SHOW_MODEL = """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main_worker(args, model, loader):
    dist.init_process_group("gloo")
    if args.show_model and dist.get_rank() == 0:
        print(model)
        return 0
    if args.distributed:
        model = DistributedDataParallel(model)
    for x in loader:
        dist.all_reduce(x)
"""


def test_the_others_wait_in_the_wrap_before_the_collective() -> None:
    """corpus40a's Action-Recognition: rank 0's `--show_model` return, then the others'
    DistributedDataParallel(model): the wrap's broadcast is the first wait, named first."""
    [f] = [f for f in lint_source(SHOW_MODEL) if f.code == "DDP019"]
    assert f.line == 9
    assert "go on to the DDP constructor's broadcast at line 11 first, then all_reduce() at " \
           "line 13" in f.message


def test_a_wrap_on_rank_zero_alone_is_no_wait_of_the_others() -> None:
    text = SHOW_MODEL.replace("    if args.distributed:\n",
                              "    if args.distributed and dist.get_rank() == 0:\n")
    [f] = [f for f in lint_source(text) if f.code == "DDP019"]
    assert "DDP constructor" not in f.message and "go on to all_reduce() at line 13" in f.message
