"""TokenBatchSampler: batches by token budget, the same batch count on every rank, no repeats.

Planning (pure, `plan_token_batches`): drop samples over `max_length` or over `max_tokens`
alone (identically on every rank, counted), shuffle by (seed, epoch), sort by length inside
windows of `window` samples, pack greedily so len(batch) * longest <= max_tokens, split the
largest batches until the batch count divides by the world size, shuffle the batch order.
Rank r takes batches r, r+W, r+2W, ... Only when there are too few samples to give every rank
its batches are padding batches (one repeated sample, marked) added.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Sampler

from ._common import STATE_VERSION, EpochClock, consumed_in_pass, resolve_world
from .plan import check_int

__all__ = ["TokenBatchSampler", "TokenPlan", "plan_token_batches", "check_lengths"]

DEFAULT_WINDOW = 65536


def check_lengths(lengths: Sequence[int] | npt.ArrayLike) -> npt.NDArray[np.int64]:
    """`lengths` as a 1-D int64 array, or ValueError naming the first bad value."""
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"lengths must be a non-empty 1-D sequence, got shape {arr.shape}")
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"lengths must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "f":
        bad = np.flatnonzero(arr != np.floor(arr))
        if bad.size:
            raise ValueError(f"lengths must be integers: lengths[{bad[0]}] = {arr[bad[0]]!r}")
    out = arr.astype(np.int64)
    neg = np.flatnonzero(out < 0)
    if neg.size:
        raise ValueError(f"lengths must be >= 0: lengths[{neg[0]}] = {out[neg[0]]}")
    return out


@dataclasses.dataclass(frozen=True)
class TokenPlan:
    """One epoch's batches in global order: batch b is order[starts[b]:starts[b + 1]]."""

    order: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    padding: npt.NDArray[np.bool_]  # per batch: a repeated sample only there to equalize ranks
    skipped: int
    padding_waste: float  # padded token slots / all token slots

    @property
    def num_batches(self) -> int:
        return int(self.starts.size - 1)

    def batch(self, b: int) -> list[int]:
        values: list[int] = self.order[self.starts[b] : self.starts[b + 1]].tolist()
        return values


def _pack(sorted_lens: npt.NDArray[np.int64], window_start: npt.NDArray[np.int64],
          max_tokens: int, max_samples: int) -> npt.NDArray[np.int64]:
    # Within a window lengths ascend, so a batch's longest sample is its last. Sample e may
    # close a batch that starts at s iff e - s + 1 <= cap(len[e]); first_start[e] (the earliest
    # such s, clamped to e's window) is nondecreasing, so each batch end is one searchsorted.
    cap = np.minimum(max_tokens // np.maximum(sorted_lens, 1), max_samples)
    idx = np.arange(sorted_lens.size, dtype=np.int64)
    first_start = np.maximum(idx - cap + 1, window_start)
    starts = [0]
    s, n = 0, sorted_lens.size
    while s < n:
        s = int(np.searchsorted(first_start, s, side="right"))
        starts.append(s)
    return np.asarray(starts, dtype=np.int64)


def _equalize(starts: npt.NDArray[np.int64], num_replicas: int) -> npt.NDArray[np.int64]:
    # Split the largest batch in two (halves of a batch that fit still fit) until the count
    # divides by the world size; fewer than num_replicas splits are ever needed.
    total = int(starts[-1])
    target = -(-(starts.size - 1) // num_replicas) * num_replicas
    target = min(target, total)
    while starts.size - 1 < target:
        sizes = np.diff(starts)
        b = int(np.argmax(sizes))
        starts = np.insert(starts, b + 1, starts[b] + sizes[b] // 2)
    return starts


def plan_token_batches(
    lengths: npt.NDArray[np.int64],
    max_tokens: int,
    num_replicas: int,
    epoch: int,
    seed: int = 0,
    *,
    max_samples: int | None = None,
    max_length: int | None = None,
    window: int = DEFAULT_WINDOW,
    shuffle: bool = True,
) -> TokenPlan:
    """The epoch's batches for all ranks (pure; identical on every rank)."""
    limit = max_tokens if max_length is None else min(max_tokens, max_length)
    keep = np.flatnonzero(lengths <= limit)
    skipped = int(lengths.size - keep.size)
    if keep.size == 0:
        raise ValueError(
            f"every one of the {lengths.size} samples is longer than max_tokens={max_tokens} "
            f"or max_length={max_length}: raise the limits"
        )
    rng = np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, epoch, 1])
    if shuffle:
        keep = keep[rng.permutation(keep.size)]
    window_id = np.arange(keep.size, dtype=np.int64) // window
    lens = lengths[keep]
    by_len = np.lexsort((lens, window_id))  # stable: ties keep the shuffled order
    order, lens = keep[by_len], lens[by_len]
    starts = _pack(lens, window_id * window, max_tokens, max_samples or keep.size)
    starts = _equalize(starts, num_replicas)
    nb = starts.size - 1
    sizes = np.diff(starts)
    longest = np.maximum.reduceat(lens, starts[:-1])
    slots = int(np.sum(sizes * longest))
    waste = 0.0 if slots == 0 else 1.0 - float(lens.sum()) / slots
    batch_order = rng.permutation(nb) if shuffle else np.arange(nb)
    order = np.concatenate([order[starts[b] : starts[b + 1]] for b in batch_order]) if shuffle \
        else order
    starts = np.concatenate([[0], np.cumsum(sizes[batch_order])]).astype(np.int64)
    padding = np.zeros(nb, dtype=bool)
    missing = -nb % num_replicas
    if missing:
        # Fewer samples than batches needed: repeat single samples, marked as padding.
        extra = order[np.arange(missing) % order.size]
        order = np.concatenate([order, extra])
        starts = np.concatenate([starts, starts[-1] + np.arange(1, missing + 1)])
        padding = np.concatenate([padding, np.ones(missing, dtype=bool)])
    return TokenPlan(order, starts, padding, skipped, waste)


class TokenBatchSampler(Sampler[list[int]]):
    """Batches of indices whose padded size len(batch) * longest stays within `max_tokens`.

    Every rank gets the same number of batches each epoch (`len(sampler)`), without repeating
    samples except, marked in `is_padding_batch`, when the dataset is too small to give every
    rank a batch. Samples over `max_length` (or over `max_tokens` alone) are skipped on every
    rank alike and counted in `skipped`. The epoch advances on each new iteration
    (`set_epoch` wins); `state_dict` / `load_state_dict` resume mid-epoch on the same world size.
    """

    def __init__(
        self,
        lengths: Sequence[int] | npt.ArrayLike,
        max_tokens: int,
        num_replicas: Any = None,
        rank: int | None = None,
        *,
        max_samples: int | None = None,
        max_length: int | None = None,
        window: int = DEFAULT_WINDOW,
        shuffle: bool = True,
        seed: int = 0,
        epoch: int = 0,
    ) -> None:
        self.lengths = check_lengths(lengths)
        self.max_tokens = check_int("max_tokens", max_tokens, 1)
        shortest = int(self.lengths.min())
        if self.max_tokens < shortest:
            raise ValueError(
                f"max_tokens={max_tokens} is smaller than the shortest sample ({shortest} "
                "tokens): no batch could hold anything; raise max_tokens"
            )
        self.num_replicas, self.rank = resolve_world(num_replicas, rank)
        self.max_samples = None if max_samples is None else check_int("max_samples", max_samples, 1)
        self.max_length = None if max_length is None else check_int("max_length", max_length, 1)
        self.window = check_int("window", window, 1)
        self.shuffle = bool(shuffle)
        self.seed = check_int("seed", seed)
        self._clock = EpochClock(epoch)
        self._cache: tuple[int, TokenPlan] | None = None
        self._yielded = 0
        # A cheap fingerprint so a state dict from other lengths is refused.
        self._crc = zlib.crc32(self.lengths.tobytes())

    def plan(self, epoch: int | None = None) -> TokenPlan:
        """The (cached) global plan of `epoch` (default: the current or next pass)."""
        e = self._clock.epoch if epoch is None else epoch
        if self._cache is None or self._cache[0] != e:
            plan = plan_token_batches(
                self.lengths, self.max_tokens, self.num_replicas, e, self.seed,
                max_samples=self.max_samples, max_length=self.max_length,
                window=self.window, shuffle=self.shuffle,
            )
            self._cache = (e, plan)
        return self._cache[1]

    @property
    def skipped(self) -> int:
        """Samples left out (too long) in every epoch, on every rank alike."""
        return self.plan().skipped

    @property
    def epoch(self) -> int:
        return self._clock.epoch

    def _rank_batches(self) -> int:
        return self.plan().num_batches // self.num_replicas

    def __len__(self) -> int:
        """Batches this rank gets in the current pass (the remainder, right after a resume)."""
        return self._rank_batches() - self._clock.start

    def is_padding_batch(self, k: int) -> bool:
        """Whether this rank's k-th batch of the current epoch is a repeat (padding)."""
        return bool(self.plan().padding[self.rank + k * self.num_replicas])

    def set_epoch(self, epoch: int) -> None:
        self._clock.set_epoch(epoch)
        self._yielded = 0

    def __iter__(self) -> Iterator[list[int]]:
        epoch, start = self._clock.begin_pass()
        self._yielded = 0
        return self._generate(self.plan(epoch), start)

    def _generate(self, plan: TokenPlan, start: int) -> Iterator[list[int]]:
        for k in range(start, plan.num_batches // self.num_replicas):
            batch = plan.batch(self.rank + k * self.num_replicas)
            self._yielded += 1
            yield batch

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """JSON-able state; `consumed` = batches THIS rank used in the current pass (None =
        yielded; a DataLoader prefetches, so pass the real count). The state holds the
        per-rank batch offset, valid for the same world size only."""
        clock = self._clock
        epoch, offset = clock.epoch, clock.start
        if clock.running:
            used = consumed_in_pass(consumed, self._yielded, len(self), self.rank, "batches")
            offset = clock.start + used
            if offset >= self._rank_batches():
                epoch, offset = epoch + 1, 0
        return {
            "version": STATE_VERSION,
            "kind": "TokenBatchSampler",
            "length": int(self.lengths.size),
            "lengths_crc32": self._crc,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "num_replicas": self.num_replicas,
            "epoch": epoch,
            "batch_offset": offset,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "TokenBatchSampler" or state.get("version") != STATE_VERSION:
            raise ValueError(
                f"not a TokenBatchSampler state (kind={state.get('kind')!r}, "
                f"version={state.get('version')!r})"
            )
        mine = {"length": int(self.lengths.size), "lengths_crc32": self._crc,
                "max_tokens": self.max_tokens, "seed": self.seed, "shuffle": self.shuffle,
                "num_replicas": self.num_replicas}
        for key, value in mine.items():
            if state.get(key) != value:
                hint = ("token batches cannot be re-split across a different world size; resume "
                        "with the same number of ranks") if key == "num_replicas" else \
                    "the checkpoint belongs to a different dataset or settings"
                raise ValueError(
                    f"sampler state has {key}={state.get(key)!r} but this sampler has "
                    f"{key}={value!r} (rank {self.rank}): {hint}"
                )
        epoch = check_int("epoch", state.get("epoch"), 0)
        offset = check_int("batch_offset", state.get("batch_offset"), 0)
        self._clock.resume(epoch, offset)
        if offset >= self._rank_batches():
            self._clock.resume(epoch + 1, 0)
        self._yielded = 0
