"""Reading small device tensors back to the host without stalling the device's queue.

A `.item()` or `.tolist()` on a CUDA tensor waits for every kernel queued before it: the CPU
stops running ahead, and the GPU then idles while the CPU prepares the next step. fit() reads
losses back every few steps (the log, the NaN check); read at once, those waits cost a small
model 7 % of its steps per second on an H200 (docs/benchmarks.md). `Readback.push` instead starts
an asynchronous copy into pinned memory and returns what earlier pushes copied, which finished
long ago; `Readback.wait_all` returns everything, waiting if it must (before a checkpoint, at
the end of an epoch). CPU tensors need no copy: a push returns them at once.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Readback", "scalars"]


def scalars(values: list[torch.Tensor]) -> torch.Tensor:
    """One 1-D float tensor of scalar (or one-element) tensors, on their device: one copy to read
    back instead of one per value."""
    return torch.stack([v.detach().float().reshape(()) for v in values])


class Readback:
    """Tagged 1-D tensors read back in push order: CPU ones at once, CUDA ones one push late."""

    def __init__(self) -> None:
        self._inflight: list[tuple[Any, torch.Tensor, Any]] = []

    def push(self, tag: Any, values: torch.Tensor) -> list[tuple[Any, list[Any]]]:
        """Start reading `values`; return (tag, values as a list) for every push that is ready:
        this one on the CPU, the earlier ones on a GPU."""
        values = values.detach()
        ready = self.wait_all()  # on a GPU, copies started a push ago: long finished, no wait
        if values.device.type != "cuda":
            return [*ready, (tag, values.tolist())]
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(values.device))  # where the copy was queued
        self._inflight.append((tag, host, event))
        return ready

    def wait_all(self) -> list[tuple[Any, list[Any]]]:
        """Everything pushed and not yet returned, in push order, waiting for the copies."""
        out = []
        for tag, host, event in self._inflight:
            event.synchronize()
            out.append((tag, host.tolist()))
        self._inflight.clear()
        return out

    def __len__(self) -> int:
        return len(self._inflight)
