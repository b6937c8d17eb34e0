"""What fit() writes as it trains: the CSV log (rank 0) and the training losses, read back from
the device in groups."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch

from .fit_config import FitResult
from .readback import Readback, scalars
from .world import World


class CsvLog:
    def __init__(self, path: str | None, world: World) -> None:
        self.f: Any = None
        if path is not None and world.is_main:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fresh = not Path(path).exists()
            self.f = open(path, "a", newline="")  # noqa: SIM115 - closed in close()
            self.w = csv.writer(self.f)
            if fresh:
                self.w.writerow(["kind", "epoch", "step", "loss", "lr", "seconds"])

    def row(self, *values: Any) -> None:
        if self.f is not None:
            self.w.writerow(values)

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


class LossLog:
    """Losses are read back in groups, and on a GPU one group late (readback.py): a float() per
    step, or a wait for each group, would stall the GPU's queue."""

    def __init__(self, result: FitResult, log: CsvLog, bar: Any) -> None:
        self.result, self.log, self.bar = result, log, bar
        self.pending: list[tuple[int, int, Any, float]] = []  # (epoch, step, lr, seconds)
        self.pending_losses: list[torch.Tensor] = []
        self.back = Readback()

    def add(self, row: tuple[int, int, Any, float], loss: torch.Tensor) -> None:
        self.pending.append(row)
        self.pending_losses.append(loss.detach())

    def drain(self, wait: bool = True) -> None:
        ready = []
        if self.pending:
            ready = self.back.push(self.pending.copy(), scalars(self.pending_losses))
            self.pending.clear()
            self.pending_losses.clear()
        if wait:
            ready += self.back.wait_all()
        for rows, losses in ready:
            for (ep, st, lr, secs), lv in zip(rows, losses, strict=True):
                self.result.train_loss.append((st, lv))
                self.log.row("train", ep, st, f"{lv:.6f}", lr, f"{secs:.3f}")
            if self.bar is not None:
                self.bar.update(len(rows))
                self.bar.set_postfix(epoch=rows[-1][0], loss=f"{losses[-1]:.4f}")
