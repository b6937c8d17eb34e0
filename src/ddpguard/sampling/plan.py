"""Pure per-rank arithmetic for EvenSampler: which global positions rank r gets, and padding.

An epoch is a sequence of global positions 0, 1, 2, ...; position p holds index
perm(p mod length). Ranks take positions STRIDED: rank r gets start + r, start + r + W,
start + r + 2W, ... (W = num_replicas). So the k-th global batch of G = B * W samples is always
positions [start + k*G, start + (k+1)*G), whatever W is, and a resume only needs the global
position. With tail="pad" the pass is rounded up to a multiple of W (positions >= length are
padding: repeats of the epoch's first indices); with tail="drop" it is rounded down. Passing
`multiple=G` (a global batch, itself a multiple of W) rounds to whole global batches instead, so
every optimizer step is a full global batch on every world size.
Everything here takes plain ints and is tested "at 64 ranks" in one process.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .permutation import feistel_keys, permute_array

__all__ = [
    "TAILS",
    "check_int",
    "epoch_end",
    "per_rank_count",
    "num_real_for_rank",
    "rank_positions",
    "positions_to_indices",
    "is_padding_position",
    "rank_indices",
]

TAILS = ("pad", "drop")


def check_int(name: str, value: object, minimum: int | None = None) -> int:
    """`value` as an int, or ValueError naming it (bools and floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def _check(length: int, num_replicas: int, tail: str, start: int) -> None:
    check_int("length", length, 1)
    check_int("num_replicas", num_replicas, 1)
    check_int("start", start, 0)
    if tail not in TAILS:
        raise ValueError(f"tail must be one of {TAILS}, got {tail!r}")


def check_multiple(multiple: int | None, num_replicas: int) -> int:
    """The rounding unit of a pass: `multiple` (a global batch) or, when None, `num_replicas`."""
    if multiple is None:
        return num_replicas
    g = check_int("global_batch_size", multiple, 1)
    if g % num_replicas:
        lo = (g // num_replicas) * num_replicas
        near = ", ".join(str(v) for v in (lo, lo + num_replicas) if v > 0)
        raise ValueError(
            f"global_batch_size={g} is not a multiple of num_replicas={num_replicas}: each "
            f"rank must take the same share; nearest valid sizes: {near}"
        )
    return g


def per_rank_count(length: int, num_replicas: int, tail: str = "pad", start: int = 0,
                   multiple: int | None = None) -> int:
    """Indices each rank gets in a pass over positions [start, ...): equal on every rank.

    The pass covers a whole number of `multiple` positions (default: one per rank)."""
    _check(length, num_replicas, tail, start)
    unit = check_multiple(multiple, num_replicas)
    remaining = max(0, length - start)
    units = -(-remaining // unit) if tail == "pad" else remaining // unit
    return units * (unit // num_replicas)


def epoch_end(length: int, num_replicas: int, tail: str = "pad", start: int = 0,
              multiple: int | None = None) -> int:
    """One past the last global position of a pass that starts at `start`."""
    return start + per_rank_count(length, num_replicas, tail, start, multiple) * num_replicas


def num_real_for_rank(
    length: int, rank: int, num_replicas: int, tail: str = "pad", start: int = 0,
    multiple: int | None = None,
) -> int:
    """How many of rank `rank`'s indices are real (not padding); padding is always a suffix."""
    count = per_rank_count(length, num_replicas, tail, start, multiple)
    _check_rank(rank, num_replicas)
    first = start + rank
    real = 0 if first >= length else -(-(length - first) // num_replicas)
    return min(count, real)


def _check_rank(rank: int, num_replicas: int) -> None:
    check_int("rank", rank, 0)
    if rank >= num_replicas:
        raise ValueError(f"rank {rank} is out of range for num_replicas={num_replicas}")


def rank_positions(
    rank: int, num_replicas: int, start: int, k0: int, k1: int
) -> npt.NDArray[np.int64]:
    """Global positions of rank `rank`'s k-th indices for k in [k0, k1): start + rank + k*W."""
    _check_rank(rank, num_replicas)
    return start + rank + np.arange(k0, k1, dtype=np.int64) * num_replicas


def is_padding_position(positions: npt.ArrayLike, length: int) -> npt.NDArray[np.bool_]:
    """True where a global position is padding (a repeat), vectorized."""
    return np.asarray(positions) >= length


def positions_to_indices(
    positions: npt.ArrayLike, length: int, seed: int, epoch: int, shuffle: bool = True
) -> npt.NDArray[np.int64]:
    """Dataset indices at global positions of epoch `epoch` (padding wraps to the start)."""
    check_int("length", length, 1)
    wrapped = np.asarray(positions, dtype=np.int64) % length
    if not shuffle:
        return wrapped
    return permute_array(wrapped, length, feistel_keys(seed, epoch))


def rank_indices(
    length: int,
    rank: int,
    num_replicas: int,
    epoch: int,
    seed: int = 0,
    *,
    shuffle: bool = True,
    tail: str = "pad",
    start: int = 0,
    multiple: int | None = None,
) -> npt.NDArray[np.int64]:
    """All of rank `rank`'s indices for a pass (materialized: for tests and small datasets)."""
    count = per_rank_count(length, num_replicas, tail, start, multiple)
    pos = rank_positions(rank, num_replicas, start, 0, count)
    return positions_to_indices(pos, length, seed, epoch, shuffle)
