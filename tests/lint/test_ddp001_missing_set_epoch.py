"""DDP001 set_epoch missing.

What the rule reports and what it leaves alone, and the analysis it reads, through it."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import (
    codes_after_head,
    ddp_source,
    finding_lines,
    fixture_line_of,
    fixture_lines_once,
    lint_paths_with_defaults,
    lint_source,
    snippet_codes,
)


def test_batch_sampler_and_class_attribute_aliases() -> None:
    src = """
    class T:
        def __init__(self):
            self.sampler = DistributedSampler(ds)
            bs = torch.utils.data.BatchSampler(self.sampler, 8, drop_last=True)
            self.loader = DataLoader(ds, batch_sampler=bs)
        def fit(self):
            for epoch in range(3):
                for b in self.loader:
                    pass
    """
    assert codes_after_head(src).count("DDP001") == 1
    fixed = src.replace(
        "for b in self.loader",
        "self.sampler.set_epoch(epoch)\n                for b in self.loader",
    )
    assert "DDP001" not in codes_after_head(fixed)


def test_wrong_sampler_set_epoch_does_not_count() -> None:
    src = """
    a = DistributedSampler(ds)
    b = DistributedSampler(ds2)
    la = DataLoader(ds, sampler=a, drop_last=True)
    for epoch in range(3):
        b.set_epoch(epoch)
        for x in la:
            pass
    """
    assert "DDP001" in codes_after_head(src)


def test_validation_sampler_needs_no_set_epoch() -> None:
    src = """
    val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set))
    for epoch in range(3):
        for b in val_loader:
            pass
    """
    assert snippet_codes(src) == []
    assert snippet_codes(src.replace("val_set", "train_set")) == ["DDP001"]


GAN = "DDP001_gan_hook_reseed.py"


def test_gan_hooks_and_reseeded_loaders_are_quiet() -> None:
    assert fixture_lines_once(GAN) == []


def test_a_step_after_every_backward_is_no_accumulation() -> None:
    # Take the discriminator's step out and its backward passes pile up before the
    # generator's step every n_critic iterations: accumulation without no_sync.
    step = fixture_line_of(GAN, "opt_g.step()")
    assert fixture_lines_once(GAN, "            opt_d.step()\n", "") == [("DDP013", step - 1)]


def test_a_set_epoch_in_a_hook_called_from_elsewhere_counts() -> None:
    loop = fixture_line_of(GAN, "    def train(self, epochs):") + 1
    assert fixture_lines_once(
        GAN, "        self.trainer.loader.sampler.set_epoch(epoch)\n", "        pass\n"
    ) == [("DDP001", loop)]


def test_a_sampler_made_each_epoch_with_the_epoch_as_seed_shuffles_anew() -> None:
    loop = fixture_line_of(GAN, 'dist.init_process_group("nccl")') + 1
    # A fresh sampler with a constant seed repeats the same order every epoch.
    assert fixture_lines_once(GAN, "seed=epoch)", "seed=0)") == [("DDP001", loop)]


def test_a_sampler_that_moves_its_own_epoch_needs_no_set_epoch() -> None:
    src = ddp_source("""
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


HF_STYLE = ddp_source("""
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
    fixed = HF_STYLE.replace(
        '        epoch_iterator = tqdm(train_dataloader, desc="Iteration")\n',
        "        train_sampler.set_epoch(epoch)\n"
        '        epoch_iterator = tqdm(train_dataloader, desc="Iteration")\n',
    )
    assert lint_source(fixed) == []


def test_names_resolve_in_the_loops_own_function_first() -> None:
    # evaluate() also names its iterator `epoch_iterator`: its own assignment is the one.
    got = [(f.code, f.line) for f in lint_source(HF_STYLE)]
    assert ("DDP001", 18) not in got
    scoped = ddp_source("""
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
    src = ddp_source("""
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
    src = ddp_source("""
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
    # a development set is a validation set (Diffusion-BERT's `dev_sampler`, its loop nested
    # in the batch loop); a name that merely holds the letters is not (`device_sampler`)
    for name in ("dev_sampler", "sampler_dev", "devset_sampler"):
        assert lint_source(src.replace("eval_sampler", name)) == [], name
    assert [f.code for f in lint_source(src.replace("eval_sampler", "device_sampler"))] \
        == ["DDP001"]


def test_a_script_without_functions_follows_the_same_values() -> None:
    # At module level the names resolve module-wide (no function to scope them): the
    # conditional sampler and the renamed progress bar are followed there too.
    src = ddp_source("""
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
    # over `trainer.dataloader`, and nobody calls set_epoch (a real miss).
    assert [(f.code, f.line) for f in lint_source(TRAINER_LOADER)] == [("DDP001", 14)]
    fixed = TRAINER_LOADER.replace(
        "        for x in trainer.dataloader:",
        "        trainer.dataloader.sampler.set_epoch(epoch)\n        for x in trainer.dataloader:",
    )
    assert lint_source(fixed) == []


# The dataset is rebuilt, shuffled, every epoch and a fresh DistributedSampler made over it
# (coconut: "the sampler is deterministic even if shuffle is set to True, so we have
# shuffled the dataset when it's constructed, at every epoch").
RESHUFFLED = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def main(base, configs, model, optimizer):
    dist.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(model)
    for epoch in range(configs.num_epochs):
        stage = epoch // configs.epochs_per_stage
        dataset_train = build_dataset(stage, base, shuffle=True)
        loader = DataLoader(dataset_train, batch_size=4,
                            sampler=DistributedSampler(dataset_train, shuffle=True))
        for batch in loader:
            model(batch).sum().backward()
            optimizer.step()
"""


def test_a_sampler_over_data_reshuffled_every_epoch_needs_no_set_epoch() -> None:
    assert finding_lines(RESHUFFLED) == []


def test_a_fresh_sampler_over_the_same_order_every_epoch_is_reported() -> None:
    same = RESHUFFLED.replace(
        "build_dataset(stage, base, shuffle=True)", "build_dataset(stage, base, shuffle=False)"
    )
    assert finding_lines(same) == [("DDP001", 9)]


# A script whose distributed arm never forms a process group (CodeBERT's UniXcoder code
# completion: apex's DDP, no init_process_group): its DistributedSampler raises before the
# first epoch, so the set_epoch it lacks never matters.
NO_GROUP = """\
import argparse

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local-rank", "--local_rank", type=int, default=-1)
    args = parser.parse_args()
    model = build_model()
    if args.local_rank != -1:
        from apex.parallel import DistributedDataParallel as DDP
        model = DDP(model)
    data = load_examples()
    sampler = RandomSampler(data) if args.local_rank == -1 else DistributedSampler(data)
    loader = DataLoader(data, sampler=sampler, batch_size=8)
    for epoch in range(3):
        for batch in loader:
            model(batch).sum().backward()


if __name__ == "__main__":
    main()
"""


def test_a_script_that_never_forms_a_group_has_no_epoch_order_to_fix() -> None:
    assert finding_lines(NO_GROUP) == []


def test_a_script_that_forms_its_group_gets_the_missing_set_epoch() -> None:
    formed = NO_GROUP.replace(
        "        model = DDP(model)\n",
        "        model = DDP(model)\n        torch.distributed.init_process_group('nccl')\n",
    )
    assert finding_lines(formed) == [("DDP001", 19)]
    # through a set-up helper of another module, whose body is not visible
    helper = NO_GROUP.replace(
        "    model = build_model()\n",
        "    init_distributed_mode(args)\n    model = build_model()\n",
    )
    assert finding_lines(helper) == [("DDP001", 19)]
    # a module without a __main__ block: its caller may have formed the group
    module = NO_GROUP.replace('\n\nif __name__ == "__main__":\n    main()\n', "\n")
    assert finding_lines(module) == [("DDP001", 18)]


# Validation on each dataset of a collection, with a fresh sampler over each (the files of
# multiple_physics_pretraining's validation set): the loop walks datasets, not epochs.
PER_DATASET = """\
import torch
from torch.utils.data import DataLoader, DistributedSampler


def validate(model, dsets):
    model.eval()
    for subset in dsets:
        loader = DataLoader(subset, batch_size=8, sampler=DistributedSampler(subset))
        for batch in loader:
            model(batch)
"""


def test_a_fresh_sampler_per_dataset_is_no_epoch_loop() -> None:
    assert finding_lines(PER_DATASET) == []


def test_a_fresh_sampler_per_epoch_over_the_same_data_is_reported() -> None:
    epochs = PER_DATASET.replace(
        "    for subset in dsets:\n", "    subset = dsets[0]\n    for epoch in range(3):\n"
    )
    assert finding_lines(epochs) == [("DDP001", 8)]


# Features for a linear probe, extracted under no_grad with a shuffling sampler and no
# set_epoch (Siamese-Image-Modeling's make_embeddings): the order changes nothing.
EMBEDDINGS = """\
import torch
from torch.utils.data import DataLoader, DistributedSampler


def make_embeddings(dataset, encoder, epochs=1):
    loader = DataLoader(dataset, batch_size=64, sampler=DistributedSampler(dataset))
    feats = []
    for _ in range(epochs):
        for imgs, labels in loader:
            with torch.no_grad():
                feats.append(encoder(imgs))
    return feats
"""


def test_an_epoch_loop_that_only_extracts_features_needs_no_set_epoch() -> None:
    assert finding_lines(EMBEDDINGS) == []


def test_an_epoch_loop_that_trains_is_reported() -> None:
    trains = EMBEDDINGS.replace(
        "            with torch.no_grad():\n                feats.append(encoder(imgs))\n",
        "            encoder(imgs).sum().backward()\n",
    )
    assert finding_lines(trains) == [("DDP001", 8)]
    # a teacher's targets under no_grad, then the student's backward (distillation)
    distils = EMBEDDINGS.replace(
        "                feats.append(encoder(imgs))\n",
        "                target = teacher(imgs)\n"
        "            (encoder(imgs) - target).sum().backward()\n",
    )
    assert finding_lines(distils) == [("DDP001", 8)]


def test_a_sampler_in_the_distributed_arm_and_a_progress_bar_are_followed() -> None:
    # English_Hindi_Translation's `sampler=DistributedSampler(ds) if ddp else None` in the
    # loader, and RoderickGu's `pbar = progress_bar(train_dataloader)` around it
    text = """
        from torch.utils.data import DataLoader, DistributedSampler

        def train(model, loader):
            for x in loader:
                model(x).sum().backward()

        def main(model, ds, config):
            loader = DataLoader(ds, sampler=DistributedSampler(ds) if config.ddp else None,
                                shuffle=not config.ddp)
            for epoch in range(10):
                train(model, loader)

        def other(model, ds):
            batches = DataLoader(ds, sampler=DistributedSampler(ds))
            for epoch in range(10):
                pbar = progress_bar(batches)
                for x in pbar:
                    model(x).sum().backward()
        """
    got = [(f.code, f.line) for f in lint_source(ddp_source(text))]
    assert got == [("DDP001", 14), ("DDP001", 19)]
    set_first = "    loader.sampler.set_epoch(epoch)\n                train(model, loader)"
    fixed = text.replace("    train(model, loader)", set_first)
    assert [(f.code, f.line) for f in lint_source(ddp_source(fixed))] == [("DDP001", 20)]


def test_an_endless_reiteration_of_the_loader_without_set_epoch_repeats_each_pass() -> None:
    # lerobot_isl's and flowprogen's shape: `dl_iter = cycle(dataloader)`, `next(dl_iter)` per
    # step, a shuffling DistributedSampler and no set_epoch anywhere
    text = """
        from torch.utils.data import DataLoader, DistributedSampler

        def cycle(dl):
            while True:
                for batch in dl:
                    yield batch

        def main(model, ds, steps):
            sampler = DistributedSampler(ds)
            it = cycle(DataLoader(ds, sampler=sampler))
            for step in range(steps):
                model(next(it)).sum().backward()
        """
    [f] = lint_source(ddp_source(text))
    assert (f.code, f.line) == ("DDP001", 14) and "re-iterated endlessly by `cycle`" in f.message
    # set_epoch somewhere (the project's cycle advancing it), or a sampler that never shuffles
    advances = text.replace("            for batch in dl:",
                            "            dl.sampler.set_epoch(0)\n            for batch in dl:")
    assert lint_source(ddp_source(advances)) == []
    fixed = text.replace("DistributedSampler(ds)", "DistributedSampler(ds, shuffle=False)")
    assert lint_source(ddp_source(fixed)) == []


HANDED_LOOP = """\
import torch


def train(model, optimizer, epochs, train_loader=None):
    for epoch in range(epochs):
        for batch in train_loader:
            model(batch).sum().backward()
            optimizer.step()
"""

HANDED_ENTRY = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from models.loop import train


def main(dataset, model, optimizer):
    dist.init_process_group("nccl")
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    train(model, optimizer, 10, train_loader=loader)
"""


def test_a_loader_handed_in_from_another_file(tmp_path: Path) -> None:
    """corpus36b's pangu (found after first contact): finetune/finetune_fully.py builds the
    loader on a shuffling DistributedSampler and passes it to models/pangu_sample.py's
    train(), whose epoch loop iterates it; nothing in the program calls set_epoch. The twins:
    a set_epoch anywhere in the files linted (it may be the one that reseeds it), and a
    sampler that does not shuffle."""
    (tmp_path / "models").mkdir()
    (tmp_path / "finetune").mkdir()
    (tmp_path / "models" / "loop.py").write_text(HANDED_LOOP)
    (tmp_path / "finetune" / "main.py").write_text(HANDED_ENTRY)
    [f] = [f for f in lint_paths_with_defaults([tmp_path]) if f.code == "DDP001"]
    assert f.path.endswith("loop.py") and f.line == 5, f
    assert "main.py:10" in f.message and "`train_loader`" in f.message, f.message
    (tmp_path / "finetune" / "main.py").write_text(
        HANDED_ENTRY.replace("sampler = DistributedSampler(dataset)",
                             "sampler = DistributedSampler(dataset, shuffle=False)"))
    assert [f for f in lint_paths_with_defaults([tmp_path]) if f.code == "DDP001"] == []
    (tmp_path / "finetune" / "main.py").write_text(
        HANDED_ENTRY + "\n\ndef resume(loader, epoch):\n    loader.sampler.set_epoch(epoch)\n")
    assert [f for f in lint_paths_with_defaults([tmp_path]) if f.code == "DDP001"] == []


def test_an_epoch_loop_that_hands_the_loader_to_another_file_s_helper(tmp_path: Path) -> None:
    # corpus38b's EEGMAE: `from engine import train_one_epoch`, which iterates the loader it
    # is given. The twin (TNN-MO's shape): the loader of that name with a DistributedSampler
    # is made further down, in the other arm, so the loop's own loader is not it.
    (tmp_path / "engine.py").write_text(textwrap.dedent("""\
        def train_one_epoch(model, data_loader, optimizer, epoch):
            for x in data_loader:
                model(x).sum().backward()
                optimizer.step()
        """))
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler
        from engine import train_one_epoch


        def main(model, dataset, optimizer, epochs, distributed):
            if not distributed:
                loader = DataLoader(dataset, batch_size=4, shuffle=True)
                for epoch in range(epochs):
                    train_one_epoch(model, loader, optimizer, epoch)
            else:
                dist.init_process_group("nccl")
                loader = DataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset))
                for epoch in range(epochs):
                    train_one_epoch(model, loader, optimizer, epoch)
        """))
    found = [(Path(f.path).name, f.code, f.line)
             for f in lint_paths_with_defaults([tmp_path]) if f.code == "DDP001"]
    assert found == [("train.py", "DDP001", 15)]
