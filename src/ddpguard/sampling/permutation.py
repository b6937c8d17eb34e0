"""Stateless pseudo-random permutation of range(n): position -> index in O(1) memory.

A keyed Feistel network over the next power of two 2**bits >= n, with cycle-walking for values
that land in [n, 2**bits). The two halves have sizes a and b = bits - a and swap sizes every
round, so any bit count works (no rounding up to an even count, which could quadruple the
domain and the walk length). Each round is a bijection, so the whole network is one, and
cycle-walking from a value < n always returns to [0, n). Round keys come from (seed, epoch), so
every epoch is a different, reproducible order. Everything is vectorized numpy on uint64.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["feistel_keys", "permute", "permute_array"]

_MASK64 = (1 << 64) - 1
_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def feistel_keys(seed: int, epoch: int, rounds: int = _ROUNDS) -> tuple[int, ...]:
    """Round keys derived from (seed, epoch); any Python ints (negative or huge seeds wrap)."""
    state = _splitmix64(_splitmix64(seed & _MASK64) ^ (epoch & _MASK64))
    keys = []
    for _ in range(rounds):
        state = _splitmix64(state)
        keys.append(state)
    return tuple(keys)


def _domain_bits(n: int) -> int:
    # At least 2 bits so both halves are non-empty.
    return max(2, (n - 1).bit_length())


def _network(x: npt.NDArray[np.uint64], bits: int, keys: tuple[int, ...]) -> npt.NDArray[np.uint64]:
    a = bits // 2  # size of the left half
    b = bits - a  # size of the right half
    with np.errstate(over="ignore"):
        for key in keys:
            right = x & np.uint64((1 << b) - 1)
            x >>= np.uint64(b)  # x is now the left half
            # Round function: one multiply of (right ^ key), keeping the well-mixed high bits.
            z = right ^ np.uint64(key)
            z *= _M1
            z ^= z >> _S31
            z *= _M2
            z >>= np.uint64(64 - a)  # a >= 1: the domain has at least 2 bits
            x ^= z
            # (L, R) -> (R, L ^ F(R)): the new left half has b bits, the new right half a bits.
            right <<= np.uint64(a)
            x |= right
            a, b = b, a
    return x


def permute_array(positions: npt.ArrayLike, n: int, keys: tuple[int, ...]) -> npt.NDArray[np.int64]:
    """Indices for `positions` (each in [0, n)) under the permutation keyed by `keys`."""
    pos = np.asarray(positions, dtype=np.uint64)
    if n <= 1:
        return np.zeros(pos.shape, dtype=np.int64)
    bits = _domain_bits(n)
    out = _network(pos.copy(), bits, keys)
    limit = np.uint64(n)
    todo = np.flatnonzero(out >= limit)
    # Cycle-walking: re-encrypt only the values still outside [0, n). The domain is < 2n, so
    # each pass keeps fewer than half of them on average.
    while todo.size:
        walked = _network(out[todo], bits, keys)
        out[todo] = walked
        todo = todo[walked >= limit]
    return out.astype(np.int64)


def permute(positions: npt.ArrayLike, n: int, seed: int, epoch: int) -> npt.NDArray[np.int64]:
    """The index at each position of epoch `epoch`'s order of range(n) (a bijection on [0, n))."""
    if n < 1:
        raise ValueError(f"cannot permute range({n}): the length must be >= 1")
    return permute_array(positions, n, feistel_keys(seed, epoch))
