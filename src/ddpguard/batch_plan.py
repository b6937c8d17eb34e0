"""The global batch as the one number a user states (docs/pitfalls.md, docs/batching.md).

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

__all__ = [
    "BatchPlan",
    "find_micro_batch",
    "is_out_of_memory",
    "make_probe",
    "rescale_lr",
    "scaled_lr",
    "start_plan",
]

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


def start_plan(
    global_batch_size: int,
    world_size: int,
    *,
    micro_batch_size: int | None = None,
    max_micro_batch: int | None = None,
    probe: Callable[[int], object] | None = None,
    after_oom: Callable[[], object] | None = None,
) -> BatchPlan:
    """The plan a job starts with on `world_size` ranks (call on every rank when `probe` is set).

    `micro_batch_size` above the per-rank batch is clamped to it (so a setting made for more
    ranks still works on fewer), otherwise it must divide the per-rank batch; `max_micro_batch`
    caps it at the largest divisor not above the cap; `probe` then shrinks it until it fits on
    every rank (find_micro_batch). The micro-batch never changes the global batch.
    """
    plan = BatchPlan(global_batch_size, world_size)  # validates the split over ranks
    if micro_batch_size is not None:
        plan = BatchPlan(global_batch_size, world_size,
                         min(micro_batch_size, plan.per_rank_batch_size))
    if max_micro_batch is not None and plan.micro > max_micro_batch:
        plan = BatchPlan.fitting(global_batch_size, world_size, max_micro_batch)
    if probe is not None:
        plan = find_micro_batch(plan, probe, after_oom=after_oom)
    return plan


def make_probe(model: Any, dataset: Any, loss_fn: Callable[[Any, Any], Any],
               collate_fn: Callable[[list[Any]], Any] | None = None) -> Callable[[int], None]:
    """A probe for find_micro_batch: one forward and backward of `micro` samples of `dataset`
    (the first ones, repeated if needed), without DDP's gradient sync, then drop the gradients.

    It measures peak memory on a real micro-batch; it also runs the model once in train mode,
    so BatchNorm running statistics see one extra batch.
    """
    import contextlib

    import torch
    from torch.utils.data import default_collate

    collate = collate_fn or default_collate

    def probe(micro: int) -> None:
        batch = collate([dataset[i % len(dataset)] for i in range(micro)])
        no_sync = getattr(model, "no_sync", None)
        ctx = no_sync() if no_sync is not None else contextlib.nullcontext()
        try:
            with ctx:
                out = loss_fn(model, batch)
                values = out[0] if isinstance(out, tuple) else out
                torch.as_tensor(values).float().mean().backward()
        finally:
            for p in model.parameters():
                p.grad = None

    return probe


def rescale_lr(optimizer: Any, baseline_batch_size: int, global_batch_size: int,
               rule: str = "none", scheduler: Any = None) -> str:
    """Print-ready note comparing the linear and square-root rescalings of the optimizer's
    learning rate (group 0); with rule "linear" or "sqrt", scale every param group's lr (and a
    scheduler's base_lrs / initial_lr, which schedulers read instead) by that factor."""
    lr0 = float(optimizer.param_groups[0]["lr"])
    _, note = scaled_lr(lr0, baseline_batch_size, global_batch_size, rule)
    factor, _ = scaled_lr(1.0, baseline_batch_size, global_batch_size, rule)
    if rule != "none":
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * factor
            if "initial_lr" in group:
                group["initial_lr"] = group["initial_lr"] * factor
        if scheduler is not None and hasattr(scheduler, "base_lrs"):
            scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
    return note
