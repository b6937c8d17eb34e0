"""DDP005 collective divergence.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import helpers
from helpers import ALL_BUT_PRINT, HEAD_SCHEDULE, ddp_source

from ddpguard.lint import Finding


def _fold(found: Any) -> Any:
    """DDP034 is DDP005's certain form (the leader alone reaches the collective), reported in
    its place: what these tests check, that the analysis finds the divergence (or stays
    silent), holds for both codes. test_ddp034_collective_on_leader_only.py tells them apart."""
    if isinstance(found, list):
        return [_fold(f) for f in found]
    if found == "DDP034":
        return "DDP005"
    if isinstance(found, tuple) and found and found[0] == "DDP034":
        return ("DDP005", *found[1:])
    if isinstance(found, Finding) and found.code == "DDP034":
        return replace(found, code="DDP005")
    return found


def _folded(fn: Callable[..., Any]) -> Callable[..., Any]:
    return lambda *args, **kwargs: _fold(fn(*args, **kwargs))


cache_leader_findings = _folded(helpers.cache_leader_findings)
cache_leader_lines = _folded(helpers.cache_leader_lines)
codes_after_head = _folded(helpers.codes_after_head)
finding_lines = _folded(helpers.finding_lines)
inline_lines = _folded(helpers.inline_lines)
lint_paths = _folded(helpers.lint_paths)
lint_paths_with_defaults = _folded(helpers.lint_paths_with_defaults)
lint_source = _folded(helpers.lint_source)
lint_with_defaults = _folded(helpers.lint_with_defaults)
snippet_codes = _folded(helpers.snippet_codes)
snippet_lines = _folded(helpers.snippet_lines)


def test_aliased_collective_and_rank_helpers() -> None:
    src = """
    from torch.distributed import barrier as sync
    def is_main_process():
        return dist.get_rank() == 0
    if is_main_process():
        sync()
    if args.local_rank in [-1, 0]:
        dist.broadcast(t, 0)
    """
    assert codes_after_head(src).count("DDP005") == 2


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
    assert snippet_lines(src) == [("DDP005", 7)]


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
    assert "DDP005" in snippet_codes(src)


def test_designated_rank_is_rank_zero() -> None:
    src = """
    def f(t, dst=0):
        if dist.get_rank() == dst:
            dist.barrier()
    """
    assert snippet_lines(src) == [("DDP005", 4)]


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
    assert snippet_codes(src) == []
    assert snippet_lines(src.replace("        else:\n            step(t)\n", "")) == [("DDP005", 7)]


def test_callee_summary_is_inlined() -> None:
    """Rank 0 alone calls a helper that broadcasts inside: reported at the call."""
    src = """
    def sync(t):
        dist.broadcast(t, 0)
    def f(t, rank):
        if rank == 0:
            sync(t)
    """
    assert snippet_lines(src) == [("DDP005", 6)]


def test_cross_file_summary(tmp_path: Path) -> None:
    """A helper in another file on the command line broadcasts: rank 0 alone calling it
    diverges; without that file the callee is unknown and nothing is said."""
    (tmp_path / "comm.py").write_text(HEAD_SCHEDULE + "def sync(t):\n    dist.broadcast(t, 0)\n")
    script = tmp_path / "train.py"
    script.write_text(
        HEAD_SCHEDULE + "from comm import sync\n"
        "def f(t):\n    if dist.get_rank() == 0:\n        sync(t)\n"
    )
    got = [(f.code, f.line) for f in lint_paths_with_defaults([tmp_path], ALL_BUT_PRINT)]
    assert got == [("DDP005", HEAD_SCHEDULE.count("\n") + 4)]
    assert [f.code for f in lint_paths_with_defaults([script], ALL_BUT_PRINT)] == []


def test_cross_file_stays_in_its_tree(tmp_path: Path) -> None:
    """Two repositories on one command line: `from comm import sync` in repo a does not
    resolve to repo b's comm.py."""
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "comm.py").write_text(
        HEAD_SCHEDULE + "def sync(t):\n    dist.broadcast(t, 0)\n"
    )
    (tmp_path / "a" / "train.py").write_text(
        HEAD_SCHEDULE + "from comm import sync\ndef f(t):\n    if dist.get_rank() == 0:\n"
        "        sync(t)\n"
    )
    assert [f.code for f in lint_paths_with_defaults([tmp_path], ALL_BUT_PRINT)] == []
    (tmp_path / "a" / "comm.py").write_text(HEAD_SCHEDULE + "def sync(t):\n    dist.barrier()\n")
    assert [f.code for f in lint_paths_with_defaults([tmp_path], ALL_BUT_PRINT)] == ["DDP005"]


def test_matching_pairs_stay_quiet_beside_a_real_divergence() -> None:
    """When a function holds a real divergence, the parts that do match (a leader-first
    context manager, one helper called from both arms, the two sides of one broadcast) must
    still align, so the finding is the real one alone."""
    src = """\
from contextlib import contextmanager


@contextmanager
def leader_first(rank):
    if rank > 0:
        dist.barrier()
    yield
    if rank == 0:
        dist.barrier()


def sync(t):
    dist.all_reduce(t)


def main(t, rank):
    with leader_first(rank):
        t = t + 1
    if rank == 0:
        sync(t)
    else:
        t = t * 2
        sync(t)
    if rank == 0:
        dist.broadcast_object_list([t], src=0)
    else:
        box = [None]
        dist.broadcast_object_list(box, src=0)
    if rank == 0:
        dist.barrier()
"""
    assert inline_lines(src) == [("DDP005", 31)]
    assert inline_lines(src[: src.rindex("    if rank == 0:\n        dist.barrier()\n")]) == []


def test_a_literal_argument_decides_the_callees_test() -> None:
    # With `evaluate=True` the leader's barrier is skipped: rank 0 may evaluate alone.
    # Without the `not evaluate` on the leader's side, rank 0 waits in that barrier while the
    # others have left: the hang is reported at main's call, through evaluate() and
    # load_features().
    got = cache_leader_findings(
        "    if args.local_rank == 0 and not evaluate:\n", "    if args.local_rank == 0:\n"
    )
    hangs = [(c, line, m) for c, line, m in got if c == "DDP005"]
    # load_features() itself: the leader waits even when told it evaluates; and main's
    # rank-0-only evaluation, through evaluate() (train's call passes the default False, under
    # which the pair still matches).
    assert [(c, line) for c, line, _ in hangs] == [("DDP005", 26), ("DDP005", 70)]
    assert "barrier() at line 26 (through the call at line 70)" in hangs[1][2]
    # The literal decides only the parameter it binds: passed by name or by position.
    assert (
        cache_leader_lines(
            "    feats = load_features(args, evaluate=True)\n",
            "    feats = load_features(args, True)\n",
        )
        == cache_leader_lines()
    )


def test_a_literal_reaches_through_a_parameter_of_the_caller() -> None:
    src = """import torch.distributed as dist


def load(rank, evaluate=False):
    if rank > 0 and not evaluate:
        dist.barrier()
    if rank == 0 and not evaluate:
        dist.barrier()


def run(rank, evaluate):
    load(rank, evaluate)


def main(rank):
    dist.init_process_group("gloo")
    if rank == 0:
        run(rank, True)
    dist.destroy_process_group()
"""
    assert [f.code for f in lint_with_defaults(src, "t.py", ALL_BUT_PRINT)] == []
    assert [
        (f.code, f.line)
        for f in lint_with_defaults(
            src.replace("run(rank, True)", "run(rank, False)"), "t.py", ALL_BUT_PRINT
        )
    ] == [("DDP005", 18)]


def test_a_helper_called_in_both_arms_is_compared_once_in_the_helper() -> None:
    src = ddp_source("""
        def training(rank, loader):
            for it, x in enumerate(loader):
                dist.all_reduce(x)
                if it % 100 == 0 and rank == 0:
                    dist.barrier()

        def main_worker(rank, loader):
            if rank == 0:
                training(rank, loader)
            else:
                training(rank, loader)
        """)
    assert [(f.code, f.line) for f in lint_source(src)] == [("DDP005", 9)]
    # Different literal arguments make different calls: the caller's comparison reports.
    lit = ddp_source("""
        def training(rank, loader, sync=True):
            for it, x in enumerate(loader):
                if sync:
                    dist.all_reduce(x)

        def main_worker(rank, loader):
            if rank == 0:
                training(rank, loader)
            else:
                training(rank, loader, sync=False)
        """)
    assert [(f.code, f.line) for f in lint_source(lit)] == [("DDP005", 12)]


def test_a_divergence_is_reported_past_the_collective_both_reach() -> None:
    # Rank 0 all-reduces inline and then waits in a barrier; the others all-reduce inside a
    # helper: the all_reduce is shared, the barrier is where they part.
    src = ddp_source("""
        def sync(t):
            dist.all_reduce(t)

        def step(t, rank):
            if rank == 0:
                dist.all_reduce(t)
                dist.barrier()
            else:
                sync(t)
        """)
    [f] = lint_source(src)
    assert (f.code, f.line) == ("DDP005", 11) and "barrier()" in f.message


def test_a_left_out_parameter_takes_its_literal_default() -> None:
    src = ddp_source("""
        def gather_stats(t, sync=False):
            if sync:
                dist.all_reduce(t)
            return t

        def log(t, rank):
            if rank == 0:
                print(gather_stats(t))
        """)
    assert [f.code for f in lint_source(src)] == []
    assert [
        f.code for f in lint_source(src.replace("gather_stats(t))", "gather_stats(t, sync=True))"))
    ] == ["DDP005"]


FLAG = ddp_source("""
    class Tracker:
        def __init__(self, cfg):
            self.cfg = cfg

        def _sync(self, x):
            if self.cfg.pipelined:
                dist.all_reduce(x)
            return x

        def _update(self):
            self._sync(torch.zeros(1))

        def update(self):
            if self.cfg.pipelined:
                self._update()
            else:
                if dist.get_rank() == 0:
                    self._update()
                dist.barrier()
    """)


def test_an_attribute_of_self_tested_on_the_way_is_known_in_the_methods_it_calls() -> None:
    # In the `else` arm `self.cfg.pipelined` is false, so the helper's all_reduce is not
    # reached there: rank 0's extra call does nothing the others wait on.
    assert [f.code for f in lint_source(FLAG)] == []
    # Another flag in the helper stays unknown: rank 0 may all-reduce alone.
    other = FLAG.replace(
        "        if self.cfg.pipelined:\n            dist.all_reduce(x)",
        "        if self.cfg.summed:\n            dist.all_reduce(x)",
    )
    assert [f.code for f in lint_source(other)] == ["DDP005"]


def test_a_collective_in_a_method_of_an_instance_runs_where_the_call_does() -> None:
    src = ddp_source("""
        class Syncer:
            def sync(self, t):
                dist.all_reduce(t)

        def step(t, rank):
            syncer = Syncer()
            if rank == 0:
                syncer.sync(t)
        """)
    assert [f.code for f in lint_source(src)] == ["DDP005"]


def test_a_single_process_arm_is_never_taken_in_a_distributed_run() -> None:
    src = ddp_source("""
        def log(config, t, rank):
            if rank == 0:
                if config["single_spec"]:
                    dist.barrier()
        """)
    assert [f.code for f in lint_source(src)] == []
    assert [
        f.code for f in lint_source(src.replace('config["single_spec"]', 'config["sync"]'))
    ] == ["DDP005"]


def test_a_function_of_this_file_used_as_a_truth_value() -> None:
    # `not evaluate` names the module's evaluate(): always false, the barrier never runs.
    src = ddp_source("""
        def evaluate(model):
            return model

        def load(args, split="train"):
            if args.local_rank == 0 and not evaluate:
                dist.barrier()
            return split

        def log(args):
            if args.local_rank in [-1, 0]:
                load(args, split="dev")
        """)
    assert lint_source(src) == []
    # As a parameter (the old example trainers' `evaluate=False`), it is a value.
    param = (
        src.replace('def load(args, split="train"):', "def load(args, evaluate=False):")
        .replace('load(args, split="dev")', "load(args)")
        .replace("    return split", "    return evaluate")
    )
    assert {f.code for f in lint_source(param)} == {"DDP005"}


def test_a_gpu_switch_and_a_mesh_coordinate_are_no_rank() -> None:
    src = ddp_source("""
        def run(cfg, loss):
            if cfg.mode.gpu:
                dist.all_reduce(loss)

        def serve(mesh, obj):
            if mesh["tp"].get_local_rank() == 0:
                dist.broadcast_object_list(obj, group=mesh["dp"].get_group(), group_src=0)
        """)
    assert lint_source(src) == []
    ranked = src.replace("if cfg.mode.gpu:", "if cfg.mode.rank:").replace(
        'mesh["tp"].get_local_rank()', "dist.get_rank()"
    )
    assert [f.code for f in lint_source(ranked)] == ["DDP005", "DDP005"]


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
    got = lint_source(
        ZERO_FIRST.replace(
            'create_dataloader("val", rank=-1)',
            'create_dataloader("val", rank=self.args.local_rank)',
        )
    )
    assert [f.code for f in got] == ["DDP005"]
    # A literal default does the same for a call that leaves the parameter out.
    assert (
        lint_source(
            ZERO_FIRST.replace('create_dataloader("val", rank=-1)', 'create_dataloader("val")')
        )
        == []
    )


# The leader drives an optimizer that calls the closure; the workers serve it: each waits
# for a signal, runs the closure when told to, and leaves when told to stop (mace's L-BFGS).
SIGNAL_PROTOCOL = """import torch
import torch.distributed as dist


def train_lbfgs(model, optimizer, loader, rank, distributed):
    signal = torch.zeros(1) if distributed else None

    def closure():
        if distributed:
            if rank == 0:
                signal.fill_(1)
                dist.broadcast(signal, src=0)
            for p in model.parameters():
                dist.broadcast(p.data, src=0)
        optimizer.zero_grad()
        loss = sum(model(x).sum() for x in loader)
        loss.backward()
        if distributed:
            dist.all_reduce(loss)
        return loss

    if distributed:
        if rank == 0:
            loss = optimizer.step(closure)
            signal.fill_(0)
            dist.broadcast(signal, src=0)
        else:
            while True:
                dist.broadcast(signal, src=0)
                if signal.item() == 0:
                    break
                if signal.item() == 1:
                    loss = closure()
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    else:
        loss = optimizer.step(closure)
    return loss
"""


DRIVER = """import torch
import torch.distributed as dist


def drive(step, n_steps, rank):
    signal = torch.zeros(1)
    if rank == 0:
        for _ in range(n_steps):
            signal.fill_(1)
            dist.broadcast(signal, src=0)
            step()
        signal.fill_(0)
        dist.broadcast(signal, src=0)
    else:
        while True:
            dist.broadcast(signal, src=0)
            if signal.item() == 0:
                break
            step()
"""


def test_a_worker_loop_that_leaves_on_what_it_received_is_not_aligned() -> None:
    assert lint_source(SIGNAL_PROTOCOL) == []
    assert lint_source(DRIVER) == []
    # The same workers leaving on their own count instead of the leader's signal: rank 0
    # broadcasts once, the workers wait in a broadcast that rank 0 never makes again.
    # (Rank 0 calls the closure itself here: handed to the optimizer, how often it runs is
    # the optimizer's decision, and nothing is proven either way.)
    own_count = SIGNAL_PROTOCOL.replace(
        "if signal.item() == 0:\n                    break",
        "if step > 3:\n                    break",
    ).replace(
        "            loss = optimizer.step(closure)\n            signal.fill_(0)",
        "            loss = closure()\n            signal.fill_(0)",
    )
    assert "DDP005" in [f.code for f in lint_source(own_count)]


def test_a_closure_handed_to_the_optimizer_under_rank_tests_only() -> None:
    # With the worker loop as it is, the closure's own rank test is one side of the protocol.
    assert lint_source(SIGNAL_PROTOCOL) == []
    # Handed to the optimizer on every rank (no rank test around it): its body is what every
    # rank runs, and the broadcast only rank 0 makes there parts them.
    everywhere = """import torch
import torch.distributed as dist


def train_lbfgs(model, optimizer, loader, rank):
    signal = torch.zeros(1)

    def closure():
        if rank == 0:
            dist.broadcast(signal, src=0)
        loss = sum(model(x).sum() for x in loader)
        dist.all_reduce(loss)
        return loss

    return optimizer.step(closure)
"""
    assert [f.code for f in lint_source(everywhere)] == ["DDP005"]
    # Called directly under the rank test, not handed away: the caller's comparison and the
    # closure's own still see every rank that runs it.
    called = everywhere.replace(
        "    return optimizer.step(closure)",
        "    if rank == 0:\n        closure()\n    return closure()",
    )
    assert "DDP005" in [f.code for f in lint_source(called)]


THREADED = """import threading
import torch
import torch.distributed as dist


def batching_loop(queue):
    while True:
        batch = queue.get()
        dist.broadcast_object_list([batch], src=0)


def worker_main(model):
    while True:
        batch = [None]
        dist.broadcast_object_list(batch, src=0)
        model(batch[0])


def main(model, queue):
    dist.init_process_group("nccl")
    if dist.get_rank() == 0:
        threading.Thread(target=batching_loop, args=(queue,), daemon=True).start()
        serve_http(queue)
    else:
        worker_main(model)
"""


def test_collectives_handed_to_a_thread_on_one_rank_are_not_aligned() -> None:
    # metaseq's hosted server: rank 0's thread makes the broadcasts the workers wait in.
    assert lint_source(THREADED) == []
    # Rank 0 starts nothing: the workers wait in a broadcast no rank makes.
    alone = THREADED.replace(
        "        threading.Thread(target=batching_loop, args=(queue,), daemon=True).start()\n", ""
    )
    assert [f.code for f in lint_source(alone)] == ["DDP005"]


CHIEF = """import torch
import torch.distributed as dist
from tml.core import env


def run(model, loader):
    if env.is_reader():
        loader.serve()
    if env.is_chief():
        dist.init_process_group("nccl")
        for x in loader:
            loss = model(x)
            dist.all_reduce(loss)
"""


def test_is_chief_is_a_role_not_rank_zero() -> None:
    # the-algorithm-ml: `is_chief()` tests TASK_TYPE == "chief", true on every trainer.
    assert lint_source(CHIEF) == []
    # Defined here from the rank, it is the rank-0 test it looks like.
    ranked = CHIEF.replace("from tml.core import env\n", "").replace(
        "env.is_chief()", "is_chief()"
    ).replace("env.is_reader()", "False") + (
        "\n\ndef is_chief():\n    return dist.get_rank() == 0\n"
    )
    assert [f.code for f in lint_source(ranked)] == ["DDP005"]


NEGATED = """import torch.distributed as dist


def convert(examples, is_training):
    if is_training:
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, examples)
    return examples


def load(examples, evaluate=False):
    return convert(examples, is_training=not evaluate)


def main(examples):
    if dist.get_rank() == 0:
        load(examples, evaluate=True)
    load(examples)
"""


def test_a_negated_parameter_passes_the_literal_on() -> None:
    # DensePhrases: rank 0's evaluation loads with evaluate=True, so convert() skips the
    # all_gather_object that only training runs.
    assert lint_source(NEGATED) == []
    assert [
        f.code for f in lint_source(NEGATED.replace("is_training=not evaluate", "is_training=True"))
    ] == ["DDP005"]


def test_a_flag_set_to_constants_in_the_arms_of_a_rank_test(tmp_path: Path) -> None:
    # HybrIK: env.py sets `opt.log = True` on rank
    # 0 and `False` elsewhere; the training scripts save under `if opt.log:`.
    (tmp_path / "env.py").write_text(
        "import torch.distributed as dist\n\n\ndef init_dist(opt):\n"
        "    dist.init_process_group('nccl', rank=opt.rank, world_size=opt.world_size)\n"
        "    if opt.rank == 0:\n        opt.log = True\n    else:\n        opt.log = False\n"
    )
    script = (
        "import torch\nfrom env import init_dist\n\n\ndef main(opt, model):\n"
        "    init_dist(opt)\n    if opt.log:\n        torch.save(model.state_dict(), 'm.pth')"
        "\n\n\nif __name__ == '__main__':\n    main(None, None)\n"
    )
    (tmp_path / "train.py").write_text(script)
    assert lint_paths([tmp_path]) == []
    # In one file the flag is the test itself: rank 0 alone reaches the barrier under it.
    one = (
        "import torch.distributed as dist\n\n\ndef main(rank):\n"
        "    if rank == 0:\n        log = True\n    else:\n        log = False\n"
        "    if log:\n        dist.barrier()\n"
    )
    assert [f.code for f in lint_source(one)] == ["DDP005"]
    assert lint_source(one.replace("        dist.barrier()\n", "        print('log')\n")) == []


# A rank-0-only helper that reaches a barrier only in the fallback of a search, then a
# barrier every rank reaches (PixelRec's and MicroLens's trainers: the log directory is named
# after the logger's file handler, which every rank has; only without one is the time stamp,
# and its barrier, taken).
SEARCH_FALLBACK = """\
import os

import torch.distributed as dist


def stamp():
    dist.barrier()
    return "now"


def board_dir(logger):
    name = None
    for handler in logger.handlers:
        if hasattr(handler, "baseFilename"):
            name = os.path.basename(handler.baseFilename)
            break
    if name is None:
        name = "run-" + stamp()
    return name


class Trainer:
    def __init__(self, logger):
        self.rank = dist.get_rank()
        if self.rank == 0:
            self.board = board_dir(logger)
        self.saved = "model-" + stamp()
"""


def test_a_collective_only_in_a_searchs_fallback_is_no_proven_divergence() -> None:
    assert finding_lines(SEARCH_FALLBACK) == []


def test_a_collective_behind_a_value_that_is_no_search_is_reported() -> None:
    # the same test on a value read once, not searched for
    read = SEARCH_FALLBACK.replace("    name = None\n", "    name = logger.default_name\n")
    assert [c for c, _ in finding_lines(read)] == ["DDP005"]
    # the barrier outside the fallback: rank 0 always calls it once more
    always = SEARCH_FALLBACK.replace(
        '        name = "run-" + stamp()\n    return name',
        '        name = "run"\n    return name + stamp()',
    )
    assert [c for c, _ in finding_lines(always)] == ["DDP005"]
    # a flag of the caller's (the same on every rank, but taken by rank 0 alone here)
    flag = SEARCH_FALLBACK.replace("    if name is None:\n", "    if logger.timestamped:\n")
    assert [c for c, _ in finding_lines(flag)] == ["DDP005"]


# The leader fills shared memory and sends its shape; every other rank's main process
# receives it, and DataLoader workers, which are no ranks, skip the collectives (omnivore's
# SharedMemory dataset).
WORKERS = """\
import torch.distributed as dist
from torch.utils.data import get_worker_info


def share(arr, local_rank):
    if local_rank == 0:
        dist.barrier()
        dist.broadcast_object_list([arr.shape])
    else:
        if not is_torch_dataloader_worker():
            dist.barrier()
            dist.broadcast_object_list([None])
    return arr


def is_torch_dataloader_worker():
    return get_worker_info() is not None
"""


def test_the_dataloader_workers_arm_is_no_ranks_path() -> None:
    assert finding_lines(WORKERS) == []
    info = WORKERS.replace(
        "        if not is_torch_dataloader_worker():", "        if get_worker_info() is None:"
    )
    assert finding_lines(info) == []


def test_a_rank_that_skips_the_collectives_on_another_test_is_reported() -> None:
    flag = WORKERS.replace("        if not is_torch_dataloader_worker():", "        if arr.wait:")
    assert [c for c, _ in finding_lines(flag)] == ["DDP005"]
    inverted = WORKERS.replace(
        "        if not is_torch_dataloader_worker():", "        if get_worker_info() is not None:"
    )
    assert {c for c, _ in finding_lines(inverted)} == {"DDP005"}


# The source sends a size and, unless it is 0, the payload; the others receive the size and
# read the payload only when it is not 0 (verl's and sglang's broadcast_pyobj).
SIZE_THEN_PAYLOAD = """\
import pickle

import torch
import torch.distributed as dist


def broadcast_pyobj(data, rank, src=0, expected=0):
    if rank == src:
        if len(data) == 0:
            size = torch.tensor([0], dtype=torch.long)
            dist.broadcast(size, src=src)
        else:
            payload = torch.ByteTensor(list(pickle.dumps(data)))
            size = torch.tensor([len(payload)], dtype=torch.long)
            dist.broadcast(size, src=src)
            dist.broadcast(payload, src=src)
        return data
    size = torch.tensor([0], dtype=torch.long)
    dist.broadcast(size, src=src)
    n = size.item()
    if n == 0:
        return []
    payload = torch.empty(n, dtype=torch.uint8)
    dist.broadcast(payload, src=src)
    return pickle.loads(bytes(payload.tolist()))
"""


def test_a_receiver_that_follows_the_size_it_received_matches_the_sender() -> None:
    assert finding_lines(SIZE_THEN_PAYLOAD) == []


def test_a_receiver_that_decides_on_its_own_value_is_reported() -> None:
    own = SIZE_THEN_PAYLOAD.replace("    if n == 0:\n", "    if expected == 0:\n")
    assert [c for c, _ in finding_lines(own)] == ["DDP005"]


# Rank 0 hands the training method to a sweep agent that calls it; the others call it
# themselves (multiple_physics_pretraining's `wandb.agent(function=trainer.train)`).
AGENT = """\
import torch.distributed as dist


class Trainer:
    def train(self):
        dist.barrier()
        dist.barrier()


if __name__ == "__main__":
    trainer = Trainer()
    if args.sweep_id and dist.get_rank() == 0:
        wandb.agent(args.sweep_id, function=trainer.train, count=1)
    else:
        trainer.train()
"""


def test_a_method_handed_to_an_agent_on_rank0_is_no_proven_divergence() -> None:
    assert finding_lines(AGENT) == []


def test_rank0_skipping_the_method_the_others_call_is_reported() -> None:
    skipped = AGENT.replace("function=trainer.train", "function=None")
    assert [c for c, _ in finding_lines(skipped)] == ["DDP005"]


# A test of the rank within a subgroup: the leaders of the reduction groups reduce among
# themselves, on the group of leaders (makani's tree reduction).
SUBGROUP = """\
import torch.distributed as dist


def reduce_stats(stats, mesh):
    if dist.get_rank(mesh.get_group("reduction")) == 0:
        stats = tree_reduce(stats, mesh.get_group("tree"))
    dist.barrier()
    return stats


def tree_reduce(stats, group):
    dist.barrier(group=group)
    return stats
"""


def test_a_test_of_the_rank_within_a_subgroup_is_no_global_rank_class() -> None:
    assert finding_lines(SUBGROUP) == []


def test_a_test_of_the_global_rank_before_a_subgroup_collective_is_reported() -> None:
    glob = SUBGROUP.replace('dist.get_rank(mesh.get_group("reduction"))', "dist.get_rank()")
    assert [c for c, _ in finding_lines(glob)] == ["DDP005"]


def test_not_hasattr_or_a_rank_test_is_the_comparison() -> None:
    """`not hasattr(args, "local_rank") or args.local_rank == 0`: every process of a
    distributed run has its rank, so the ranks > 0 take the `else` alike (read as unknown,
    they seemed to reach the broadcast too)."""
    src = HEAD_SCHEDULE + (
        "def is_leader(args):\n"
        "    return not hasattr(args, 'local_rank') or args.local_rank == 0\n\n\n"
        "def sync(args, t):\n"
        "    if is_leader(args):\n"
        "        dist.broadcast(t, 0)\n")
    [f] = [f for f in lint_source(src, "t.py", ALL_BUT_PRINT) if f.code == "DDP005"]
    assert "ranks > 0 never reach it" in f.message
