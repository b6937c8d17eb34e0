"""make_loader: a DataLoader with the defaults the field reports argue for.

- an EvenSampler (equal sample counts on every rank) when the process group is initialized
  and no sampler is given; `shuffle` together with a sampler is refused, not ignored;
- pin_memory only when CUDA is there; persistent workers and prefetch only with workers;
- worker seeds derived from (seed, epoch, rank, worker id), the same on every run, different
  across ranks and workers (torch's default derives them from the main process's RNG state);
- a collate that raises on a None sample instead of dropping it: a dropped sample makes one
  rank's batch (or batch count) differ from the others: the classic uneven-steps hang.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.collate import default_collate


class NoneSampleError(ValueError):
    """A dataset returned None for a sample; dropping it would desynchronize ranks."""


def strict_collate(batch: Sequence[Any]) -> Any:
    """default_collate, but a None sample is an error naming its position in the batch."""
    for pos, sample in enumerate(batch):
        if sample is None:
            raise NoneSampleError(
                f"sample at position {pos} of a batch of {len(batch)} is None. Dropping it "
                "would give this rank a different batch than the others; fix the dataset or "
                "use JsonlDataset(on_error='skip'), which replaces bad records identically "
                "on every rank.")
    return default_collate(batch)


def worker_seed(seed: int, epoch: int, rank: int, worker_id: int) -> int:
    """63-bit seed for one data worker. Pure, so it can be checked for any rank."""
    ss = np.random.SeedSequence([seed & (2**63 - 1), epoch, rank, worker_id, 0xDD9])
    lo, hi = (int(v) for v in ss.generate_state(2, dtype=np.uint32))
    return (lo | hi << 32) >> 1


class _WorkerInit:
    """Picklable worker_init_fn (spawned workers must be able to import it)."""

    def __init__(self, seed: int, rank: int, sampler: Any,
                 user_fn: Callable[[int], None] | None) -> None:
        self.seed, self.rank, self.user_fn = seed, rank, user_fn
        # The epoch is read when the worker starts: the sampler was copied into the worker
        # when iteration began, after set_epoch.
        self.sampler = sampler

    def __call__(self, worker_id: int) -> None:
        epoch = int(getattr(self.sampler, "epoch", 0) or 0)
        s = worker_seed(self.seed, epoch, self.rank, worker_id)
        random.seed(s)
        np.random.seed(s % 2**32)
        torch.manual_seed(s)
        if self.user_fn is not None:
            self.user_fn(worker_id)


def _dist_rank() -> int | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return None


def make_loader(dataset: Dataset[Any], *, batch_size: int | None = None,
                sampler: Any = None, batch_sampler: Any = None, shuffle: bool | None = None,
                num_workers: int = 2, collate_fn: Callable[[list[Any]], Any] | None = None,
                seed: int = 0, tail: str = "pad", drop_last: bool = False,
                pin_memory: bool | None = None, persistent_workers: bool | None = None,
                prefetch_factor: int | None = None,
                worker_init_fn: Callable[[int], None] | None = None,
                multiprocessing_context: Any = None, timeout: float = 0) -> DataLoader[Any]:
    """A DataLoader with safe defaults; see the module docstring. `shuffle` (default True)
    only applies to the sampler make_loader builds itself; `tail` ("pad" or "drop") is passed
    to the EvenSampler it builds under an initialized process group."""
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if batch_size is None and batch_sampler is None:
        raise ValueError("make_loader needs batch_size=N or a batch_sampler")
    if batch_sampler is not None and (sampler is not None or batch_size is not None
                                      or drop_last):
        raise ValueError("batch_sampler decides the batches: do not also pass sampler, "
                         "batch_size or drop_last")
    if shuffle and (sampler is not None or batch_sampler is not None):
        raise ValueError("shuffle=True with a sampler is ambiguous (the DataLoader would "
                         "ignore or refuse it): shuffle in the sampler instead, e.g. "
                         "EvenSampler(len(ds), shuffle=True, seed=...)")
    if num_workers == 0 and (persistent_workers or prefetch_factor is not None):
        raise ValueError("persistent_workers and prefetch_factor need num_workers > 0, got "
                         f"num_workers=0 (persistent_workers={persistent_workers}, "
                         f"prefetch_factor={prefetch_factor})")
    rank = _dist_rank()
    if sampler is None and batch_sampler is None:
        if rank is not None:
            from ..sampling import EvenSampler

            sampler = EvenSampler(len(dataset),  # type: ignore[arg-type]
                                  shuffle=True if shuffle is None else shuffle,
                                  seed=seed, tail=tail)
        elif shuffle is None or shuffle:
            gen = torch.Generator()
            gen.manual_seed(seed)
            sampler = torch.utils.data.RandomSampler(dataset, generator=gen)  # type: ignore
        else:
            sampler = torch.utils.data.SequentialSampler(dataset)  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    if num_workers > 0:
        kwargs["persistent_workers"] = True if persistent_workers is None else persistent_workers
        kwargs["prefetch_factor"] = 2 if prefetch_factor is None else prefetch_factor
        kwargs["worker_init_fn"] = _WorkerInit(seed, rank or 0, batch_sampler or sampler,
                                               worker_init_fn)
        kwargs["multiprocessing_context"] = multiprocessing_context
        kwargs["timeout"] = timeout
    elif worker_init_fn is not None:
        raise ValueError("worker_init_fn needs num_workers > 0")
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    if pin and not torch.cuda.is_available():
        raise ValueError("pin_memory=True needs CUDA, which is not available here")
    if batch_sampler is not None:
        return DataLoader(dataset, batch_sampler=batch_sampler, num_workers=num_workers,
                          collate_fn=collate_fn or strict_collate, pin_memory=pin, **kwargs)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      collate_fn=collate_fn or strict_collate, pin_memory=pin,
                      drop_last=drop_last, **kwargs)
