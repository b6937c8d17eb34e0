"""torchrun / TorchElastic (and any launcher that sets RANK and WORLD_SIZE the same way)."""

from __future__ import annotations

from collections.abc import Mapping

from .environment import int_var
from .place import DEFAULT_PORT, World


def _master_from(env: Mapping[str, str], *, world_size: int, where: str) -> tuple[str, int]:
    addr = env.get("MASTER_ADDR")
    port_raw = env.get("MASTER_PORT")
    if world_size > 1 and where == "torchrun" and (not addr or not port_raw):
        missing = [n for n in ("MASTER_ADDR", "MASTER_PORT") if not env.get(n)]
        raise ValueError(
            f"{' and '.join(missing)} not set while WORLD_SIZE={world_size}: every rank needs the "
            "address of rank 0. Launch with `ddpguard run` / torchrun, or export both."
        )
    port = int_var(env, "MASTER_PORT") if port_raw else DEFAULT_PORT
    return addr or "127.0.0.1", port


class TorchrunEnvironment:
    name = "torchrun"

    def detected(self, env: Mapping[str, str]) -> bool:
        return any(n in env for n in ("RANK", "WORLD_SIZE"))

    def world(self, env: Mapping[str, str]) -> World:
        present = [n for n in ("RANK", "WORLD_SIZE") if n in env]
        if len(present) != 2:
            names = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
            have = ", ".join(f"{n}={env[n]!r}" for n in names if n in env)
            missing = [n for n in ("RANK", "WORLD_SIZE") if n not in env]
            raise ValueError(
                f"half-set distributed environment: {have} but {' and '.join(missing)} unset. "
                "Launch with `ddpguard run` / torchrun, which sets all of them, or unset the rest."
            )
        rank = int_var(env, "RANK")
        world_size = int_var(env, "WORLD_SIZE")
        if world_size < 1:
            raise ValueError(f"WORLD_SIZE={env['WORLD_SIZE']!r} must be at least 1")
        if not 0 <= rank < world_size:
            raise ValueError(
                f"RANK={rank} is not below WORLD_SIZE={world_size}: valid ranks are "
                f"0..{world_size - 1}"
            )
        local_rank = int_var(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
        local_world_size = (
            int_var(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else world_size
        )
        if not 0 <= local_rank < local_world_size:
            raise ValueError(
                f"LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world_size}"
            )
        addr, port = _master_from(env, world_size=world_size, where="torchrun")
        agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        restarts = (
            int_var(env, "TORCHELASTIC_RESTART_COUNT")
            if env.get("TORCHELASTIC_RESTART_COUNT") else 0
        )
        return World(
            rank, world_size, local_rank, local_world_size, addr, port, "torchrun",
            agent_store=agent, restart_count=restarts,
        )
