"""This process's place in the job (`World`): plain data, validated on construction."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

DEFAULT_PORT = 29500


@dataclasses.dataclass(frozen=True)
class World:
    """This process's place in the job. Immutable: `init()` returns a copy with backend, device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    launcher: str = "single"
    # torchrun's agent already serves the store on MASTER_PORT; ranks must join it as clients.
    agent_store: bool = False
    # Which torchrun attempt this is: the agent's store outlives a failed attempt, so each
    # attempt's keys live under their own prefix or restarted ranks read dead ranks' addresses.
    restart_count: int = 0
    backend: str | None = None
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank {self.rank} is outside the world of size {self.world_size} "
                f"(valid ranks: 0..{self.world_size - 1})"
            )
        if self.local_world_size < 1:
            raise ValueError(f"local_world_size must be >= 1, got {self.local_world_size}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                f"local_rank {self.local_rank} is outside the node's {self.local_world_size} "
                f"processes (valid: 0..{self.local_world_size - 1})"
            )
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port must be in 1..65535, got {self.master_port}")

    @property
    def is_main(self) -> bool:
        """Rank 0 of the whole job: the one that writes checkpoints and logs."""
        return self.rank == 0

    @property
    def is_local_main(self) -> bool:
        """Rank 0 on this node: the one that builds per-node caches (e.g. a dataset index)."""
        return self.local_rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def num_nodes(self) -> int:
        return max(1, self.world_size // self.local_world_size)

    def print(self, *args: Any, force: bool = False, **kwargs: Any) -> None:
        """`print` on rank 0 only; `force=True` prints on every rank, prefixed with the rank."""
        if not (force or self.rank == 0):
            return
        sep = kwargs.pop("sep", " ")
        text = sep.join(str(a) for a in args)
        if force and self.world_size > 1:
            text = f"[rank {self.rank}] {text}"
        kwargs.setdefault("flush", True)
        # One write per call, so lines from different ranks do not interleave mid-line.
        print(text, **kwargs)

    def describe(self) -> str:
        return (
            f"rank {self.rank}/{self.world_size} (local {self.local_rank}/{self.local_world_size}) "
            f"via {self.launcher}, master {self.master_addr}:{self.master_port}"
            + (f", backend {self.backend}, device {self.device}" if self.backend else "")
        )


# ---------------------------------------------------------------------------------------------
# detection (pure)
