"""What both samplers share: resolving (num_replicas, rank) and the self-advancing epoch."""

from __future__ import annotations

from typing import Any

from .plan import check_int

STATE_VERSION = 1


def resolve_world(num_replicas: object, rank: object) -> tuple[int, int]:
    """(num_replicas, rank): explicit ints, a World-like object, else the process group, else
    the launcher's environment (torchrun / SLURM variables), else (1, 0)."""
    if num_replicas is not None and hasattr(num_replicas, "world_size"):
        world: Any = num_replicas
        num_replicas = world.world_size
        if rank is None:
            rank = world.rank
    if num_replicas is None or rank is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            default = (dist.get_world_size(), dist.get_rank())
        else:
            # Not initialized yet (a script that builds its loaders before init_process_group)
            # or not launched at all: the launcher's variables (torchrun, SLURM) say where this
            # process is; a plain `python script.py` is (1, 0). torch raises here instead.
            from ..world import detect

            found = detect()
            default = (found.world_size, found.rank)
        if num_replicas is None:
            num_replicas = default[0]
        if rank is None:
            rank = default[1]
    w = check_int("num_replicas", num_replicas, 1)
    r = check_int("rank", rank, 0)
    if r >= w:
        raise ValueError(
            f"rank {r} is out of range for num_replicas={w}: ranks are 0..{w - 1}; pass the "
            "rank and world size of this process (or leave both None inside a process group)"
        )
    return w, r


class EpochClock:
    """The epoch of the next pass: the first __iter__ uses the starting epoch, each later one
    advances by 1, and set_epoch(e) decides the next pass (it wins over the advance).

    `start` is where the next pass begins (a resumed position); it survives set_epoch only
    when set_epoch names the epoch being resumed, so the usual
    `for epoch in range(start_epoch, n): sampler.set_epoch(epoch)` loop keeps the resume.
    """

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = check_int("epoch", epoch, 0)
        self.running = False  # a pass of `epoch` has begun
        self.start = 0

    def set_epoch(self, epoch: int) -> None:
        epoch = check_int("epoch", epoch, 0)
        if self.running or epoch != self.epoch:
            self.start = 0
        self.epoch = epoch
        self.running = False

    def begin_pass(self) -> tuple[int, int]:
        if self.running:
            self.epoch += 1
            self.start = 0
        self.running = True
        return self.epoch, self.start

    def resume(self, epoch: int, start: int) -> None:
        self.epoch = epoch
        self.start = start
        self.running = False


def consumed_in_pass(consumed: int | None, yielded: int, total: int, rank: int,
                     unit: str) -> int:
    """How much of the current pass this rank used: `consumed` when the caller knows it (a
    DataLoader prefetches, so the sampler has yielded more than training used), else what was
    yielded. Refuses more than the pass holds."""
    used = yielded if consumed is None else check_int("consumed", consumed, 0)
    if used > total:
        raise ValueError(
            f"consumed={used} on rank {rank} but this pass has only {total} {unit}: pass the "
            f"number of {unit} this rank consumed in the current pass"
        )
    return used
