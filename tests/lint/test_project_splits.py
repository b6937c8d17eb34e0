"""A random split each rank draws for itself, where the seeding, the split and the sampler
live in different files of the project (DDP038): the facts are the program's, not a file's."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers import lint_paths

MISC = """\
import numpy as np
import torch


def fix_random_seed(args, config):
    seed = config.SEED + args.local_rank
    torch.manual_seed(seed)
    np.random.seed(seed)


def set_seed(seed):
    torch.manual_seed(seed)


def seed_numpy(seed):
    np.random.seed(seed)
"""

DATA = """\
from torch.utils.data import DataLoader, DistributedSampler, random_split


def split_train_dataset(dataset, p):
    n = len(dataset)
    train_len = int(n * p)
    train_dataset, eval_dataset = random_split(dataset, [train_len, n - train_len])
    return train_dataset, eval_dataset


def to_loader(dataset, ddp):
    sampler = DistributedSampler(dataset) if ddp else None
    return DataLoader(dataset, batch_size=8, sampler=sampler)
"""

MAIN = """\
import torch.distributed as dist
from utils import misc
from utils.data import split_train_dataset, to_loader


def main(args, config, dataset):
    dist.init_process_group("nccl")
    misc.fix_random_seed(args, config)
    train, val = split_train_dataset(dataset, 0.6)
    return to_loader(train, True), to_loader(val, True)
"""


def _project(tmp_path: Path, main: str, data: str = DATA) -> list[tuple[str, str, int]]:
    files = {"utils/__init__.py": "", "utils/misc.py": MISC, "utils/data.py": data,
             "main.py": main}
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return [(Path(f.path).name, f.code, f.line) for f in lint_paths([tmp_path])
            if f.code == "DDP038"]


def test_a_seed_from_the_rank_in_a_helper_of_another_file_splits_per_rank(
        tmp_path: Path) -> None:
    assert _project(tmp_path, MAIN) == [("data.py", "DDP038", 7)]
    msg = [f.message for f in lint_paths([tmp_path]) if f.code == "DDP038"][0]
    assert "seeded from the rank" in msg and "misc.py:7" in msg


def test_no_seed_at_all_is_reported_and_a_seed_alike_everywhere_is_not(tmp_path: Path) -> None:
    unseeded = MAIN.replace("    misc.fix_random_seed(args, config)\n", "")
    assert _project(tmp_path, unseeded) == [("data.py", "DDP038", 7)]
    seeded = MAIN.replace("misc.fix_random_seed(args, config)", "misc.set_seed(config.SEED)")
    assert _project(tmp_path, seeded) == []
    # NumPy's seed does not seed torch's generator, which random_split draws from
    numpy_only = MAIN.replace("misc.fix_random_seed(args, config)",
                              "misc.seed_numpy(config.SEED)")
    assert _project(tmp_path, numpy_only) == [("data.py", "DDP038", 7)]


def test_a_program_without_a_distributed_sampler_is_silent(tmp_path: Path) -> None:
    no_sampler = DATA.replace("DistributedSampler(dataset) if ddp else None", "None")
    assert _project(tmp_path, MAIN, no_sampler) == []


def test_a_seed_passed_through_a_helper_not_named_for_it_is_judged_at_its_call(
        tmp_path: Path) -> None:
    # `prepare(seed)` seeds with its parameter: its call decides, once with the rank in it
    helper = MISC + "\n\ndef prepare(seed):\n    set_seed(seed)\n"
    (tmp_path / "utils").mkdir(parents=True, exist_ok=True)
    for call, want in (("misc.prepare(config.SEED)", []),
                       ("misc.prepare(config.SEED + dist.get_rank())",
                        [("data.py", "DDP038", 7)])):
        main = MAIN.replace("misc.fix_random_seed(args, config)", call)
        files = {"utils/__init__.py": "", "utils/misc.py": helper, "utils/data.py": DATA,
                 "main.py": main}
        for name, text in files.items():
            (tmp_path / name).write_text(textwrap.dedent(text))
        got = [(Path(f.path).name, f.code, f.line) for f in lint_paths([tmp_path])
               if f.code == "DDP038"]
        assert got == want, call


def test_a_seed_in_a_function_nothing_in_sight_calls_still_counts(tmp_path: Path) -> None:
    # `mp.spawn(worker, ...)` runs worker(rank, seed): no call of it in sight, so its own
    # `torch.manual_seed(seed)` (a parameter) is taken as it stands: seeded alike, silent
    spawned = MAIN.replace("def main(args, config, dataset):",
                           "def main(args, config, dataset, seed):")
    spawned = spawned.replace("misc.fix_random_seed(args, config)", "torch.manual_seed(seed)")
    spawned = spawned.replace("import torch.distributed as dist",
                              "import torch\nimport torch.distributed as dist")
    assert _project(tmp_path, spawned) == []

