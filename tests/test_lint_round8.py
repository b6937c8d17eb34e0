"""Issue 20, eighth round: false-positive classes of the tuning corpora, each pinned by code of
our own that expects nothing, and by the one-line change that makes the same code wrong."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers import lint_paths, lint_source

from ddpguard.lint import RULES
from ddpguard.lint import lint_source as default_lint

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
    own_count = SIGNAL_PROTOCOL.replace("if signal.item() == 0:\n                    break",
                                        "if step > 3:\n                    break").replace(
        "            loss = optimizer.step(closure)\n            signal.fill_(0)",
        "            loss = closure()\n            signal.fill_(0)")
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
    called = everywhere.replace("    return optimizer.step(closure)",
                                "    if rank == 0:\n        closure()\n    return closure()")
    assert "DDP005" in [f.code for f in lint_source(called)]


UNCALLED_METHOD = """import torch
import torch.distributed as dist


class Checkpointer:
    def __init__(self, model, path):
        self.model, self.path = model, path

    def save(self):
        torch.save(self.model.state_dict(), self.path)


def main(model, rank):
    dist.init_process_group("gloo")
    if rank == 0:
        torch.save(model.state_dict(), "last.pth")
"""


def test_torch_save_is_no_call_of_a_method_named_save() -> None:
    # `Checkpointer.save` is called from no line of this file (a caller elsewhere decides
    # which ranks run it); `torch.save(...)` is torch's function, not that method.
    assert lint_source(UNCALLED_METHOD) == []
    # Called on an object of the module on every rank: every rank writes the one path.
    called = UNCALLED_METHOD + "    Checkpointer(model, 'ckpt.pth').save()\n"
    assert [f.code for f in lint_source(called)] == ["DDP007"]


CONVERT_TOOL = """import torch
import torch.distributed as dist


def get_dist_info():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def load_state_dict(module, state_dict):
    missing = [k for k in module.state_dict() if k not in state_dict]
    rank, _ = get_dist_info()
    if missing and rank == 0:
        print("missing keys:", missing)
    module.load_state_dict(state_dict, strict=False)


def main(model, src, dst):
    load_state_dict(model, torch.load(src, map_location="cpu"))
    torch.save(model.state_dict(), dst)


main(torch.nn.Linear(2, 2), "in.pth", "out.pth")
"""


def test_a_tool_that_only_reads_the_rank_runs_as_one_process(tmp_path: Path) -> None:
    # CenterPoint's checkpoint converter: the rank is read only by a copied helper that
    # prints on rank 0; nothing sets up a group, wraps a model or calls a collective.
    assert lint_source(CONVERT_TOOL) == []
    tool = tmp_path / "tools" / "convert.py"
    tool.parent.mkdir()
    tool.write_text(CONVERT_TOOL)
    # A trainer beside it that does form a group changes nothing: it does not import it.
    (tmp_path / "train.py").write_text(
        "import torch.distributed as dist\n\n\ndef main():\n"
        "    dist.init_process_group('nccl')\n    dist.barrier()\n")
    assert lint_paths([tmp_path]) == []
    # The tool launched as a group (mmcv's init_dist): every rank writes out.pth.
    launched = CONVERT_TOOL.replace("def main(model, src, dst):\n",
                                    "def main(model, src, dst):\n    init_dist('pytorch')\n")
    assert [f.code for f in lint_source(launched)] == ["DDP007"]


def test_a_library_module_runs_in_the_group_of_the_file_that_imports_it(
        tmp_path: Path) -> None:
    (tmp_path / "ckpt.py").write_text(
        "import torch\nimport torch.distributed as dist\n\nHOOKS = []\n\n\n"
        "def save(model, path):\n    torch.save(model.state_dict(), path)\n\n\n"
        "def on_exit(model):\n    if dist.get_rank() == 0:\n        print('saving')\n"
        "    save(model, 'model.pth')\n\n\nHOOKS.append(on_exit)\n")
    trainer = ("import torch.distributed as dist\n{}\n\ndef main(model):\n"
               "    dist.init_process_group('nccl')\n")
    (tmp_path / "train.py").write_text(trainer.format("import ckpt\n"))
    assert [(Path(f.path).name, f.code) for f in lint_paths([tmp_path])] == [
        ("ckpt.py", "DDP007")]
    # Nobody imports it: on its own it is no multi-process program.
    (tmp_path / "train.py").write_text(trainer.format(""))
    assert lint_paths([tmp_path]) == []


def test_jupyter_autosaved_copies_are_not_linted(tmp_path: Path) -> None:
    # OpenP5 commits `.ipynb_checkpoints/main-checkpoint.py` beside `main.py`: one finding
    # would be reported twice.
    bad = ("import torch.distributed as dist\n\n\ndef f(rank):\n"
           "    if rank == 0:\n        dist.barrier()\n")
    (tmp_path / "main.py").write_text(bad)
    (tmp_path / ".ipynb_checkpoints").mkdir()
    (tmp_path / ".ipynb_checkpoints" / "main-checkpoint.py").write_text(bad)
    assert [Path(f.path).name for f in lint_paths([tmp_path])] == ["main.py"]


SUBCOMMANDS = """import torch
import torch.distributed as dist


def setup():
    dist.init_process_group("nccl")


def train(model):
    setup()
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), "trained.pth")
    dist.barrier()


def export(model, out):
    torch.save(model.state_dict(), out)


def main(command, model, out):
    if command == "train":
        train(model)
    elif command == "export":
        export(model, out)


if __name__ == "__main__":
    main("export", torch.nn.Linear(2, 2), "model.pth")
"""


def test_a_subcommand_that_forms_no_group_writes_alone() -> None:
    # deepmd's entry point: `train` sets up the group, `change-bias` converts a checkpoint in
    # one process; the converter's save is no race.
    assert lint_source(SUBCOMMANDS) == []
    # The export mode sets up the group as well: now every rank writes model.pth.
    both = SUBCOMMANDS.replace("def export(model, out):\n",
                               "def export(model, out):\n    dist.init_process_group('nccl')\n")
    assert [f.code for f in lint_source(both)] == ["DDP007"]


def test_a_tuple_default_is_a_literal_not_a_marker() -> None:
    # DAMO-YOLO: `def inference(..., iou_types=("bbox",), expected_results=())`, passed on
    # whole to the evaluation; the tuple was read as the analysis's own "caller's parameter"
    # marker and crashed the run.
    src = ("import torch.distributed as dist\n\n\n"
           "def evaluate(predictions, iou_types):\n"
           "    if iou_types:\n        print(predictions)\n\n\n"
           "def inference(model, data, iou_types=()):\n"
           "    predictions = model(data)\n    dist.barrier()\n"
           "    if dist.get_rank() != 0:\n        return None\n"
           "    return evaluate(predictions, iou_types=iou_types)\n\n\n"
           "def main(model, data):\n    if dist.get_rank() != 0:\n        dist.barrier()\n"
           "    inference(model, data)\n"
           "    if dist.get_rank() == 0:\n        dist.barrier()\n")
    assert lint_source(src) == []


def test_a_rule_that_fails_is_reported_and_the_others_still_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpguard.lint import catalog

    def broken(info: object) -> object:
        raise IndexError("tuple index out of range")

    monkeypatch.setitem(catalog.RULES, "DDP005",
                        dataclasses.replace(catalog.RULES["DDP005"], check=broken))
    src = ("import torch.distributed as dist\nfrom torch.utils.data import DistributedSampler\n\n\n"
           "def main(ds):\n    s = DistributedSampler(ds)\n    for epoch in range(3):\n"
           "        for x in s:\n            pass\n")
    found = lint_source(src)
    assert [f.code for f in found] == ["DDP000", "DDP001"]
    assert "internal error" in found[0].message and "DDP005" in found[0].message
    assert "IndexError" in found[0].message


NO_GRAD_PROBE = """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main(model, loader, cfg, rank):
    dist.init_process_group("nccl")
    model = DistributedDataParallel(model, broadcast_buffers=cfg.broadcast_buffers)
    for x in loader:
        model(x).sum().backward()
        if rank == 0:
            with torch.no_grad():
                print(model(x).mean())
        dist.barrier()
"""


def test_a_no_grad_forward_with_buffer_broadcast_from_a_config_is_unproven() -> None:
    # physicsnemo: `broadcast_buffers=dist.broadcast_buffers`, False by default in its
    # manager; under no_grad the buffer broadcast is a forward's only collective.
    assert lint_source(NO_GRAD_PROBE) == []
    on = NO_GRAD_PROBE.replace("broadcast_buffers=cfg.broadcast_buffers", "broadcast_buffers=True")
    assert [f.code for f in lint_source(on)] == ["DDP006"]


def test_ddp_without_device_ids_needs_a_visible_bare_cuda() -> None:
    # A model placed by the caller (on its own rank's device, for all this file shows) is no
    # evidence that every process uses cuda:0.
    placed_elsewhere = ("import torch.distributed as dist\n"
                        "from torch.nn.parallel import DistributedDataParallel\n\n\n"
                        "def wrap(model):\n    dist.init_process_group('nccl')\n"
                        "    return DistributedDataParallel(model)\n")
    assert lint_source(placed_elsewhere) == []
    bare = placed_elsewhere.replace("    return Dist", "    model.cuda()\n    return Dist")
    assert [f.code for f in lint_source(bare)] == ["DDP015"]
    inline = placed_elsewhere.replace("DistributedDataParallel(model)",
                                      "DistributedDataParallel(model.to('cuda'))")
    assert [f.code for f in lint_source(inline)] == ["DDP015"]


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
        "        threading.Thread(target=batching_loop, args=(queue,), daemon=True).start()\n", "")
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
    ranked = CHIEF.replace("from tml.core import env\n", "") \
        .replace("env.is_chief()", "is_chief()").replace("env.is_reader()", "False") + (
        "\n\ndef is_chief():\n    return dist.get_rank() == 0\n")
    assert [f.code for f in lint_source(ranked)] == ["DDP005"]


TRAINER_LOADER = """import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


class Trainer:
    def __init__(self, dataset):
        sampler = DistributedSampler(dataset, shuffle=True)
        self.dataloader = DataLoader(dataset, sampler=sampler, batch_size=8)


def main(dataset, model, epochs):
    dist.init_process_group("nccl")
    trainer = Trainer(dataset)
    for epoch in range(epochs):
        for x in trainer.dataloader:
            model(x).sum().backward()
"""


def test_a_loader_kept_on_an_instance_of_this_files_class() -> None:
    # physicsnemo's MGNTrainer: the sampler is built in __init__, the epochs run in main()
    # over `trainer.dataloader`, and nobody calls set_epoch (a real miss of round 8's tuning).
    assert [(f.code, f.line) for f in lint_source(TRAINER_LOADER)] == [("DDP001", 14)]
    fixed = TRAINER_LOADER.replace(
        "        for x in trainer.dataloader:",
        "        trainer.dataloader.sampler.set_epoch(epoch)\n        for x in trainer.dataloader:")
    assert lint_source(fixed) == []


CRASH_DUMP = """import math
import sys
import torch
import torch.distributed as dist


def train(model, loader, out):
    dist.init_process_group("nccl")
    for batch in loader:
        loss = model(batch)
        if not math.isfinite(loss.item()):
            torch.save(batch, out + "/debug_batch.pt")
            print("loss is not finite, stopping", file=sys.stderr)
            sys.exit(1)
        loss.backward()


if __name__ == "__main__":
    train(torch.nn.Linear(2, 1), [torch.ones(2)], "runs")
"""


def test_a_dump_on_the_way_out_is_no_checkpoint() -> None:
    # ml-4m: the batch that made the loss NaN, saved just before the process exits.
    assert lint_source(CRASH_DUMP) == []
    going_on = CRASH_DUMP.replace("            sys.exit(1)\n", "")
    assert [f.code for f in lint_source(going_on)] == ["DDP007"]


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
    gone = MERGE.replace("            dist.barrier()\n            return None\n",
                         "            return None\n")
    assert [f.code for f in lint_source(gone)] == ["DDP019"]


def test_is_first_worker_is_a_leader_test() -> None:
    src = ("import torch\nimport torch.distributed as dist\nfrom utils.util import is_first_worker"
           "\n\n\ndef train(model, out):\n    dist.init_process_group('nccl')\n"
           "    if is_first_worker():\n        torch.save(model.state_dict(), out)\n\n\n"
           "if __name__ == '__main__':\n    train(torch.nn.Linear(2, 2), 'm.pth')\n")
    assert lint_source(src) == []
    assert [f.code for f in lint_source(src.replace("    if is_first_worker():\n        torch",
                                                    "    if True:\n        torch"))] == ["DDP007"]


N_GPU = """import torch
import torch.distributed as dist


def main(args, model):
    if args.local_rank == -1:
        args.n_gpu = torch.cuda.device_count()
    else:
        dist.init_process_group("nccl")
        args.n_gpu = 1
    if args.n_gpu > 1:
        torch.save(model.module.state_dict(), "model.pth")
    elif args.local_rank in [-1, 0]:
        torch.save(model.state_dict(), "model.pth")


if __name__ == "__main__":
    main(None, None)
"""


def test_n_gpu_set_to_one_for_ddp_is_the_dataparallel_test() -> None:
    # The old example trainers (OpenMatch, DensePhrases): `n_gpu > 1` is the DataParallel
    # path, false under DDP, where n_gpu is 1: its save is no rank's.
    assert lint_source(N_GPU) == []
    per_node = N_GPU.replace("        args.n_gpu = 1\n", "        args.n_gpu = 2\n")
    assert [f.code for f in lint_source(per_node)] == ["DDP007"]


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
    assert [f.code for f in lint_source(NEGATED.replace("is_training=not evaluate",
                                                        "is_training=True"))] == ["DDP005"]


def test_a_save_reached_only_from_a_framework_hook(tmp_path: Path) -> None:
    # RetroMAE: HF's Trainer calls `_save` on the process that saves; nothing of the
    # project calls it, so the model's `save()` and its pooler's writes are the hook's.
    (tmp_path / "modeling.py").write_text(
        "import torch\nimport torch.distributed as dist\n\n\nclass Pooler(torch.nn.Module):\n"
        "    def save_pooler(self, path):\n        torch.save(self.state_dict(), path + '/p.pt')"
        "\n\n\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()"
        "\n        self.pooler = Pooler()\n\n    def save(self, out):\n"
        "        self.pooler.save_pooler(out)\n\n    def sync(self, t):\n"
        "        dist.all_reduce(t)\n")
    trainer = ("from transformers import Trainer\n\n\nclass MyTrainer(Trainer):\n"
               "    def _save(self, output_dir=None):\n        self.model.save(output_dir)\n")
    (tmp_path / "trainer.py").write_text(trainer)
    assert lint_paths([tmp_path]) == []
    # The project's own loop calls the hook on every rank: now every rank writes p.pt.
    (tmp_path / "trainer.py").write_text(
        trainer + "\n\ndef main(t):\n    t.train()\n    t._save('out')\n")
    assert [(Path(f.path).name, f.code) for f in lint_paths([tmp_path])] == [
        ("modeling.py", "DDP007")]


def test_a_flag_set_to_constants_in_the_arms_of_a_rank_test(tmp_path: Path) -> None:
    # HybrIK (round 8's blind half, tuning data since): env.py sets `opt.log = True` on rank
    # 0 and `False` elsewhere; the training scripts save under `if opt.log:`.
    (tmp_path / "env.py").write_text(
        "import torch.distributed as dist\n\n\ndef init_dist(opt):\n"
        "    dist.init_process_group('nccl', rank=opt.rank, world_size=opt.world_size)\n"
        "    if opt.rank == 0:\n        opt.log = True\n    else:\n        opt.log = False\n")
    script = ("import torch\nfrom env import init_dist\n\n\ndef main(opt, model):\n"
              "    init_dist(opt)\n    if opt.log:\n        torch.save(model.state_dict(), 'm.pth')"
              "\n\n\nif __name__ == '__main__':\n    main(None, None)\n")
    (tmp_path / "train.py").write_text(script)
    assert lint_paths([tmp_path]) == []
    # In one file the flag is the test itself: rank 0 alone reaches the barrier under it.
    one = ("import torch.distributed as dist\n\n\ndef main(rank):\n"
           "    if rank == 0:\n        log = True\n    else:\n        log = False\n"
           "    if log:\n        dist.barrier()\n")
    assert [f.code for f in lint_source(one)] == ["DDP005"]
    assert lint_source(one.replace("        dist.barrier()\n", "        print('log')\n")) == []


def test_a_callees_return_ends_only_the_callee_past_the_path_limit() -> None:
    # With more flags than the path-by-path check enumerates (2**8 paths), the alignment
    # alone must still know that `log`'s early return does not leave `f`.
    flags = "".join(f"    if t.flag{k}:\n        dist.all_reduce(t)\n" for k in range(9))
    src = ("import torch\nimport torch.distributed as dist\n\n\ndef log(x):\n"
           "    if x is None:\n        return\n    torch.save(x, f'log{dist.get_rank()}.pt')\n\n\n"
           "def f(t, rank):\n" + flags + "    if rank == 0:\n        log(t)\n"
           "    dist.broadcast(t, 0)\n")
    assert lint_source(src) == []
    # Rank 0 itself leaving does part them (the other ranks wait in the broadcast).
    left = [f.code for f in lint_source(src.replace("        log(t)\n", "        return\n"))]
    assert left in (["DDP005"], ["DDP019"])


def test_rules_that_the_blind_reviews_did_not_bear_out_are_off_by_default() -> None:
    # DDP007 (every rank writes one file): 0 true in 11 first-contact findings over the blind
    # halves of rounds 6-8 (8 false, 3 debatable: identical bytes, unreachable branches).
    # DDP013 stays: never false (2 true, 7 debatable where no documented config accumulates).
    assert RULES["DDP007"].default is False
    assert RULES["DDP013"].default is True
    seed = ("import torch\nimport torch.distributed as dist\n\n\ndef main(model):\n"
            "    dist.init_process_group('nccl')\n    torch.save(model.state_dict(), 'm.pt')\n\n\n"
            "if __name__ == '__main__':\n    main(None)\n")
    assert default_lint(seed) == []
    assert [f.code for f in lint_source(seed)] == ["DDP007"]
