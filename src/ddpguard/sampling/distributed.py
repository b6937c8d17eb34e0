"""ddpguard.DistributedSampler: torch's constructor and counts, EvenSampler's machinery.

Moving a script is one import line:

    from ddpguard import DistributedSampler   # was: from torch.utils.data import ...

Same as torch's `DistributedSampler`: the signature, `len()`, every rank's count, padding by
repeating the epoch's first indices when `drop_last=False` (positions n, n+1, ... of the epoch
hold the indices of positions 0, 1, ...), truncation to a multiple of the world size when
`drop_last=True`, rank r taking positions r, r+W, r+2W, ..., and with `shuffle=False` the very
same indices. Different on purpose:
- the shuffled order is a keyed Feistel permutation of (seed, epoch), not `torch.randperm`: O(1)
  memory and microseconds to the first index at any length (torch materializes n Python ints
  on every rank, every epoch);
- the epoch advances by itself on each new pass; an explicit `set_epoch` still wins;
- `state_dict()` / `load_state_dict()` resume mid-epoch, also on another world size;
- `evaluate` recognises its padding (and says loudly what `drop_last=True` leaves out);
- num_replicas / rank default to the process group, else to the launcher's variables
  (torchrun, SLURM) when the group is not initialized yet, else to a single process (1, 0);
  torch raises instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

from .even import EvenSampler
from .plan import check_int, per_rank_count

__all__ = ["DistributedSampler"]


def _length(dataset: Sized) -> int:
    try:
        n = len(dataset)
    except TypeError as exc:
        raise ValueError(
            f"DistributedSampler needs a dataset with a length; {type(dataset).__name__} has "
            "none (an IterableDataset shards itself: use torch.utils.data.get_worker_info and "
            "the rank instead of a sampler)"
        ) from exc
    return check_int("len(dataset)", n, 0)


class DistributedSampler(EvenSampler):
    """Drop-in for `torch.utils.data.DistributedSampler` (see the module docstring)."""

    _state_kind = "DistributedSampler"

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        n = _length(dataset)
        if num_replicas is not None:
            check_int("num_replicas", num_replicas, 1)
        if rank is not None and num_replicas is not None and not 0 <= rank < num_replicas:
            # torch's wording first, so code that matches it keeps working.
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]: "
                "pass this process's rank (0..num_replicas-1), or leave rank and num_replicas "
                "None to take them from the process group or the launcher"
            )
        # An empty dataset is legal in torch (len 0, nothing yielded); the position arithmetic
        # needs length >= 1, so it runs on 1 and `len()` / `__iter__` report the emptiness.
        super().__init__(max(n, 1), num_replicas, rank, shuffle=shuffle, seed=seed,
                         tail="drop" if drop_last else "pad")
        self.dataset = dataset
        self.drop_last = bool(drop_last)
        self._empty = n == 0

    # ---- torch's attributes -------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Indices per rank in a full epoch (torch's attribute; `len()` after a resume is the
        remainder of the resumed pass)."""
        if self._empty:
            return 0
        return per_rank_count(self.length, self.num_replicas, self.tail)

    @property
    def total_size(self) -> int:
        return self.num_samples * self.num_replicas

    @property
    def epoch(self) -> int:
        """The epoch of the pass running now, or of the next pass if none is running."""
        return self._clock.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:  # some scripts assign sampler.epoch directly
        self.set_epoch(value)

    # ---- iteration ----------------------------------------------------------------------
    def __len__(self) -> int:
        return 0 if self._empty else super().__len__()

    @property
    def num_real(self) -> int:
        return 0 if self._empty else super().num_real

    def next_pass(self) -> tuple[int, int]:
        return (0, 0) if self._empty else super().next_pass()

    def __iter__(self) -> Iterator[int]:
        it = super().__iter__()  # advances the epoch even when empty, like every other pass
        return iter(()) if self._empty else it

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        state = super().state_dict(consumed)
        state["drop_last"] = self.drop_last
        return state

    def __repr__(self) -> str:
        return (f"ddpguard.DistributedSampler(len(dataset)={0 if self._empty else self.length}, "
                f"num_replicas={self.num_replicas}, rank={self.rank}, shuffle={self.shuffle}, "
                f"seed={self.seed}, drop_last={self.drop_last}, epoch={self.epoch})")
