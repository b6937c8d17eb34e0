"""The settings and the result of `fit()` (train.py): typed, validated in `__post_init__` with a
ValueError that names the bad value."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["FitConfig", "FitResult"]


@dataclasses.dataclass
class FitConfig:
    """Everything fit() decides. Batches are per rank: `batch_size` samples (EvenSampler) or a
    `max_tokens` budget (TokenBatchSampler over the dataset's `lengths`).

    Or state the GLOBAL batch instead (samples per optimizer step over all ranks, docs/batching.md):
    `global_batch_size` makes `batch_size` and `accumulate` unused; the micro-batch is
    `micro_batch_size` (default: the whole per-rank batch), capped by `max_micro_batch` and
    shrunk at start until it fits in memory; the accumulation steps follow. The result is the
    same on any number of ranks. `baseline_batch_size` prints the linear and square-root
    rescaled learning rates; `lr_rule` ("none", "linear", "sqrt") applies one of them."""

    epochs: int = 1
    batch_size: int | None = 32
    max_tokens: int | None = None
    accumulate: int = 1
    eval_batch_size: int | None = None
    num_workers: int = 0
    seed: int = 0
    shuffle: bool = True
    max_steps: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    keep_last: int = 2
    resume: bool = False
    log_csv: str | None = None
    precision: str = "auto"
    grad_clip: float | None = None
    nan_check_every: int = 10
    progress: bool = True
    eval_at_start: bool = False
    checkpoint_timeout: float = 300.0
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    max_micro_batch: int | None = None
    baseline_batch_size: int | None = None
    lr_rule: str = "none"

    def __post_init__(self) -> None:
        def positive(name: str, allow_none: bool = False) -> None:
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"FitConfig.{name} must be a positive integer, got {v!r}")

        positive("epochs")
        positive("accumulate")
        positive("keep_last")
        positive("nan_check_every")
        for name in ("batch_size", "max_tokens", "eval_batch_size", "max_steps",
                     "global_batch_size", "micro_batch_size", "max_micro_batch",
                     "baseline_batch_size"):
            positive(name, allow_none=True)
        self._check_global_batch()
        if (self.batch_size is None) == (self.max_tokens is None):
            raise ValueError(
                "FitConfig needs exactly one of batch_size (samples per rank) or max_tokens "
                f"(token budget per rank, TokenBatchSampler); got batch_size={self.batch_size}, "
                f"max_tokens={self.max_tokens}"
            )
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if self.resume and self.checkpoint_dir is None:
            raise ValueError("resume=True needs checkpoint_dir")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be positive, got {self.grad_clip}")
        if self.precision not in ("auto", "off", "bf16", "fp16"):
            raise ValueError(f"precision must be auto, off, bf16 or fp16, got {self.precision!r}")

    def _check_global_batch(self) -> None:
        if self.lr_rule not in ("none", "linear", "sqrt"):
            raise ValueError(f"lr_rule must be 'none', 'linear' or 'sqrt', got {self.lr_rule!r}")
        if self.global_batch_size is None:
            for name in ("micro_batch_size", "max_micro_batch", "baseline_batch_size"):
                if getattr(self, name) is not None:
                    raise ValueError(f"FitConfig.{name}={getattr(self, name)} needs "
                                     "global_batch_size")
            if self.lr_rule != "none":
                raise ValueError(f"lr_rule={self.lr_rule!r} needs global_batch_size and "
                                 "baseline_batch_size")
            return
        if self.max_tokens is not None:
            raise ValueError(f"global_batch_size={self.global_batch_size} counts samples; it does "
                             f"not combine with max_tokens={self.max_tokens}")
        if self.accumulate != 1:
            raise ValueError(f"accumulate={self.accumulate} with global_batch_size="
                             f"{self.global_batch_size}: the batch plan decides the accumulation "
                             "steps; set micro_batch_size instead")
        if self.lr_rule != "none" and self.baseline_batch_size is None:
            raise ValueError(f"lr_rule={self.lr_rule!r} needs baseline_batch_size")


@dataclasses.dataclass
class FitResult:
    steps: int
    epochs_done: int
    samples: int
    tokens: int
    seconds: float
    train_loss: list[tuple[int, float]]
    eval_loss: list[tuple[int, float]]
    resumed_from: str | None
    batch_plan: dict[str, Any] | None = None  # BatchPlan.state_dict() this run used
