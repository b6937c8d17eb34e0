"""The global batch as the one number a user states (seed 002).

`BatchPlan` splits `global_batch_size` exactly into world size x accumulation steps x micro-batch,
or refuses with the nearest valid choices: never a silent rounding. `find_micro_batch` shrinks
the micro-batch until a probe step fits in memory, with every rank adopting the same size, so the
global batch (and so the training trajectory) stays the same. `scaled_lr` prints the usual
learning-rate rescalings when the global batch differs from a published baseline.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

__all__ = ["BatchPlan", "find_micro_batch", "is_out_of_memory", "scaled_lr"]

log = logging.getLogger("ddpguard")


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _nearest_multiples(value: int, step: int) -> str:
    lo = (value // step) * step
    hi = lo + step
    return ", ".join(str(v) for v in (lo, hi) if v > 0)


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """global_batch_size = world_size x accumulation_steps x micro_batch_size, exactly.

    `unit` is "samples" (EvenSampler) or "tokens" (TokenBatchSampler; the micro-batch is then the
    token budget `max_tokens` of one micro-batch).
    """

    global_batch_size: int
    world_size: int = 1
    micro_batch_size: int | None = None
    unit: str = "samples"

    def __post_init__(self) -> None:
        for name in ("global_batch_size", "world_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if self.unit not in ("samples", "tokens"):
            raise ValueError(f"unit must be 'samples' or 'tokens', got {self.unit!r}")
        g, w = self.global_batch_size, self.world_size
        if g % w:
            raise ValueError(
                f"global_batch_size={g} {self.unit} cannot be split evenly over world_size={w} "
                f"ranks ({g}/{w} = {g / w:g}); nearest valid global batch sizes: "
                f"{_nearest_multiples(g, w)}"
            )
        m = self.micro_batch_size
        if m is None:
            object.__setattr__(self, "micro_batch_size", g // w)
            return
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"micro_batch_size must be a positive integer, got {m!r}")
        per_rank = g // w
        if per_rank % m:
            fits = [d for d in _divisors(per_rank) if d <= m]
            raise ValueError(
                f"micro_batch_size={m} does not divide the per-rank batch {per_rank} "
                f"(global_batch_size={g} / world_size={w}); valid micro-batch sizes up to {m}: "
                f"{', '.join(map(str, fits[-6:]))}"
            )

    @property
    def per_rank_batch_size(self) -> int:
        return self.global_batch_size // self.world_size

    @property
    def micro(self) -> int:
        assert self.micro_batch_size is not None  # set in __post_init__
        return self.micro_batch_size

    @property
    def accumulation_steps(self) -> int:
        return self.per_rank_batch_size // self.micro

    @classmethod
    def fitting(cls, global_batch_size: int, world_size: int, max_micro_batch: int,
                unit: str = "samples") -> BatchPlan:
        """The plan with the largest micro-batch not above `max_micro_batch`."""
        base = cls(global_batch_size, world_size, unit=unit)  # validates the split over ranks
        if max_micro_batch < 1:
            raise ValueError(f"max_micro_batch must be >= 1, got {max_micro_batch}")
        best = max(d for d in _divisors(base.per_rank_batch_size) if d <= max_micro_batch)
        return cls(global_batch_size, world_size, best, unit)

    def smaller(self) -> BatchPlan:
        """The next smaller micro-batch (about half) with more accumulation; same global batch."""
        if self.micro == 1:
            raise ValueError(
                f"cannot shrink the micro-batch below 1 {self.unit[:-1]}: even one does not fit "
                f"(global batch {self.global_batch_size} on {self.world_size} ranks)"
            )
        return BatchPlan.fitting(self.global_batch_size, self.world_size, self.micro // 2,
                                 self.unit)

    def for_world_size(self, world_size: int) -> BatchPlan:
        """The same global batch on another number of ranks, keeping the micro-batch if it fits."""
        base = BatchPlan(self.global_batch_size, world_size, unit=self.unit)
        return BatchPlan.fitting(self.global_batch_size, world_size,
                                 min(self.micro, base.per_rank_batch_size), self.unit)

    def describe(self) -> str:
        return (
            f"global batch {self.global_batch_size} {self.unit} = {self.world_size} rank(s) x "
            f"{self.accumulation_steps} accumulation step(s) x micro-batch {self.micro}"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"version": 1, "global_batch_size": self.global_batch_size,
                "world_size": self.world_size, "micro_batch_size": self.micro, "unit": self.unit}


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(exc, oom) or "out of memory" in str(exc).lower()


def _agree_min(value: int) -> int:
    """Smallest `value` over all ranks (identity without a process group)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def find_micro_batch(
    plan: BatchPlan,
    probe: Callable[[int], object],
    *,
    is_oom: Callable[[BaseException], bool] = is_out_of_memory,
    after_oom: Callable[[], object] | None = None,
) -> BatchPlan:
    """Shrink `plan`'s micro-batch until `probe(micro)` runs without running out of memory on
    EVERY rank. Call it on all ranks at once (one tiny all-reduce per try).

    `probe(micro)` should run one forward and backward on a micro-batch of that size (and zero
    the gradients after). Any rank's OOM makes all ranks shrink together, so ranks can never
    disagree on the micro-batch. On CPU, a probe that raises `torch.OutOfMemoryError` above a
    chosen size simulates a memory limit. `after_oom` frees caches (default: empty the CUDA
    cache when CUDA is in use).
    """
    while True:
        try:
            probe(plan.micro)
            fits = 1
        except Exception as exc:
            if not is_oom(exc):
                raise
            fits = 0
            if after_oom is not None:
                after_oom()
            else:
                import torch

                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
        if _agree_min(fits):
            return plan
        smaller = plan.smaller()
        log.warning("micro-batch %d does not fit on some rank; trying %d (%s)",
                    plan.micro, smaller.micro, smaller.describe())
        plan = smaller


def scaled_lr(lr: float, baseline_batch_size: int, global_batch_size: int,
              rule: str = "none") -> tuple[float, str]:
    """Learning rate for a global batch that differs from a baseline's, and a one-line note.

    rule: "none" (keep `lr`; the user decides), "linear" (x K) or "sqrt" (x sqrt K), with
    K = global_batch_size / baseline_batch_size. The note always shows both rescalings.
    """
    if rule not in ("none", "linear", "sqrt"):
        raise ValueError(f"rule must be 'none', 'linear' or 'sqrt', got {rule!r}")
    if lr <= 0 or baseline_batch_size < 1 or global_batch_size < 1:
        raise ValueError(
            f"need lr > 0 and batch sizes >= 1, got lr={lr}, "
            f"baseline_batch_size={baseline_batch_size}, global_batch_size={global_batch_size}"
        )
    k = global_batch_size / baseline_batch_size
    options = {"none": lr, "linear": lr * k, "sqrt": lr * math.sqrt(k)}
    note = (
        f"global batch {global_batch_size} vs baseline {baseline_batch_size} (K={k:g}): "
        f"linear rule lr={options['linear']:.6g}, square-root rule lr={options['sqrt']:.6g}; "
        f"using {rule} -> lr={options[rule]:.6g}"
    )
    return options[rule], note
