"""Issue 20, sixth round: the false-positive classes of the lint9 tuning corpora (trainers
with leader-only decorators and per-rank paths chosen by the caller, invariant asserts,
tools that refuse DDP, stubs, dead branches, memoised helpers, no_sync bound to a name, flags
set in another file, a CPU arm beside a GPU arm), each pinned by code of our own that expects
nothing, and by the one-line change that makes the same code wrong again (the inference must
still see real bugs)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from ddpguard.lint import RULES, Selection, lint_paths, lint_source

CORPUS = Path(__file__).parent / "lint_corpus"
ALL = Selection(select=("ALL",), ignore=("DDP018",))
TRAINER = "fp_leader_decorator_and_paths.py"
TOOL = "fp_tool_stub_memo.py"


def found(name: str, old: str = "", new: str = "",
          selection: Selection | None = None) -> list[tuple[str, int]]:
    source = (CORPUS / name).read_text(encoding="utf-8")
    if old:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return [(f.code, f.line) for f in lint_source(source, name, selection)]


def line_of(name: str, text: str) -> int:
    lines = (CORPUS / name).read_text(encoding="utf-8").splitlines()
    [n] = [i for i, line in enumerate(lines, 1) if text in line]
    return n


def test_the_trainer_is_quiet() -> None:
    assert found(TRAINER) == []


def test_a_leader_only_decorator_guards_the_method() -> None:
    # `@main_process` runs the save on rank 0 alone; without it every rank saves.
    save = line_of(TRAINER, 'f"ckpt_{epoch}.pt"')
    assert found(TRAINER, "    @main_process\n", "") == [("DDP007", save - 1)]


def test_a_per_rank_path_passed_by_the_caller_is_one_file_per_rank() -> None:
    # The sharded arm names the rank in the path it hands to `_write`; take the rank out
    # and the ranks > 0 write rank 0's file.
    write = line_of(TRAINER, "torch.save(self.model.state_dict(), path)")
    assert found(TRAINER, 'f"best_w{self.rank}.th"', '"best_w.th"') == [("DDP007", write)]


def test_an_assert_before_a_collective_is_its_own_rule_off_by_default() -> None:
    assert RULES["DDP022"].default is False and RULES["DDP019"].default is True
    line = line_of(TRAINER, "assert len(gathered) == world")
    assert found(TRAINER, selection=ALL) == [("DDP022", line)]
    # A raise that the same rank 0 can meet is an exit that happens: DDP019, on by default.
    raised = found(TRAINER, "assert len(gathered) == world",
                   "if len(gathered) != world:\n                raise ValueError(world)")
    assert raised == [("DDP019", line + 1)]


def test_the_tool_is_quiet() -> None:
    assert found(TOOL) == []
    assert found(TOOL, selection=ALL) == []


def test_an_assert_that_refuses_ddp_ends_the_distributed_run() -> None:
    save = line_of(TOOL, "torch.save(")
    assert found(TOOL, '    assert not args.distributed, "this tool does not work with DDP"\n',
                 "") == [("DDP007", save)]
    # An assert that a distributed run passes ends nothing.
    assert found(TOOL, "assert not args.distributed", "assert args.distributed") == [
        ("DDP007", save)]


def test_a_stub_is_no_exit_to_report() -> None:
    line = line_of(TOOL, "raise NotImplementedError(")
    assert found(TOOL, "raise NotImplementedError(", "raise RuntimeError(") == [
        ("DDP019", line)]


def test_a_constant_false_test_is_never_taken() -> None:
    line = line_of(TOOL, "return -1")
    assert found(TOOL, "if False and path.exists():", "if path.exists():") == [
        ("DDP019", line)]


def test_a_memoised_helper_is_unknown() -> None:
    # Without the cache rank 0 runs score(best) alone, and its all_gather waits for the others.
    got = found(TOOL, "    @functools.cache\n", "")
    assert [c for c, _ in got] == ["DDP005"]


def _src(body: str) -> str:
    return "import torch\nimport torch.distributed as dist\n" \
           "from torch.nn.parallel import DistributedDataParallel as DDP\n" + \
        textwrap.dedent(body)


NO_SYNC = _src("""
    from contextlib import nullcontext
    def train(model, loader, opt, accum, rank):
        model = DDP(model, device_ids=[rank])
        for step, batch in enumerate(loader):
            ctx = model.no_sync if step % accum != 0 else nullcontext
            with ctx():
                model(batch).sum().backward()
            if step % accum == 0:
                opt.step()
                opt.zero_grad()
    """)


def test_no_sync_bound_to_a_name_counts() -> None:
    assert [f.code for f in lint_source(NO_SYNC)] == []
    without = NO_SYNC.replace("model.no_sync if step % accum != 0 else nullcontext",
                              "nullcontext")
    assert [f.code for f in lint_source(without)] == ["DDP013"]


CPU_ARM = _src("""
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
    # A bare .cuda() in that arm puts every process on cuda:0 after all.
    bare = CPU_ARM.replace("            model = DDP(model)\n",
                           "            model = model.cuda()\n            model = DDP(model)\n")
    assert [f.code for f in lint_source(bare)] == ["DDP015"]


def test_a_flag_set_from_the_rank_in_another_file(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(textwrap.dedent("""
        import torch.distributed as dist
        from train import train
        def main(args, model):
            dist.init_process_group("nccl")
            args.should_save = args.logs is not None and dist.get_rank() == 0
            train(args, model)
        """))
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        import torch.distributed as dist
        def train(args, model):
            model.train()
            for step in range(10):
                if args.should_save and step % 5 == 0:
                    torch.save(model.state_dict(), f"{args.out}/latest.pt")
        """))
    assert [(f.code, Path(f.path).name) for f in lint_paths([tmp_path])] == []
    # Linted alone, train.py cannot know the flag: the save looks like every rank's.
    assert [f.code for f in lint_paths([tmp_path / "train.py"])] == ["DDP007"]


GAN = "fp_gan_hook_reseed.py"


def test_gan_hooks_and_reseeded_loaders_are_quiet() -> None:
    assert found(GAN) == []


def test_a_step_after_every_backward_is_no_accumulation() -> None:
    # Take the discriminator's step out and its backward passes pile up before the
    # generator's step every n_critic iterations: accumulation without no_sync.
    step = line_of(GAN, "opt_g.step()")
    assert found(GAN, "            opt_d.step()\n", "") == [("DDP013", step - 1)]


def test_a_set_epoch_in_a_hook_called_from_elsewhere_counts() -> None:
    loop = line_of(GAN, "    def train(self, epochs):") + 1
    assert found(GAN, "        self.trainer.loader.sampler.set_epoch(epoch)\n",
                 "        pass\n") == [("DDP001", loop)]


def test_a_sampler_made_each_epoch_with_the_epoch_as_seed_shuffles_anew() -> None:
    loop = line_of(GAN, 'dist.init_process_group("nccl")') + 1
    # A fresh sampler with a constant seed repeats the same order every epoch.
    assert found(GAN, "seed=epoch)", "seed=0)") == [("DDP001", loop)]
