"""The synthetic classification data the training benchmarks share (overhead.py, gpu.py): fixed
random features and labels, drawn once from seed 0, served one sample at a time like a map-style
dataset, so the loader does real per-sample work on both sides of a comparison."""

from __future__ import annotations

import torch


class Classification(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, n: int, dim: int, classes: int = 10) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, classes, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]
