"""DDP007 every rank writes one file.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import (
    ALL_BUT_PRINT,
    ddp_source,
    fixture_line_of,
    fixture_lines_once,
    inline_lines,
    lint_paths,
    lint_paths_with_defaults,
    lint_source,
    lint_with_defaults,
    snippet_codes,
    snippet_lines,
)

from ddpguard.lint import RULES, Selection


def test_launch_mode_arm_is_not_every_rank() -> None:
    src = """
    dist.init_process_group("nccl")
    if not args.distributed:
        torch.save(state, "single.pt")
    if args.distributed and dist.get_rank() == 0:
        torch.save(state, "ckpt.pt")
    """
    assert snippet_codes(src) == []
    assert "DDP007" in snippet_codes(src.replace("not args.distributed", "args.fast"))


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
    assert snippet_lines(src) == [("DDP007", 8)]


def test_same_contents_pickle_is_not_reported() -> None:
    src = """
    dist.init_process_group("nccl")
    pickle.dump(params, open("params.pkl", "wb"))
    pickle.dump(local_feats, open("feats.pkl", "wb"))
    """
    assert snippet_lines(src) == [("DDP007", 4)]


def test_an_uncalled_helper_that_saves_through_another_is_left_to_its_caller(
    tmp_path: Path,
) -> None:
    src = """\
def persist(obj, path):
    torch.save(obj, path)


def export_ema(src, dst):
    persist(torch.load(src, map_location="cpu"), dst)


def setup():
    dist.init_process_group("gloo")
"""
    assert inline_lines(src) == []
    called = (
        src + "\n\nif __name__ == '__main__':\n    setup()\n"
        "    export_ema('a.pt', 'b.pt')\n    dist.destroy_process_group()\n"
    )
    assert inline_lines(called) == [("DDP007", 2)]


def test_the_name_passed_as_rank_to_init_process_group_is_the_rank() -> None:
    src = """\
def run(proc_id, world, model):
    dist.init_process_group("nccl", rank=proc_id, world_size=world)
    if proc_id == 0:
        torch.save(model.state_dict(), "model.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.multiprocessing.spawn(run, args=(2, None), nprocs=2)
"""
    assert inline_lines(src) == []
    assert inline_lines(src.replace("rank=proc_id, ", "")) == [("DDP007", 4)]


HELPERS = """\
import os

import torch
import torch.distributed as dist


def save(model, step, out_dir):
    path = os.path.join(out_dir, "checkpoint.pth")
    torch.save({"model": model.state_dict(), "step": step}, path)
"""


def test_a_helper_named_like_torch_save_is_still_left_to_its_caller(tmp_path: Path) -> None:
    # `torch.save(...)` inside the helper is not a call of the helper `save`.
    (tmp_path / "utils.py").write_text(HELPERS)
    (tmp_path / "train.py").write_text(
        "import torch.distributed as dist\nimport utils\n\n\n"
        "def main(model):\n    dist.init_process_group('gloo')\n"
        "    if dist.get_rank() == 0:\n        utils.save(model, 1, 'out')\n"
        "    dist.destroy_process_group()\n"
    )
    assert [
        (f.code, f.path.name) for f in lint_paths_with_defaults([tmp_path], ALL_BUT_PRINT)
    ] == []
    # Called here on every rank, the same helper writes one file from every rank.
    called = (
        HELPERS + "\n\nif __name__ == '__main__':\n    dist.init_process_group('gloo')\n"
        "    save(torch.nn.Linear(1, 1), 1, 'out')\n    dist.destroy_process_group()\n"
    )
    assert [(f.code, f.line) for f in lint_with_defaults(called, "utils.py", ALL_BUT_PRINT)] == [
        ("DDP007", 9)
    ]


TRAINER = "DDP007_leader_decorator_and_paths.py"


TOOL = "DDP007_tool_stub_memo.py"


def test_the_trainer_is_quiet() -> None:
    assert fixture_lines_once(TRAINER) == []


def test_a_leader_only_decorator_guards_the_method() -> None:
    # `@main_process` runs the save on rank 0 alone; without it every rank saves.
    save = fixture_line_of(TRAINER, 'f"ckpt_{epoch}.pt"')
    assert fixture_lines_once(TRAINER, "    @main_process\n", "") == [("DDP007", save - 1)]


def test_a_per_rank_path_passed_by_the_caller_is_one_file_per_rank() -> None:
    # The sharded arm names the rank in the path it hands to `_write`; take the rank out
    # and the ranks > 0 write rank 0's file.
    write = fixture_line_of(TRAINER, "torch.save(self.model.state_dict(), path)")
    assert fixture_lines_once(TRAINER, 'f"best_w{self.rank}.th"', '"best_w.th"') == [
        ("DDP007", write)
    ]


def test_an_assert_before_a_collective_is_its_own_rule_off_by_default() -> None:
    assert RULES["DDP022"].default is False and RULES["DDP019"].default is True
    line = fixture_line_of(TRAINER, "assert len(gathered) == world")
    assert fixture_lines_once(TRAINER, selection=ALL_BUT_PRINT) == [("DDP022", line)]
    # A raise is a failure too: torchrun ends the job when one rank fails, so it
    # is DDP022 with the assert, off by default; a rank that returns in good
    # order leaves the others waiting: DDP019, on by default.
    raise_ = (
        "assert len(gathered) == world",
        "if len(gathered) != world:\n                raise ValueError(world)",
    )
    assert fixture_lines_once(TRAINER, *raise_) == []
    assert fixture_lines_once(TRAINER, *raise_, selection=ALL_BUT_PRINT) == [("DDP022", line + 1)]
    returned = fixture_lines_once(
        TRAINER,
        "assert len(gathered) == world",
        "if len(gathered) != world:\n                return None",
    )
    assert returned == [("DDP019", line + 1)]


def test_the_tool_is_quiet() -> None:
    assert fixture_lines_once(TOOL) == []
    assert fixture_lines_once(TOOL, selection=ALL_BUT_PRINT) == []


def test_an_assert_that_refuses_ddp_ends_the_distributed_run() -> None:
    save = fixture_line_of(TOOL, "torch.save(")
    assert fixture_lines_once(
        TOOL, '    assert not args.distributed, "this tool does not work with DDP"\n', ""
    ) == [("DDP007", save)]
    # An assert that a distributed run passes ends nothing.
    assert fixture_lines_once(TOOL, "assert not args.distributed", "assert args.distributed") == [
        ("DDP007", save)
    ]


def test_a_stub_is_no_exit_to_report() -> None:
    line = fixture_line_of(TOOL, "raise NotImplementedError(")
    assert fixture_lines_once(
        TOOL, "raise NotImplementedError(", "raise RuntimeError(", selection=ALL_BUT_PRINT
    ) == [("DDP022", line)]


def test_a_constant_false_test_is_never_taken() -> None:
    line = fixture_line_of(TOOL, "return -1")
    assert fixture_lines_once(TOOL, "if False and path.exists():", "if path.exists():") == [
        ("DDP019", line)
    ]


def test_a_memoised_helper_is_unknown() -> None:
    # Without the cache rank 0 runs score(best) alone, and its all_gather waits for the others.
    got = fixture_lines_once(TOOL, "    @functools.cache\n", "")
    assert [c for c, _ in got] == ["DDP034"]


def test_a_flag_set_from_the_rank_in_another_file(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(
        textwrap.dedent("""
        import torch.distributed as dist
        from train import train
        def main(args, model):
            dist.init_process_group("nccl")
            args.should_save = args.logs is not None and dist.get_rank() == 0
            train(args, model)
        """)
    )
    (tmp_path / "train.py").write_text(
        textwrap.dedent("""
        import torch
        import torch.distributed as dist
        def train(args, model):
            model.train()
            for step in range(10):
                if args.should_save and step % 5 == 0:
                    torch.save(model.state_dict(), f"{args.out}/latest.pt")
            dist.barrier()


        if __name__ == "__main__":
            train(None, None)
        """)
    )
    assert [(f.code, Path(f.path).name) for f in lint_paths([tmp_path])] == []
    # Linted alone, train.py cannot know the flag: the save looks like every rank's.
    assert [f.code for f in lint_paths([tmp_path / "train.py"])] == ["DDP007"]


ENGINE_SAVES = ddp_source("""
    import os

    class Engine:
        def __init__(self, model):
            self.model = model

        def save(self):
            torch.save(self.model.state_dict(), "model.pth")

    def main(model):
        rank = int(os.environ["RANK"])
        dist.init_process_group("nccl")
        trainer = Engine(model)
        for epoch in range(10):
            if rank == 0:
                trainer.save()

    if __name__ == "__main__":
        main(torch.nn.Linear(2, 2))
    """)


def test_a_method_called_on_an_instance_of_a_class_of_this_file() -> None:
    # `trainer = Engine(...)`: `trainer.save()` runs Engine.save, here on rank 0 only.
    assert [f.code for f in lint_source(ENGINE_SAVES)] == []
    every = ENGINE_SAVES.replace(
        "        if rank == 0:\n            trainer.save()", "        trainer.save()"
    )
    assert [f.code for f in lint_source(every)] == ["DDP007"]


CONFIG = ddp_source("""
    class Trainer:
        def __init__(self, config, model):
            self.config, self.model = config, model

        def save(self, path):
            if not self.config["single_spec"] and self.config["local_rank"] != 0:
                return
            torch.save(self.model.state_dict(), path)

        def fit(self, loader, path):
            for x in loader:
                self.model(x).sum().backward()
            self.save(path)

    def main(config, model, loader):
        dist.init_process_group("nccl")
        Trainer(config, model).fit(loader, "ckpt.pth")

    if __name__ == "__main__":
        main({}, torch.nn.Linear(2, 2), [])
    """)


def test_a_rank_read_from_a_config_by_key_and_a_single_process_flag() -> None:
    # `config["local_rank"]` is the local rank; `not config["single_spec"]` holds in a
    # distributed run: ranks > 0 leave before the save.
    assert [f.code for f in lint_source(CONFIG)] == []
    unknown = CONFIG.replace('self.config["single_spec"]', 'self.config["fast"]')
    # An unknown conjunct beside the rank test: the ranks > 0 may or may not leave, so the
    # save is not proven to run on every rank either.
    assert [f.code for f in lint_source(unknown)] == []
    assert [
        f.code
        for f in lint_source(
            CONFIG.replace(
                '        if not self.config["single_spec"] and self.config["local_rank"] != 0:\n'
                "            return\n",
                "",
            )
        )
    ] == ["DDP007"]


def test_an_is_root_predicate_tests_the_rank() -> None:
    src = ddp_source("""
        def save_model(backend, obj, path):
            if not backend.is_root_worker():
                return
            torch.save(obj, path)

        def main(backend, obj):
            dist.init_process_group("nccl")
            save_model(backend, obj, "dalle.pt")

        if __name__ == "__main__":
            main(None, {})
        """)
    assert [f.code for f in lint_source(src)] == []
    assert [f.code for f in lint_source(src.replace("is_root_worker", "is_ready"))] == ["DDP007"]


def test_an_instance_method_called_on_the_local_rank_0_writes_once_per_node() -> None:
    src = ENGINE_SAVES.replace(
        'rank = int(os.environ["RANK"])', 'rank = int(os.environ["LOCAL_RANK"])'
    ).replace(
        'dist.init_process_group("nccl")',
        'dist.init_process_group("nccl")\n    print(os.environ["NODE_RANK"])',
    )
    assert [f.code for f in lint_source(src, selection=Selection(extend_select=("DDP017",)))] == [
        "DDP017"
    ]


def test_a_parallel_flag_compared_with_true_is_the_launch_mode() -> None:
    # `if (parallel == True): if rank == 0: save()  else: save()`: the else arm is the
    # single-process run, which a distributed run never takes.
    src = ENGINE_SAVES.replace(
        "        if rank == 0:\n            trainer.save()\n",
        "        if parallel == True:\n"
        "            if rank == 0:\n                trainer.save()\n"
        "        else:\n            trainer.save()\n",
    ).replace("def main(model):", "def main(model, parallel):")
    assert "parallel == True" in src
    assert [f.code for f in lint_source(src)] == []
    assert [f.code for f in lint_source(src.replace("parallel == True", "parallel == False"))] == [
        "DDP007"
    ]


def test_other_launchers_spell_the_rank_as_a_call() -> None:
    src = ddp_source("""
        import horovod.torch as hvd

        def save(model):
            if hvd.rank() == 0:
                torch.save(model.state_dict(), "m.pt")

        def main():
            dist.init_process_group("nccl")
            save(torch.nn.Linear(2, 2))

        if __name__ == "__main__":
            main()
        """)
    assert [f.code for f in lint_source(src)] == []
    assert [f.code for f in lint_source(src.replace("hvd.rank() == 0", "hvd.size() == 1"))] == [
        "DDP007"
    ]


def test_a_write_in_another_file_is_reported_at_this_files_call(tmp_path: Path) -> None:
    (tmp_path / "lib.py").write_text(
        "import torch\n\n\ndef dump(obj, path):\n    torch.save(obj, path + '/seeds.pth')\n"
    )
    (tmp_path / "main.py").write_text(
        textwrap.dedent("""
        import torch.distributed as dist
        from lib import dump


        def main(obj, path):
            dist.init_process_group("nccl")
            dump(obj, path)


        if __name__ == "__main__":
            main(None, "/tmp/out")
        """)
    )
    [f] = lint_paths([tmp_path])
    assert (Path(f.path).name, f.line, f.code) == ("main.py", 8, "DDP007")
    assert "lib.py:5" in f.message


def test_a_master_field_is_the_leader_flag() -> None:
    src = ENGINE_SAVES.replace(
        'rank = int(os.environ["RANK"])', "env = DistEnv(master=dist.get_rank() == 0)"
    ).replace("        if rank == 0:\n", "        if env.master:\n")
    assert "env.master" in src
    assert [f.code for f in lint_source(src)] == []


def _project(tmp_path: Path, flag: str) -> list[tuple[str, str]]:
    (tmp_path / "checkpoint.py").write_text(
        textwrap.dedent("""
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
        """)
    )
    (tmp_path / "train.py").write_text(
        textwrap.dedent(f"""
        import torch.distributed as dist
        from checkpoint import Checkpointer, Periodic
        import comm


        def main(model):
            dist.init_process_group("nccl")
            ckpt = Checkpointer(model, "out", save_to_disk={flag})
            periodic = Periodic(ckpt, 100)
            for it in range(1000):
                periodic.step(it)
        """)
    )
    return [(Path(f.path).name, f.code) for f in lint_paths([tmp_path])]


def test_a_rank_flag_passed_to_a_constructor_and_kept_on_self(tmp_path: Path) -> None:
    # fast-reid: every checkpointer that saves is built with
    # save_to_disk=comm.is_main_process() in another file.
    assert _project(tmp_path, "comm.is_main_process()") == []
    assert _project(tmp_path, "True") == [("checkpoint.py", "DDP007")]


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
    # directory variable named `save` is a use of it.
    assert lint_source(UNUSED_SAVE) == []
    used = UNUSED_SAVE + (
        "\n\nif __name__ == '__main__':\n    save(torch.nn.Linear(2, 2), 'f.pth')\n"
    )
    assert [f.code for f in lint_source(used)] == ["DDP007"]
    # Called nowhere, but named by its bare name as a value (`mp.spawn(save, ...)`-style).
    passed = UNUSED_SAVE + "\n\ndef launch(spawn):\n    spawn(save, nprocs=2)\n"
    assert [f.code for f in lint_source(passed)] == ["DDP007"]


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
        "    dist.init_process_group('nccl')\n    dist.barrier()\n"
    )
    assert lint_paths([tmp_path]) == []
    # The tool launched as a group (mmcv's init_dist): every rank writes out.pth.
    launched = CONVERT_TOOL.replace(
        "def main(model, src, dst):\n", "def main(model, src, dst):\n    init_dist('pytorch')\n"
    )
    assert [f.code for f in lint_source(launched)] == ["DDP007"]


def test_a_library_module_runs_in_the_group_of_the_file_that_imports_it(tmp_path: Path) -> None:
    (tmp_path / "ckpt.py").write_text(
        "import torch\nimport torch.distributed as dist\n\nHOOKS = []\n\n\n"
        "def save(model, path):\n    torch.save(model.state_dict(), path)\n\n\n"
        "def on_exit(model):\n    if dist.get_rank() == 0:\n        print('saving')\n"
        "    save(model, 'model.pth')\n\n\nHOOKS.append(on_exit)\n"
    )
    trainer = (
        "import torch.distributed as dist\n{}\n\ndef main(model):\n"
        "    dist.init_process_group('nccl')\n"
    )
    (tmp_path / "train.py").write_text(trainer.format("import ckpt\n"))
    assert [(Path(f.path).name, f.code) for f in lint_paths([tmp_path])] == [("ckpt.py", "DDP007")]
    # Nobody imports it: on its own it is no multi-process program.
    (tmp_path / "train.py").write_text(trainer.format(""))
    assert lint_paths([tmp_path]) == []


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
    both = SUBCOMMANDS.replace(
        "def export(model, out):\n",
        "def export(model, out):\n    dist.init_process_group('nccl')\n",
    )
    assert [f.code for f in lint_source(both)] == ["DDP007"]


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


def test_is_first_worker_is_a_leader_test() -> None:
    src = (
        "import torch\nimport torch.distributed as dist\nfrom utils.util import is_first_worker"
        "\n\n\ndef train(model, out):\n    dist.init_process_group('nccl')\n"
        "    if is_first_worker():\n        torch.save(model.state_dict(), out)\n\n\n"
        "if __name__ == '__main__':\n    train(torch.nn.Linear(2, 2), 'm.pth')\n"
    )
    assert lint_source(src) == []
    assert [
        f.code
        for f in lint_source(
            src.replace("    if is_first_worker():\n        torch", "    if True:\n        torch")
        )
    ] == ["DDP007"]


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


def test_a_save_reached_only_from_a_framework_hook(tmp_path: Path) -> None:
    # RetroMAE: HF's Trainer calls `_save` on the process that saves; nothing of the
    # project calls it, so the model's `save()` and its pooler's writes are the hook's.
    (tmp_path / "modeling.py").write_text(
        "import torch\nimport torch.distributed as dist\n\n\nclass Pooler(torch.nn.Module):\n"
        "    def save_pooler(self, path):\n        torch.save(self.state_dict(), path + '/p.pt')"
        "\n\n\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()"
        "\n        self.pooler = Pooler()\n\n    def save(self, out):\n"
        "        self.pooler.save_pooler(out)\n\n    def sync(self, t):\n"
        "        dist.all_reduce(t)\n"
    )
    trainer = (
        "from transformers import Trainer\n\n\nclass MyTrainer(Trainer):\n"
        "    def _save(self, output_dir=None):\n        self.model.save(output_dir)\n"
    )
    (tmp_path / "trainer.py").write_text(trainer)
    assert lint_paths([tmp_path]) == []
    # The project's own loop calls the hook on every rank: now every rank writes p.pt.
    (tmp_path / "trainer.py").write_text(
        trainer + "\n\ndef main(t):\n    t.train()\n    t._save('out')\n"
    )
    assert [(Path(f.path).name, f.code) for f in lint_paths([tmp_path])] == [
        ("modeling.py", "DDP007")
    ]
