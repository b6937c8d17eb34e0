"""EvenSampler: the same number of indices on every rank, O(1) memory, resumable by position."""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Sampler

from . import plan
from ._common import STATE_VERSION, EpochClock, consumed_in_pass, resolve_world
from .plan import check_int

__all__ = ["EvenSampler"]

_CHUNK = 1 << 16
# Both samplers store the same thing (a global position), so either loads the other's state.
_KINDS = ("EvenSampler", "DistributedSampler")
_EMPTY: tuple[int, int, Iterator[int]] = (0, 0, iter(()))


class EvenSampler(Sampler[int]):
    """Indices of a dataset of `length` samples for one rank of `num_replicas`.

    Every rank gets `len(sampler)` indices; rank r takes global positions r, r+W, r+2W, ... of
    the epoch's order (a stateless Feistel permutation keyed by (seed, epoch)). tail="pad"
    repeats the first indices so every sample is seen at least once (`num_real`, `is_padding`
    tell evaluation which ones to drop: padding is always a suffix of a rank's pass);
    tail="drop" leaves out fewer than `num_replicas` samples.

    `global_batch_size=G` (a multiple of `num_replicas`) rounds each pass to whole global
    batches instead of whole rows of W: "drop" leaves out the partial last global batch, "pad"
    fills it with marked repeats. Taking this rank's indices in micro-batches of m, in order,
    optimizer step k with A = G / (W x m) accumulation steps then consumes exactly global
    positions [k*G, (k+1)*G) whatever W and m are: the same samples on any world size.

    The epoch advances on each new iteration; `set_epoch` still works and wins. `len()` is the
    full per-rank epoch length, except for the one pass resumed mid-epoch by
    `load_state_dict`, where it is the remaining count of that pass (so DataLoader's len is
    right for it).
    """

    _state_kind = "EvenSampler"

    def __init__(
        self,
        length: int,
        num_replicas: Any = None,
        rank: int | None = None,
        *,
        shuffle: bool = True,
        seed: int = 0,
        tail: str = "pad",
        epoch: int = 0,
        global_batch_size: int | None = None,
    ) -> None:
        self.length = check_int("length", length, 1)
        self.num_replicas, self.rank = resolve_world(num_replicas, rank)
        self.global_batch_size = global_batch_size
        plan.check_multiple(global_batch_size, self.num_replicas)
        if tail not in plan.TAILS:
            raise ValueError(f"tail must be one of {plan.TAILS}, got {tail!r}")
        self.tail = tail
        self.shuffle = bool(shuffle)
        self.seed = check_int("seed", seed)
        self._clock = EpochClock(epoch)
        self._chunk: tuple[int, int, Iterator[int]] = _EMPTY

    # ---- the current (or next) pass ------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch of the pass running now, or of the next pass if none is running."""
        return self._clock.epoch

    @property
    def start_position(self) -> int:
        """Global position where the current (or next) pass begins; > 0 only after a resume."""
        return self._clock.start

    def __len__(self) -> int:
        return plan.per_rank_count(self.length, self.num_replicas, self.tail, self._clock.start,
                                   self.global_batch_size)

    def next_pass(self) -> tuple[int, int]:
        """(real, left_out) for the pass the next __iter__ starts, for exact evaluation:
        `real` = this rank's non-padding indices (a prefix of its pass), `left_out` = samples of
        the epoch that no rank gets (tail="drop", or positions before a resume point)."""
        start = 0 if self._clock.running else self._clock.start
        g = self.global_batch_size
        real = plan.num_real_for_rank(self.length, self.rank, self.num_replicas, self.tail,
                                      start, g)
        end = plan.epoch_end(self.length, self.num_replicas, self.tail, start, g)
        return real, start + max(0, self.length - end)

    @property
    def num_real(self) -> int:
        """Real (non-padding) indices this rank gets in the current pass; the rest are repeats."""
        return plan.num_real_for_rank(
            self.length, self.rank, self.num_replicas, self.tail, self._clock.start,
            self.global_batch_size,
        )

    def is_padding(self, position: int | npt.ArrayLike) -> bool | npt.NDArray[np.bool_]:
        """Whether a global position (or array of them) is padding, i.e. a repeated index."""
        mask = plan.is_padding_position(position, self.length)
        return bool(mask) if mask.ndim == 0 else mask

    def positions(self, k0: int = 0, k1: int | None = None) -> npt.NDArray[np.int64]:
        """Global positions of this rank's k-th yielded indices of the current pass."""
        stop = len(self) if k1 is None else k1
        return plan.rank_positions(self.rank, self.num_replicas, self._clock.start, k0, stop)

    @property
    def yielded(self) -> int:
        """Indices yielded so far in the current pass."""
        base, size, rest = self._chunk
        return base + size - operator.length_hint(rest)

    def set_epoch(self, epoch: int) -> None:
        self._clock.set_epoch(epoch)
        self._chunk = _EMPTY

    def __iter__(self) -> Iterator[int]:
        epoch, start = self._clock.begin_pass()
        self._chunk = _EMPTY
        count = len(self)
        return self._generate(epoch, start, count)

    def _generate(self, epoch: int, start: int, count: int) -> Iterator[int]:
        for k0 in range(0, count, _CHUNK):
            k1 = min(count, k0 + _CHUNK)
            pos = plan.rank_positions(self.rank, self.num_replicas, start, k0, k1)
            chunk = plan.positions_to_indices(pos, self.length, self.seed, epoch, self.shuffle)
            values = chunk.tolist()
            self._chunk = (k0, len(values), iter(values))
            # `yield from` a list iterator runs at C speed; how far it got is read back with
            # length_hint when state_dict needs the yielded count.
            yield from self._chunk[2]

    # ---- resume --------------------------------------------------------------------------
    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """JSON-able state; `consumed` = indices THIS rank used in the current pass (a
        DataLoader prefetches, so the sampler has yielded more than training consumed; None
        means what was yielded). After a resume, count from the resume point."""
        clock = self._clock
        epoch, position = clock.epoch, clock.start
        if clock.running:
            used = consumed_in_pass(consumed, self.yielded, len(self), self.rank, "indices")
            position = clock.start + used * self.num_replicas
            if used == len(self):
                epoch, position = epoch + 1, 0
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "kind": self._state_kind,
            "length": self.length,
            "seed": self.seed,
            "epoch": epoch,
            "position": position,
            "shuffle": self.shuffle,
            "tail": self.tail,
        }
        if self.global_batch_size is not None:
            state["global_batch_size"] = self.global_batch_size
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the saved global position, on any number of replicas."""
        if state.get("kind") not in _KINDS or state.get("version") != STATE_VERSION:
            raise ValueError(
                f"not a {self._state_kind} state (kind={state.get('kind')!r}, "
                f"version={state.get('version')!r}); expected kind in {_KINDS}, "
                f"version={STATE_VERSION}"
            )
        for key in ("length", "seed", "shuffle"):
            if state.get(key) != getattr(self, key):
                raise ValueError(
                    f"sampler state has {key}={state.get(key)!r} but this sampler has "
                    f"{key}={getattr(self, key)!r} (rank {self.rank}): the checkpoint belongs "
                    "to a different dataset or seed; build the sampler with the same values"
                )
        epoch = check_int("epoch", state.get("epoch"), 0)
        position = check_int("position", state.get("position"), 0)
        saved_g = state.get("global_batch_size")
        g = self.global_batch_size
        if g is not None and position % g:
            # A position inside a global batch would shift every later step's samples.
            raise ValueError(
                f"sampler state resumes at global position {position}, inside a global batch of "
                f"{g} (rank {self.rank}); checkpoint only after an optimizer step"
                + (f" (the state was saved with global_batch_size={saved_g})" if saved_g else "")
            )
        if plan.per_rank_count(self.length, self.num_replicas, self.tail, position, g) == 0:
            # Nothing of that epoch is left for this world size: start the next one.
            epoch, position = epoch + 1, 0
        self._clock.resume(epoch, position)
        self._chunk = _EMPTY
