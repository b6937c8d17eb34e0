"""Exact metrics across ranks: reduce sums and counts (never average averages), drop the padding
duplicates a sampler adds, and stop every rank together on a non-finite loss."""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .model import to_device, unwrap
from .readback import Readback, scalars
from .sampling.coverage import Coverage, describe_loader
from .world import World

__all__ = [
    "EvalResult",
    "InexactEvaluationError",
    "InexactEvaluationWarning",
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
    """The mean of every element of `value` on every rank; every rank gets it.

    A tensor contributes its elements (a rank with 5 elements counts 5 times as much as a rank
    with 1: the mean of all elements, not a mean of per-rank means); a number is one element.
    `weight` scales this rank's elements: sum(weight * elements) / sum(weight * count).
    NaN when there are no elements anywhere."""
    if isinstance(value, torch.Tensor):
        v = value.detach()
        total, count = float(v.double().sum()), float(v.numel())
    else:
        total, count = float(value), 1.0
    t = torch.tensor([total * weight, count * weight], dtype=torch.float64,
                     device=_comm_device(world))
    if world.distributed:
        dist.all_reduce(t)
    num, den = t.tolist()
    return num / den if den != 0 else math.nan


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
    """`loss` = total of values / total of weights over the whole set; `count` = real samples.

    `exact` is False when the loader repeats or leaves out samples that could not be removed
    or added back; `note` then says why (the same text as the warning)."""

    loss: float
    count: int
    total: float
    weight: float
    exact: bool = True
    note: str = ""


class InexactEvaluationWarning(UserWarning):
    """evaluate() could not make the result exact; the message says why and what to change."""


class InexactEvaluationError(RuntimeError):
    """Raised on every rank by evaluate(..., exact=True) instead of InexactEvaluationWarning."""


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


def _agree(cov: Coverage, world: World) -> tuple[int, int, bool, bool]:
    """(left out over all ranks, of which by batching, any rank unknown, the whole dataset
    on every rank), the same on every rank: two tiny collectives, before the loop."""
    unknown = (bool(cov.unknown) and world.distributed) or bool(cov.mismatch(world.rank,
                                                                          world.world_size))
    whole = cov.whole_dataset
    if not world.distributed:
        return cov.left_out + cov.left_out_local, cov.left_out_local, unknown, False
    dev = _comm_device(world)
    summed = torch.tensor([cov.left_out_local, int(unknown), int(whole >= 0)],
                          dtype=torch.float64, device=dev)
    maxed = torch.tensor([cov.left_out, whole, -whole], dtype=torch.float64, device=dev)
    dist.all_reduce(summed)
    dist.all_reduce(maxed, op=dist.ReduceOp.MAX)
    local_lost, unknown_ranks, whole_ranks = (int(round(x)) for x in summed.tolist())
    left_out, longest, neg_shortest = (int(round(x)) for x in maxed.tolist())
    everywhere = whole_ranks == world.world_size and longest == -neg_shortest
    return left_out + local_lost, local_lost, unknown_ranks > 0, everywhere


def _inexact_reason(cov: Coverage, world: World, lost: int, unknown: bool,
                    everywhere: bool) -> str:
    w = world.world_size
    if everywhere:
        n = cov.whole_dataset
        return (
            f"every one of the {w} ranks evaluated the whole dataset ({n} samples through "
            f"{cov.kind}): each sample is counted {w} times (count {w * n} instead of {n}). "
            "Shard the evaluation loader with sampler=ddpguard.DistributedSampler(dataset, "
            "shuffle=False); if each rank holds a different part of equal size, pass "
            "num_real=len(dataset) to say so"
        )
    if lost:
        why = cov.why_left_out or "another rank's loader leaves samples out"
        return f"{lost} sample{'s' if lost != 1 else ''} never evaluated: {why}"
    mismatch = cov.mismatch(world.rank, w)
    if unknown and mismatch:
        return mismatch
    if unknown:
        what = cov.unknown or "another rank's loader uses a sampler whose padding is unknown"
        return (
            f"cannot tell which evaluated samples are padded duplicates or which are left out: "
            f"{what}, so the result may count some samples twice or miss some. Use "
            "ddpguard.DistributedSampler (or torch's, or EvenSampler / TokenBatchSampler), or "
            "pass num_real=<this rank's real samples>; exact=True turns this into an error"
        )
    return ""


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable[Any], loss_fn: Any, world: World, *,
             num_real: int | None = None, exact: bool = False) -> EvalResult:
    """Exact evaluation over the whole set, the same result on every rank, or a loud refusal.

    Runs through the unwrapped module, so no DDP collective happens inside (a DDP forward with
    broadcast_buffers is a collective: evaluating on rank 0 only hangs, docs/pitfalls.md). Padded
    duplicates are dropped: those of ddpguard's samplers, of torch's DistributedSampler (it
    repeats the epoch's first indices) and TokenBatchSampler's padding batches, also under
    `batch_size=` / `batch_sampler=` loaders (see `ddpguard.sampling.coverage`). Per-rank sums
    and counts are all-reduced in one small tensor at the end (two more tiny all-reduces before
    the loop agree on what the loaders cover); no prediction is gathered.

    When the loader cannot give an exact result (drop_last=True leaves samples out, every rank
    walks the whole dataset, or a sampler's padding is unknown) rank 0 warns once
    (InexactEvaluationWarning, naming the count or the sampler class and the fix) and the
    result has exact=False; with `exact=True` every rank raises InexactEvaluationError before
    evaluating instead. `num_real` (this rank's real samples, a prefix of what the loader
    yields) overrides the inspection. `loss_fn(module, batch)`, given the batch on the world's
    device (`to_device`), returns per-sample values, or (values, weights): see `split_loss`.
    """
    cov = describe_loader(loader) if num_real is None else Coverage("num_real", real=num_real)
    lost, _, unknown, everywhere = _agree(cov, world)
    reason = _inexact_reason(cov, world, lost, unknown, everywhere)
    if reason and exact:
        raise InexactEvaluationError(f"rank {world.rank}: evaluate(exact=True) refused: {reason}")
    module = unwrap(model)
    was_training = module.training
    module.eval()
    limit, padding_batch = cov.real, cov.padding_batch
    seen = 0
    # Summed where the values lie and read back once: a .cpu() per batch would stall a GPU.
    total: Any = torch.zeros((), dtype=torch.float64)
    weight: Any = torch.zeros((), dtype=torch.float64)
    count = 0
    try:
        for k, batch in enumerate(loader):
            if padding_batch is not None and padding_batch(k):
                continue
            values, weights = split_loss(loss_fn(module, to_device(batch, world.device)))
            n = values.shape[0]
            keep = n if limit is None else max(0, min(n, limit - seen))
            seen += n
            if keep:
                total = total + values[:keep].detach().double().sum()
                weight = weight + weights[:keep].detach().double().sum()
                count += keep
    finally:
        module.train(was_training)
    t = torch.stack([total.cpu(), weight.cpu(), torch.tensor(float(count), dtype=torch.float64)])
    if world.distributed:
        t = t.to(_comm_device(world))
        dist.all_reduce(t)
    tot, w, c = t.tolist()
    if reason and world.is_main:  # once per job, not once per rank
        warnings.warn(f"evaluate() is not exact: {reason}", InexactEvaluationWarning,
                      stacklevel=3)
    return EvalResult(loss=tot / w if w else math.nan, count=int(round(c)), total=tot, weight=w,
                      exact=not reason, note=reason)


class NonFiniteLossError(FloatingPointError):
    """A rank saw a NaN/inf loss; raised on every rank together, naming the first bad step."""


class LossWatch:
    """Collective-safe NaN/inf loss check.

    Each rank keeps its last losses as detached device tensors (no synchronisation: a `.item()`
    per step would stall the GPU pipeline, and per-step tensor arithmetic cost ~3% of a small
    model's step) and reads them back every `every` updates, all at once. Then all ranks
    all-reduce one tiny tensor (MIN of the first bad step): one extra collective per `every`
    updates, called the same number of times on every rank because every rank does the same
    number of steps. If any rank saw a bad loss, every rank raises together naming the step and
    rank. On a GPU the periodic check reads each window back one check late (readback.py), so it
    never waits for the queue; `flush()` reads everything at once (before a checkpoint: never
    save weights a NaN already reached).
    """

    def __init__(self, world: World, every: int = 10) -> None:
        if every < 1:
            raise ValueError(f"nan check every={every} must be >= 1")
        self.world = world
        self.every = every
        self._calls = 0
        self._losses: list[torch.Tensor] = []
        self._steps: list[int] = []
        self._bad_step = math.inf  # first non-finite step seen locally, kept across checks
        self._device = _comm_device(world)
        self._losses_back = Readback()
        self._verdicts_back = Readback()  # NCCL: the periodic all-reduce's result, read late

    def update(self, loss: torch.Tensor, step: int) -> None:
        v = loss.detach()
        self._losses.append(v if v.dim() == 0 else v.sum())
        self._steps.append(step)
        self._calls += 1
        if self._calls % self.every == 0:
            self._check(wait=False)

    def _ship(self, wait: bool) -> None:
        ready = []
        if self._losses:
            values = scalars(self._losses)
            ready = self._losses_back.push(self._steps, values)
            self._losses, self._steps = [], []
        if wait:
            ready += self._losses_back.wait_all()
        for steps, vals in ready:
            bad = [s for s, v in zip(steps, vals, strict=True) if not math.isfinite(v)]
            if bad:
                self._bad_step = min(self._bad_step, float(bad[0]))

    def _check(self, wait: bool) -> None:
        # One MIN over step * world_size + rank: the earliest bad step, and among the ranks that
        # saw it first, the lowest. (A MIN of steps and a MIN of ranks taken separately would
        # blame rank 0 for a NaN it only received from rank 1 through the gradient all-reduce.)
        w = max(1, self.world.world_size)
        if self.world.distributed and self._device.type == "cuda" and not wait:
            # NCCL: this window's key is computed and reduced on the device, asynchronously,
            # and read a check late; .item() here would wait for the whole queue.
            t = self._window_key(w)
            work = dist.all_reduce(t, op=dist.ReduceOp.MIN, async_op=True)
            if work is not None:
                work.wait()  # the stream waits, not this thread
            first = min((v for _, vs in self._verdicts_back.push(None, t) for v in vs),
                        default=math.inf)
        else:
            self._ship(wait)
            local = self._bad_step
            first = local * w + self.world.rank if math.isfinite(local) else math.inf
            if self.world.distributed:
                t = torch.full((1,), first, dtype=torch.float64, device=self._device)
                dist.all_reduce(t, op=dist.ReduceOp.MIN)
                earlier = [v for _, vs in self._verdicts_back.wait_all() for v in vs]
                first = min([*earlier, float(t.item())])
        if math.isfinite(first):
            step = first // w
            rank = first - step * w
            raise NonFiniteLossError(
                f"rank {self.world.rank}: stopping every rank together: the loss was not finite "
                f"at step {int(step)} (first seen on rank {int(rank)}). Lower the learning rate, "
                "enable gradient clipping, or check that batch's data; resume from the last "
                "checkpoint before that step."
            )

    def _window_key(self, w: int) -> torch.Tensor:
        """This window's MIN key as a 1-element device tensor, with no wait: the step numbers
        travel from pinned memory, the check runs on the device."""
        key = torch.full((1,), math.inf, dtype=torch.float64, device=self._device)
        if self._losses:
            values = scalars(self._losses).to(self._device)
            steps = torch.tensor(self._steps, dtype=torch.float64).pin_memory()
            steps = steps.to(self._device, non_blocking=True) * w + self.world.rank
            bad = torch.where(torch.isfinite(values), math.inf, steps)
            key = torch.minimum(key, bad.min().reshape(1))
            self._losses, self._steps = [], []
        return key

    def flush(self) -> None:
        """Read every loss back now (waiting for the device if it must) and check them on
        every rank together."""
        self._check(wait=True)
