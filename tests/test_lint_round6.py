"""Issue 20, sixth round: the false-positive classes of the lint9 tuning corpora (trainers
with leader-only decorators and per-rank paths chosen by the caller, invariant asserts,
tools that refuse DDP, stubs, dead branches, memoised helpers, no_sync bound to a name, flags
set in another file, a CPU arm beside a GPU arm), each pinned by code of our own that expects
nothing, and by the one-line change that makes the same code wrong again (the inference must
still see real bugs)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import lint_paths, lint_source

from ddpguard.lint import RULES, Selection

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
    # A raise is a failure too: torchrun ends the job when one rank fails (issue 20, round
    # 11), so it is DDP022 with the assert, off by default; a rank that returns in good
    # order leaves the others waiting: DDP019, on by default.
    raise_ = ("assert len(gathered) == world",
              "if len(gathered) != world:\n                raise ValueError(world)")
    assert found(TRAINER, *raise_) == []
    assert found(TRAINER, *raise_, selection=ALL) == [("DDP022", line + 1)]
    returned = found(TRAINER, "assert len(gathered) == world",
                     "if len(gathered) != world:\n                return None")
    assert returned == [("DDP019", line + 1)]


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
    assert found(TOOL, "raise NotImplementedError(", "raise RuntimeError(",
                 selection=ALL) == [("DDP022", line)]


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
    # A bare .cuda() in that arm is the pytorch/examples fallback for a launch that names no
    # device; not reported since issue 20's eighth round (0 true in 4 independent reviews).
    bare = CPU_ARM.replace("            model = DDP(model)\n",
                           "            model = model.cuda()\n            model = DDP(model)\n")
    assert [f.code for f in lint_source(bare)] == []
    # With no arm that passes device_ids, the bare .cuda() is every process's placement.
    alone = bare.replace(", device_ids=[", ", output_device=[")
    assert [f.code for f in lint_source(alone)] == ["DDP015"]


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
            dist.barrier()


        if __name__ == "__main__":
            train(None, None)
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


EVAL_IN_LOOP = _src("""
    def train(model, loader, val, rank):
        model = DDP(model, device_ids=[rank])
        for step, x in enumerate(loader):
            model(x).sum().backward()
            if rank == 0 and step % 100 == 0:
                with torch.no_grad():
                    model(val)
    """)


def test_a_no_grad_forward_on_rank_0_pairs_with_the_next_training_forward() -> None:
    # Its one buffer broadcast meets the others' broadcast at the next iteration's forward
    # (and it clears the flag that would make rank 0's own next forward sync again).
    assert [f.code for f in lint_source(EVAL_IN_LOOP)] == []
    # With gradients on, rank 0 syncs once more than the others: a hang.
    grad_on = EVAL_IN_LOOP.replace("with torch.no_grad():", "if True:")
    assert [f.code for f in lint_source(grad_on)] == ["DDP006"]
    # Under no_grad too, when the others go on to another collective first.
    barrier = EVAL_IN_LOOP.replace("                model(val)\n",
                                   "                model(val)\n        dist.barrier()\n")
    assert [f.code for f in lint_source(barrier)] == ["DDP006"]


def test_a_helper_called_in_both_arms_is_compared_once_in_the_helper() -> None:
    src = _src("""
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
    lit = _src("""
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
    src = _src("""
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
    src = _src("""
        def gather_stats(t, sync=False):
            if sync:
                dist.all_reduce(t)
            return t

        def log(t, rank):
            if rank == 0:
                print(gather_stats(t))
        """)
    assert [f.code for f in lint_source(src)] == []
    assert [f.code for f in lint_source(src.replace("gather_stats(t))",
                                                    "gather_stats(t, sync=True))"))] == ["DDP005"]


def test_no_grad_around_the_call_covers_the_helpers_forward() -> None:
    src = _src("""
        def evaluate(model, val):
            return model(val).mean()

        def train(model, loader, val, rank):
            model = DDP(model, device_ids=[rank])
            for step, x in enumerate(loader):
                model(x).sum().backward()
                if rank == 0 and step % 100 == 0:
                    with torch.no_grad():
                        evaluate(model, val)
        """)
    assert [f.code for f in lint_source(src)] == []
    assert [f.code for f in lint_source(src.replace("with torch.no_grad():", "if True:"))] == [
        "DDP006"]


RESUME = _src("""
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
    assert [f.code for f in lint_source(RESUME)] == []
    for strip in ('{k[7:]: v for k, v in sd.items()}',
                  '{k.removeprefix("module."): v for k, v in sd.items()}'):
        src = RESUME.replace('{k.replace("module.", ""): v for k, v in sd.items()}', strip)
        assert [f.code for f in lint_source(src)] == [], strip
    plain = RESUME.replace('        sd = {k.replace("module.", ""): v for k, v in sd.items()}\n',
                           "")
    assert [f.code for f in lint_source(plain)] == ["DDP008"]


def test_the_bare_arm_of_a_wrap_test_saves_the_bare_model() -> None:
    src = RESUME.replace('        sd = {k.replace("module.", ""): v for k, v in sd.items()}\n',
                         "").replace(
        'torch.save(model.state_dict(), "final.pth")',
        'torch.save(model.module.state_dict() if hasattr(model, "module") '
        'else model.state_dict(), "final.pth")')
    assert [f.code for f in lint_source(src)] == []
    flipped = src.replace('if hasattr(model, "module")', "if rank > 1")
    assert [f.code for f in lint_source(flipped)] == ["DDP008"]


GATHER = _src("""
    from torch.utils.data import DataLoader, DistributedSampler
    def evaluate(model, val_set):
        loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set))
        preds = torch.cat([model(x) for x in loader])
        out = [torch.zeros_like(preds) for _ in range(dist.get_world_size())]
        dist.all_gather(out, preds)
        return torch.stack(out, 1).flatten(0, 1)[:len(val_set)].mean()
    """)


def test_gathered_results_cut_back_to_the_dataset_length_drop_the_padding() -> None:
    sel = Selection(extend_select=("DDP020",))  # off by default since the seventh round
    assert [f.code for f in lint_source(GATHER, selection=sel)] == []
    assert [f.code for f in lint_source(GATHER.replace("[:len(val_set)]", ""),
                                        selection=sel)] == ["DDP020"]


def test_no_grad_around_a_method_call_covers_its_forward_of_self_model() -> None:
    src = _src("""
        class Trainer:
            def __init__(self, model, rank):
                self.model = DDP(model, device_ids=[rank])
                self.rank = rank

            def evaluate(self, val):
                return self.model(val).mean()

            def fit(self, loader, val):
                for step, x in enumerate(loader):
                    self.model(x).sum().backward()
                    if self.rank == 0 and step % 100 == 0:
                        with torch.no_grad():
                            self.evaluate(val)
        """)
    assert [f.code for f in lint_source(src)] == []
    assert [f.code for f in lint_source(src.replace("with torch.no_grad():", "if True:"))] == [
        "DDP006"]


FLAG = _src("""
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
    other = FLAG.replace("        if self.cfg.pipelined:\n            dist.all_reduce(x)",
                         "        if self.cfg.summed:\n            dist.all_reduce(x)")
    assert [f.code for f in lint_source(other)] == ["DDP005"]


ENGINE = _src("""
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
    assert [f.code for f in lint_source(ENGINE)] == []
    every = ENGINE.replace("        if rank == 0:\n            trainer.save()",
                           "        trainer.save()")
    assert [f.code for f in lint_source(every)] == ["DDP007"]


CONFIG = _src("""
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
    assert [f.code for f in lint_source(CONFIG.replace(
        '        if not self.config["single_spec"] and self.config["local_rank"] != 0:\n'
        "            return\n", ""))] == ["DDP007"]


def test_an_is_root_predicate_tests_the_rank() -> None:
    src = _src("""
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
    assert [f.code for f in lint_source(src.replace("is_root_worker", "is_ready"))] == [
        "DDP007"]


def test_apex_ddp_forwards_make_no_collective() -> None:
    src = """import torch
import torch.distributed as dist
from apex.parallel import DistributedDataParallel as DDP


def train(g, loader, val, rank):
    g = DDP(g)
    for x in loader:
        g(x).sum().backward()
    if rank == 0:
        g(val)
    dist.barrier()
"""
    assert [f.code for f in lint_source(src)] == []
    torch_ddp = src.replace("from apex.parallel import", "from torch.nn.parallel import")
    assert [f.code for f in lint_source(torch_ddp)] == ["DDP006"]


def test_a_collective_in_a_method_of_an_instance_runs_where_the_call_does() -> None:
    src = _src("""
        class Syncer:
            def sync(self, t):
                dist.all_reduce(t)

        def step(t, rank):
            syncer = Syncer()
            if rank == 0:
                syncer.sync(t)
        """)
    assert [f.code for f in lint_source(src)] == ["DDP005"]


def test_an_instance_method_called_on_the_local_rank_0_writes_once_per_node() -> None:
    src = ENGINE.replace('rank = int(os.environ["RANK"])', 'rank = int(os.environ["LOCAL_RANK"])'
                         ).replace('dist.init_process_group("nccl")',
                                   'dist.init_process_group("nccl")\n'
                                   '    print(os.environ["NODE_RANK"])')
    assert [f.code for f in lint_source(src, selection=Selection(extend_select=("DDP017",)))
            ] == ["DDP017"]


def test_a_single_process_arm_is_never_taken_in_a_distributed_run() -> None:
    src = _src("""
        def log(config, t, rank):
            if rank == 0:
                if config["single_spec"]:
                    dist.barrier()
        """)
    assert [f.code for f in lint_source(src)] == []
    assert [f.code for f in lint_source(src.replace('config["single_spec"]',
                                                    'config["sync"]'))] == ["DDP005"]


def test_a_load_in_an_instance_method_called_on_rank_0_only_is_guarded() -> None:
    # DDP010 (off by default) skips loads that only rank 0 makes: the guard of the call
    # site `if rank == 0: engine.restore()` reaches the method.
    src = _src("""
        class Engine:
            def restore(self, path):
                return torch.load(path, weights_only=True)

        def main(path, rank):
            dist.init_process_group("nccl")
            engine = Engine()
            if rank == 0:
                engine.restore(path)
        """)
    sel = Selection(extend_select=("DDP010",))
    assert [f.code for f in lint_source(src, selection=sel)] == []
    every = src.replace("    if rank == 0:\n        engine.restore(path)",
                        "    engine.restore(path)")
    assert [f.code for f in lint_source(every, selection=sel)] == ["DDP010"]


def test_a_parallel_flag_compared_with_true_is_the_launch_mode() -> None:
    # `if (parallel == True): if rank == 0: save()  else: save()`: the else arm is the
    # single-process run, which a distributed run never takes.
    src = ENGINE.replace("        if rank == 0:\n            trainer.save()\n",
                         "        if parallel == True:\n"
                         "            if rank == 0:\n                trainer.save()\n"
                         "        else:\n            trainer.save()\n"
                         ).replace("def main(model):", "def main(model, parallel):")
    assert "parallel == True" in src
    assert [f.code for f in lint_source(src)] == []
    assert [f.code for f in lint_source(src.replace("parallel == True", "parallel == False"))
            ] == ["DDP007"]


def test_an_nccl_variable_named_in_prose_is_no_setting() -> None:
    src = _src("""
        import argparse, os
        parser = argparse.ArgumentParser()
        parser.add_argument("--debug", help="sets NCCL_BLOCKING_WAIT while debugging")
        """)
    sel = Selection(extend_select=("DDP023",))
    assert [f.code for f in lint_source(src, selection=sel)] == []
    assert [f.code for f in lint_source(src + 'os.environ["NCCL_BLOCKING_WAIT"] = "1"\n',
                                        selection=sel)] == ["DDP023"]
    assert [f.code for f in lint_source(
        src + 'os.system("NCCL_BLOCKING_WAIT=1 python train.py")\n', selection=sel)] == [
        "DDP023"]
    # NCCL_TIMEOUT does not exist at all: on by default.
    assert [f.code for f in lint_source(src + 'os.environ["NCCL_TIMEOUT"] = "60"\n')] == [
        "DDP011"]


def test_a_sampler_that_moves_its_own_epoch_needs_no_set_epoch() -> None:
    src = _src("""
        from torch.utils.data import DataLoader, DistributedSampler

        class EpochSampler(DistributedSampler):
            def __iter__(self):
                self.epoch += 1
                return super().__iter__()

        def train(ds, model, epochs):
            loader = DataLoader(ds, sampler=EpochSampler(ds))
            for epoch in range(epochs):
                for b in loader:
                    model(b)
        """)
    assert [f.code for f in lint_source(src)] == []
    assert [f.code for f in lint_source(src.replace("self.epoch += 1", "pass"))] == ["DDP001"]


def test_other_launchers_spell_the_rank_as_a_call() -> None:
    src = _src("""
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
        "DDP007"]


EARLY_STOP = _src("""
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
    assert lint_source(EARLY_STOP.replace("        if rank == 0:\n            if stopper(loss):\n"
                                          "                break",
                                          "        if stopper(loss):\n            break")) == []


def test_a_write_in_another_file_is_reported_at_this_files_call(tmp_path: Path) -> None:
    (tmp_path / "lib.py").write_text(
        "import torch\n\n\ndef dump(obj, path):\n    torch.save(obj, path + '/seeds.pth')\n")
    (tmp_path / "main.py").write_text(textwrap.dedent("""
        import torch.distributed as dist
        from lib import dump


        def main(obj, path):
            dist.init_process_group("nccl")
            dump(obj, path)


        if __name__ == "__main__":
            main(None, "/tmp/out")
        """))
    [f] = lint_paths([tmp_path])
    assert (Path(f.path).name, f.line, f.code) == ("main.py", 8, "DDP007")
    assert "lib.py:5" in f.message


def test_a_master_field_is_the_leader_flag() -> None:
    src = ENGINE.replace('rank = int(os.environ["RANK"])',
                         'env = DistEnv(master=dist.get_rank() == 0)').replace(
        "        if rank == 0:\n", "        if env.master:\n")
    assert "env.master" in src
    assert [f.code for f in lint_source(src)] == []


HF_STYLE = _src("""
    from torch.utils.data import DataLoader, RandomSampler
    from torch.utils.data.distributed import DistributedSampler
    from tqdm import tqdm

    def train(args, train_dataset, model, optimizer):
        train_sampler = RandomSampler(train_dataset) if args.local_rank == -1 \\
            else DistributedSampler(train_dataset)
        train_dataloader = DataLoader(train_dataset, sampler=train_sampler, batch_size=8)
        for epoch in range(int(args.num_train_epochs)):
            epoch_iterator = tqdm(train_dataloader, desc="Iteration")
            for step, batch in enumerate(epoch_iterator):
                model(batch).sum().backward()
                optimizer.step()

    def evaluate(args, eval_dataset, model):
        for task in args.tasks:
            epoch_iterator = tqdm(DataLoader(eval_dataset, batch_size=8))
            for batch in epoch_iterator:
                model(batch)
    """)


def test_a_sampler_chosen_by_a_conditional_behind_a_progress_bar() -> None:
    # The old example trainers: RandomSampler or DistributedSampler, the loader wrapped in
    # tqdm under another name, and no set_epoch: every epoch repeats the same order.
    loop = HF_STYLE.splitlines().index("    for epoch in range(int(args.num_train_epochs)):") + 1
    got = [(f.code, f.line) for f in lint_source(HF_STYLE)]
    assert got == [("DDP001", loop)]
    fixed = HF_STYLE.replace('        epoch_iterator = tqdm(train_dataloader, desc="Iteration")\n',
                             '        train_sampler.set_epoch(epoch)\n'
                             '        epoch_iterator = tqdm(train_dataloader, desc="Iteration")\n')
    assert lint_source(fixed) == []


def test_names_resolve_in_the_loops_own_function_first() -> None:
    # evaluate() also names its iterator `epoch_iterator`: its own assignment is the one.
    got = [(f.code, f.line) for f in lint_source(HF_STYLE)]
    assert ("DDP001", 18) not in got
    scoped = _src("""
        from torch.utils.data import DataLoader, DistributedSampler

        def train(model, train_set, epochs):
            sampler = DistributedSampler(train_set)
            loader = DataLoader(train_set, sampler=sampler)
            for epoch in range(epochs):
                sampler.set_epoch(epoch)
                for b in loader:
                    model(b)

        def test(model, sets):
            for ds in sets:
                sampler = DistributedSampler(ds, shuffle=False)
                loader = DataLoader(ds, sampler=sampler)
                for b in loader:
                    model(b)
        """)
    assert lint_source(scoped) == []


def test_loaders_assigned_as_a_tuple() -> None:
    src = _src("""
        from torch.utils.data import DataLoader, DistributedSampler

        def train(model, train_set, val_set, epochs):
            s = DistributedSampler(train_set)
            train_loader, val_loader = DataLoader(train_set, sampler=s), DataLoader(val_set)
            for epoch in range(epochs):
                for b in train_loader:
                    model(b)
        """)
    assert [f.code for f in lint_source(src)] == ["DDP001"]


def test_an_evaluation_sampler_by_its_name_needs_no_set_epoch() -> None:
    src = _src("""
        from torch.utils.data import DataLoader, DistributedSampler

        def run(model, dataset, rounds):
            eval_sampler = DistributedSampler(dataset)
            loader = DataLoader(dataset, sampler=eval_sampler)
            for r in range(rounds):
                for b in loader:
                    model(b)
        """)
    assert lint_source(src) == []
    assert [f.code for f in lint_source(src.replace("eval_sampler", "sampler"))] == ["DDP001"]


def test_a_function_of_this_file_used_as_a_truth_value() -> None:
    # `not evaluate` names the module's evaluate(): always false, the barrier never runs.
    src = _src("""
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
    param = src.replace('def load(args, split="train"):', 'def load(args, evaluate=False):'
                        ).replace('load(args, split="dev")', 'load(args)').replace(
        "    return split", "    return evaluate")
    assert {f.code for f in lint_source(param)} == {"DDP005"}


def test_a_gpu_switch_and_a_mesh_coordinate_are_no_rank() -> None:
    src = _src("""
        def run(cfg, loss):
            if cfg.mode.gpu:
                dist.all_reduce(loss)

        def serve(mesh, obj):
            if mesh["tp"].get_local_rank() == 0:
                dist.broadcast_object_list(obj, group=mesh["dp"].get_group(), group_src=0)
        """)
    assert lint_source(src) == []
    ranked = src.replace("if cfg.mode.gpu:", "if cfg.mode.rank:").replace(
        'mesh["tp"].get_local_rank()', "dist.get_rank()")
    assert [f.code for f in lint_source(ranked)] == ["DDP005", "DDP005"]


def test_template_folders_are_not_linted(tmp_path: Path) -> None:
    t = tmp_path / "{{cookiecutter.name}}"
    t.mkdir()
    (t / "train.py").write_text("def f({{cookiecutter.arg}}):\n    pass\n")
    (tmp_path / "ok.py").write_text("x = 1\n")
    assert lint_paths([tmp_path]) == []


def test_a_script_without_functions_follows_the_same_values() -> None:
    # At module level the names resolve module-wide (no function to scope them): the
    # conditional sampler and the renamed progress bar are followed there too.
    src = _src("""
        from torch.utils.data import DataLoader, RandomSampler, DistributedSampler
        from tqdm import tqdm
        import sys

        local_rank = int(sys.argv[1])
        sampler = RandomSampler(ds) if local_rank == -1 else DistributedSampler(ds)
        loader = DataLoader(ds, sampler=sampler, batch_size=8)
        for epoch in range(10):
            bar = tqdm(loader)
            for batch in bar:
                model(batch).sum().backward()
        """)
    assert [f.code for f in lint_source(src)] == ["DDP001"]
