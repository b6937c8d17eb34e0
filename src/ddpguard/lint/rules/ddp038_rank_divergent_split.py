"""DDP038 each rank draws its own random train/validation split.

```python
train_ds, val_ds = random_split(dataset, [0.9, 0.1])    # no generator, torch never seeded
loader = DataLoader(train_ds, sampler=DistributedSampler(train_ds), batch_size=32)
```

A fresh process seeds torch's global generator (and NumPy's) from the operating system, so a
`random_split` without `generator=` gives each rank its own permutation, and so its own train
and validation sets. The DistributedSampler then hands each rank its share of a different
dataset: some samples are trained on by several ranks and others by none, and one rank's
validation samples are another rank's training samples, so the validation figures are
optimistic. Nothing fails: the run trains and reports, on data nobody chose. Seeding with the
rank (`torch.manual_seed(seed + rank)`, common to vary augmentation per rank) makes the
split differ on purpose. Reported at the split, for torch's `random_split` without a
generator, sklearn's `train_test_split` without `random_state` and a Hugging Face dataset's
`.train_test_split()` without `seed`, run on every rank, in a program (the files linted
together) that builds a DistributedSampler, where no call seeds that generator with one value
on every rank (`torch.manual_seed(args.seed)`, `np.random.seed(0)`, `seed_everything(42)`, or
a project helper calling one of them, anywhere: the rule does not follow where it runs).
Fix: `random_split(ds, lengths, generator=torch.Generator().manual_seed(seed))` with the same
seed on every rank (`random_state=seed` for sklearn, `seed=seed` for datasets), or split once
on disk.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..analysis.context import ModuleInfo
from ..analysis.splits import (
    NUMPY,
    PYTHON,
    TORCH,
    Seeding,
    seeding,
    shards_by_rank,
    shuffled_splits,
    unseeded_splits,
)
from ..registry import Hit, rule


@rule('DDP038', 'rank-divergent-split', 'warning',
      'a random train/validation split drawn on every rank from an unseeded (or rank-seeded) '
      'generator: each rank trains and validates on different sets',
      'draw the split from a generator seeded alike on every rank '
      '(generator=torch.Generator().manual_seed(seed), random_state=seed for sklearn)')
def ddp038(info: ModuleInfo) -> Iterator[Hit]:
    """Silently wrong data. The ranks must agree on a dataset before a DistributedSampler
    shards it; a split each draws from its own generator breaks that without an error."""
    if not info.distributed:
        return
    splits = unseeded_splits(info) + shuffled_splits(info)
    if not splits:
        return
    fs = info.file_set
    infos = fs.infos if fs is not None else [info]  # type: ignore[attr-defined]
    # facts of the program, asked once whichever of its files holds a split
    memo: dict[object, object] = fs.memo if fs is not None else {}  # type: ignore[attr-defined]
    sharded = memo.get("ddp038_shards")
    if sharded is None:
        sharded = memo["ddp038_shards"] = shards_by_rank(infos)
    if not sharded:
        return
    for split in splits:
        seeds = memo.get(("ddp038_seeding", split.kind))
        if seeds is None:
            seeds = memo[("ddp038_seeding", split.kind)] = seeding(infos, split.kind)
        assert isinstance(seeds, Seeding)
        if seeds.same_everywhere:
            continue
        gen = _GENERATOR[split.kind]
        how = (f"seeded from the rank ({seeds.per_rank[0]})" if seeds.per_rank
               else "never seeded with one value on every rank")
        fix = _FIX[split.kind] if split.rec.last in ("random_split", "train_test_split") \
            else _FIX_PERMUTATION[split.kind]
        yield split.rec.node, "DDP038", (
            f"`{split.spelled}` draws from {gen} global generator, which is {how}: each rank "
            "gets its own split, so the DistributedSampler shards a different dataset on "
            "each (samples trained on twice or never, one rank's validation "
            f"samples in another's training set). Pass {fix} with one seed on every rank")


_GENERATOR = {TORCH: "torch's", NUMPY: "NumPy's", PYTHON: "Python's"}
_FIX = {TORCH: "generator=torch.Generator().manual_seed(seed)",
        NUMPY: "random_state=seed (seed=seed for a datasets.Dataset)"}
_FIX_PERMUTATION = {TORCH: "generator=torch.Generator().manual_seed(seed)",
                    NUMPY: "a generator of its own (np.random.default_rng(seed))",
                    PYTHON: "a generator of its own (random.Random(seed))"}


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, random_split


def loaders(dataset):
    dist.init_process_group("nccl")
    train_ds, val_ds = random_split(dataset, [0.9, 0.1])
    train = DataLoader(train_ds, sampler=DistributedSampler(train_ds), batch_size=32)
    val = DataLoader(val_ds, sampler=DistributedSampler(val_ds), batch_size=32)
    return train, val
"""

RULE = ddp038
