"""Exact metrics across ranks: reduce sums and counts (never average averages), drop the padding
duplicates a sampler adds, and stop every rank together on a non-finite loss."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .model import unwrap
from .world import World

__all__ = [
    "EvalResult",
    "NonFiniteLossError",
    "LossWatch",
    "all_reduce_mean",
    "reduce_dict",
    "evaluate",
    "split_loss",
]


def _comm_device(world: World) -> torch.device:
    # NCCL reduces only CUDA tensors; gloo only CPU ones.
    return world.device if world.backend == "nccl" else torch.device("cpu")


def all_reduce_mean(value: float | torch.Tensor, world: World, *,
                    weight: float = 1.0) -> float:
    """Weighted mean of `value` over ranks: sum(value*weight) / sum(weight). Every rank gets it."""
    v = float(value.detach().float().sum()) if isinstance(value, torch.Tensor) else float(value)
    if not world.distributed:
        return v
    t = torch.tensor([v * weight, weight], dtype=torch.float64, device=_comm_device(world))
    dist.all_reduce(t)
    return float(t[0] / t[1]) if float(t[1]) != 0 else math.nan


def reduce_dict(values: Mapping[str, float | torch.Tensor], world: World, *,
                op: str = "mean") -> dict[str, float]:
    """Reduce a dict of scalars over ranks in ONE collective (keys sorted so ranks agree)."""
    if op not in ("mean", "sum", "max", "min"):
        raise ValueError(f"op must be 'mean', 'sum', 'max' or 'min', got {op!r}")
    keys = sorted(values)
    local = [float(values[k]) for k in keys]
    if not world.distributed:
        return dict(zip(keys, local, strict=True))
    t = torch.tensor(local, dtype=torch.float64, device=_comm_device(world))
    red = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
           "min": dist.ReduceOp.MIN}[op]
    dist.all_reduce(t, op=red)
    if op == "mean":
        t /= world.world_size
    return dict(zip(keys, t.tolist(), strict=True))


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """`loss` = total of values / total of weights over the whole set; `count` = real samples."""

    loss: float
    count: int
    total: float
    weight: float


def split_loss(out: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise a loss_fn result to (per-sample values, per-sample weights), both 1-D.

    A 1-D tensor means one value per sample (weight 1); a pair (values, weights) lets a language
    model return per-sequence summed token losses with token counts, for a per-token mean.
    """
    if isinstance(out, tuple):
        values, weights = out
    else:
        values, weights = out, None
    if not isinstance(values, torch.Tensor) or values.dim() != 1:
        raise ValueError(
            "loss_fn must return per-sample losses: a 1-D tensor with one value per sample, or "
            f"a pair (values, weights) of 1-D tensors; got {type(values).__name__} "
            f"{getattr(values, 'shape', '')}. Use reduction='none'."
        )
    if weights is None:
        weights = torch.ones_like(values)
    return values, weights


def _num_real(loader: Any) -> int | None:
    for attr in ("sampler", "batch_sampler"):
        s = getattr(loader, attr, None)
        n = getattr(s, "num_real", None)
        if n is not None:
            return int(n)
    return None


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable[Any], loss_fn: Any, world: World, *,
             num_real: int | None = None) -> EvalResult:
    """Exact evaluation over the whole set, the same result on every rank.

    Runs through the unwrapped module, so no DDP collective happens inside (a DDP forward with
    broadcast_buffers is a collective: evaluating on rank 0 only hangs, seed 000). The sampler's
    padding duplicates (a suffix of each rank's positions; `num_real` real samples on this rank,
    read from the loader's sampler when not given) are dropped. Per-rank sums and counts are
    all-reduced once at the end in one small tensor. With TokenBatchSampler, batches it marks
    as padding (`is_padding_batch`) are skipped. `loss_fn(module, batch)` returns per-sample
    values, or (values, weights): see `split_loss`.
    """
    module = unwrap(model)
    was_training = module.training
    module.eval()
    limit = _num_real(loader) if num_real is None else num_real
    # Token batching repeats whole batches only when a rank would otherwise get none.
    padding_batch = getattr(getattr(loader, "batch_sampler", None), "is_padding_batch", None)
    seen = 0
    total = torch.zeros((), dtype=torch.float64)
    weight = torch.zeros((), dtype=torch.float64)
    count = 0
    try:
        for k, batch in enumerate(loader):
            if padding_batch is not None and padding_batch(k):
                continue
            values, weights = split_loss(loss_fn(module, batch))
            n = values.shape[0]
            keep = n if limit is None else max(0, min(n, limit - seen))
            seen += n
            if keep:
                total += values[:keep].detach().double().sum().cpu()
                weight += weights[:keep].detach().double().sum().cpu()
                count += keep
    finally:
        module.train(was_training)
    t = torch.stack([total, weight, torch.tensor(float(count), dtype=torch.float64)])
    if world.distributed:
        t = t.to(_comm_device(world))
        dist.all_reduce(t)
    tot, w, c = t.tolist()
    return EvalResult(loss=tot / w if w else math.nan, count=int(round(c)), total=tot, weight=w)


class NonFiniteLossError(FloatingPointError):
    """A rank saw a NaN/inf loss; raised on every rank together, naming the first bad step."""


class LossWatch:
    """Collective-safe NaN/inf loss check.

    Each rank keeps its last losses as detached device tensors (no synchronisation: a `.item()`
    per step would stall the GPU pipeline, and per-step tensor arithmetic cost ~3% of a small
    model's step) and checks them in one vectorized op at flush. Every `every` steps, and at
    `flush()`, all
    ranks all-reduce one tiny tensor (MIN of the first bad step): one extra collective per `every`
    steps, called the same number of times on every rank because every rank does the same number
    of steps. If any rank saw a bad loss, every rank raises together naming the step and rank.
    """

    def __init__(self, world: World, every: int = 10) -> None:
        if every < 1:
            raise ValueError(f"nan check every={every} must be >= 1")
        self.world = world
        self.every = every
        self._calls = 0
        self._losses: list[torch.Tensor] = []
        self._steps: list[int] = []
        self._bad_step = math.inf  # first non-finite step seen locally, kept across flushes
        self._device = _comm_device(world)

    def update(self, loss: torch.Tensor, step: int) -> None:
        v = loss.detach()
        self._losses.append(v if v.dim() == 0 else v.sum())
        self._steps.append(step)
        self._calls += 1
        if self._calls % self.every == 0:
            self.flush()

    def _first_bad_local(self) -> float:
        if self._losses:
            finite = torch.isfinite(torch.stack([v.float().reshape(()) for v in self._losses]))
            if not bool(finite.all()):
                idx = int((~finite).nonzero()[0])
                self._bad_step = min(self._bad_step, float(self._steps[idx]))
            self._losses.clear()
            self._steps.clear()
        return self._bad_step

    def flush(self) -> None:
        first = torch.tensor(self._first_bad_local(), dtype=torch.float64, device=self._device)
        me = torch.where(torch.isfinite(first), torch.tensor(float(self.world.rank),
                         dtype=torch.float64, device=self._device),
                         torch.tensor(math.inf, dtype=torch.float64, device=self._device))
        t = torch.stack([first.reshape(()), me.reshape(())])
        if self.world.distributed:
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
        step, rank = t.tolist()
        if math.isfinite(step):
            raise NonFiniteLossError(
                f"rank {self.world.rank}: stopping every rank together: the loss was not finite "
                f"at step {int(step)} (first seen on rank {int(rank)}). Lower the learning rate, "
                "enable gradient clipping, or check that batch's data; resume from the last "
                "checkpoint before that step."
            )
