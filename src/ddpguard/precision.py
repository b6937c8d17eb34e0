"""Mixed precision: bf16 autocast where the device supports it, fp16 with a GradScaler on CUDA
without bf16, off on CPU unless asked (CPU autocast is slower than fp32 for small models)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["Precision", "resolve_precision"]

_MODES = ("auto", "off", "bf16", "fp16")


def resolve_precision(mode: str, device: torch.device) -> str:
    """Pure-ish: the concrete mode ("off", "bf16", "fp16") for `mode` on `device`."""
    if mode not in _MODES:
        raise ValueError(f"precision must be one of {_MODES}, got {mode!r}")
    if mode == "auto":
        if device.type != "cuda":
            return "off"
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if mode == "fp16" and device.type != "cuda":
        raise ValueError(
            f"precision='fp16' needs a CUDA device (got {device}); use 'bf16' or 'off' on CPU"
        )
    return mode


@dataclasses.dataclass
class Precision:
    """Autocast context plus the loss scaling fp16 needs. `mode` is resolved on construction.

        prec = Precision("auto", world.device)
        with prec.autocast():
            loss = ...
        prec.backward(loss)
        prec.step(optimizer)        # unscale (if fp16), step, update the scale
    """

    mode: str = "auto"
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        self.device = torch.device(self.device)
        self.mode = resolve_precision(self.mode, self.device)
        self.scaler: Any = (
            torch.amp.GradScaler("cuda") if self.mode == "fp16" else None
        )

    @property
    def dtype(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.mode)

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None:
            yield
            return
        with torch.autocast(device_type=self.device.type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Call before gradient clipping so the clip sees real gradient norms."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()
