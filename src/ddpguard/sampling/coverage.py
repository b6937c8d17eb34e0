"""What a rank's loader covers, for exact evaluation: which yielded samples are padding, what no
rank gets, and when that cannot be known.

`describe_loader(loader)` reads a DataLoader's sampler / batch sampler without iterating it:
- ddpguard's EvenSampler and DistributedSampler: padding is a suffix of each rank's pass;
  tail="drop" / drop_last=True leaves samples out;
- torch's DistributedSampler: it pads by repeating the epoch's first indices, i.e. global
  positions >= len(dataset), so rank r's real count is ceil((n - r) / W) (capped at
  num_samples); drop_last=True leaves out n - total_size samples;
- TokenBatchSampler: its padding batches are marked; samples over max_length are skipped;
- a torch BatchSampler (what `batch_size=` builds) over any of these, whose drop_last drops
  each rank's last partial batch;
- SequentialSampler / RandomSampler (without replacement): the whole dataset on this rank;
- anything else (a custom sampler, an IterableDataset, a plain iterable): unknown.
Pure: nothing here talks to other ranks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch.utils.data import (
    BatchSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)
from torch.utils.data import DistributedSampler as TorchDistributedSampler

from .even import EvenSampler
from .tokens import TokenBatchSampler

__all__ = ["Coverage", "describe_loader", "torch_real_count"]


@dataclasses.dataclass(frozen=True)
class Coverage:
    """One rank's view of its evaluation loader (see the module docstring)."""

    kind: str  # what the loader samples with, for messages
    real: int | None = None  # this rank's leading real samples; None: no padding suffix known
    left_out: int = 0  # samples of the dataset no rank gets (the same number on every rank)
    left_out_local: int = 0  # samples this rank's batching drops (summed over ranks)
    why_left_out: str = ""  # the cause and the fix, when samples can be left out
    whole_dataset: int = -1  # len(dataset) when this rank walks all of it, else -1
    unknown: str = ""  # why padding / coverage cannot be known ("" when it can)
    padding_batch: Callable[[int], bool] | None = None
    place: tuple[int, int] | None = None  # (rank, num_replicas) the sampler was built for

    def mismatch(self, rank: int, world_size: int) -> str:
        """Why the sampler cannot be this rank's share of a `world_size`-rank job, or ''."""
        if self.place is None or self.place == (rank, world_size):
            return ""
        r, w = self.place
        return (f"the {self.kind} was built for rank {r} of num_replicas={w} but runs on rank "
                f"{rank} of {world_size}, so ranks evaluate overlapping or missing shares; "
                "build it after init_process_group, or pass num_replicas=world_size and "
                "rank=rank")


def torch_real_count(n: int, num_replicas: int, rank: int, num_samples: int) -> int:
    """Real (non-repeated) indices of rank `rank` under torch's DistributedSampler(drop_last=
    False): positions rank, rank+W, ... below n; the rest are the repeated head."""
    first_missing = max(0, -(-(n - rank) // num_replicas)) if rank < n else 0
    return min(num_samples, first_missing)


def _unmodified(obj: object, base: type) -> bool:
    # A subclass that overrides __iter__ or __len__ may pad differently: not trusted.
    cls = type(obj)
    return isinstance(obj, base) and all(
        getattr(cls, name) is getattr(base, name) for name in ("__iter__", "__len__"))


def _sampler(s: Any) -> Coverage:
    name = type(s).__name__
    if isinstance(s, EvenSampler):
        real, left = s.next_pass()
        flag = "drop_last=True" if hasattr(s, "drop_last") else 'tail="drop"'
        fix = "drop_last=False" if hasattr(s, "drop_last") else 'tail="pad"'
        why = (f"{name}({flag}) leaves out {left} of {s.length} samples of this pass; build "
               f"the evaluation sampler with {fix}: its padded duplicates are recognised and "
               "dropped") if left else ""
        return Coverage(f"ddpguard {name}", real=real, left_out=left, why_left_out=why,
                        place=(s.rank, s.num_replicas))
    if _unmodified(s, TorchDistributedSampler):
        n, w = len(s.dataset), s.num_replicas
        if s.drop_last:
            left = n - s.total_size
            why = ("torch DistributedSampler(drop_last=True) leaves out the last "
                   f"{left} of {n} samples of every epoch; build the evaluation sampler with "
                   "drop_last=False (its padded duplicates are recognised and dropped) or use "
                   "ddpguard.DistributedSampler") if left else ""
            return Coverage("torch DistributedSampler", real=s.num_samples, left_out=left,
                            why_left_out=why, place=(s.rank, w))
        return Coverage("torch DistributedSampler",
                        real=torch_real_count(n, w, s.rank, s.num_samples), place=(s.rank, w))
    if _unmodified(s, SequentialSampler) or (
            _unmodified(s, RandomSampler) and not s.replacement
            and s.num_samples == len(s.data_source)):
        n = len(s.data_source)
        return Coverage(name, real=n, whole_dataset=n)
    if isinstance(s, RandomSampler):
        return Coverage(name, unknown=f"RandomSampler(replacement={s.replacement}, "
                                      f"num_samples={s.num_samples}) repeats or skips samples")
    return Coverage(name, unknown=f"sampler {name} (its padding and coverage are unknown)")


def describe_loader(loader: Any) -> Coverage:
    """This rank's Coverage of `loader` (never raises: anything unreadable is 'unknown')."""
    try:
        return _describe(loader)
    except Exception as exc:  # a sampler with surprising attributes must not break evaluation
        return Coverage(type(loader).__name__,
                        unknown=f"{type(loader).__name__} could not be inspected ({exc!r})")


def _describe(loader: Any) -> Coverage:
    kind = type(loader).__name__
    if not hasattr(loader, "sampler") and not hasattr(loader, "batch_sampler"):
        return Coverage(kind, unknown=f"{kind} is not a DataLoader; what it repeats or leaves "
                                      "out cannot be inspected")
    dataset = getattr(loader, "dataset", None)
    if isinstance(dataset, IterableDataset):
        name = type(dataset).__name__
        return Coverage(name, unknown=f"IterableDataset {name} shards itself; its padding "
                                      "cannot be inspected")
    bs = getattr(loader, "batch_sampler", None)
    if isinstance(bs, TokenBatchSampler):
        skipped = bs.skipped
        why = (f"TokenBatchSampler skips {skipped} samples longer than max_length or "
               "max_tokens; raise max_length/max_tokens for the evaluation sampler") \
            if skipped else ""
        return Coverage("ddpguard TokenBatchSampler", left_out=skipped, why_left_out=why,
                        padding_batch=bs.is_padding_batch)
    if bs is None:  # batch_size=None: one sample per item
        return _sampler(loader.sampler)
    if not _unmodified(bs, BatchSampler):
        name = type(bs).__name__
        return Coverage(name, unknown=f"batch sampler {name} (its padding and coverage are "
                                      "unknown)")
    inner = _sampler(bs.sampler)
    if not bs.drop_last or inner.unknown:
        return inner
    # DataLoader(drop_last=True): this rank's last partial batch is never yielded.
    length = len(bs.sampler)
    kept = length // bs.batch_size * bs.batch_size
    real = length if inner.real is None else inner.real
    lost = real - min(real, kept)
    why = (f"the DataLoader's drop_last=True drops each rank's last partial batch of "
           f"{bs.batch_size}; pass drop_last=False to the evaluation DataLoader")
    if inner.why_left_out:
        why = f"{inner.why_left_out}; and {why}"
    return dataclasses.replace(inner, real=min(real, kept), left_out_local=lost,
                               why_left_out=why if (kept < length or inner.left_out) else "")
