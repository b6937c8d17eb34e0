"""Guard settings: a typed, validated dataclass, overridable from the environment so a launcher
(or a test) can tune a guard it does not construct itself."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

__all__ = ["GuardConfig", "EXIT_CODE", "ENV_PREFIX"]

# Distinct from Python's 1 so a job log tells "the guard stopped this" from "the script raised".
EXIT_CODE = 17
ENV_PREFIX = "DDPGUARD_"

# env var -> field; each parsed as float seconds unless noted.
_ENV_FIELDS: dict[str, str] = {
    "DDPGUARD_STALL_TIMEOUT": "stall_timeout",
    "DDPGUARD_STALL_FLOOR": "stall_floor",
    "DDPGUARD_STALL_CEILING": "stall_ceiling",
    "DDPGUARD_STALL_FACTOR": "stall_factor",
    "DDPGUARD_HEARTBEAT": "heartbeat_interval",
    "DDPGUARD_DEAD_AFTER": "dead_after",
    "DDPGUARD_DEADLOCK_FLOOR": "deadlock_floor",
    "DDPGUARD_AGREE_TIMEOUT": "agree_timeout",
    "DDPGUARD_DUMP_WAIT": "dump_wait",
    "DDPGUARD_REPORT_DIR": "report_dir",
}


@dataclasses.dataclass(frozen=True)
class GuardConfig:
    """How the run-time guard decides that training hangs.

    The stall timeout adapts: `stall_factor` x the slowest step seen so far, never below
    `stall_floor` nor above `stall_ceiling`; a fixed `stall_timeout` replaces the adaptive one.
    """

    stall_timeout: float | None = None
    stall_floor: float = 20.0
    stall_ceiling: float = 600.0
    stall_factor: float = 20.0
    # Every live rank inside a collective and none finishing: collectives are mismatched. That
    # cannot resolve itself, so it is declared sooner than a general stall: after
    # max(deadlock_floor, deadlock_factor x slowest step), capped by the stall timeout.
    deadlock_floor: float = 8.0
    deadlock_factor: float = 5.0
    heartbeat_interval: float = 0.5
    # A peer whose heartbeat has not changed for this long, and whose process is gone, is dead.
    dead_after: float = 5.0
    # How long a rank blocked in a collective waits after a peer died or exited before stopping.
    grace: float = 2.0
    # Bound on waiting for every rank's loader length at the start of an epoch.
    agree_timeout: float = 10.0
    # Bound on waiting for the other ranks' stack dumps once a stall is declared.
    dump_wait: float = 5.0
    check_lengths: bool = True
    report_dir: str | None = None
    exit_code: int = EXIT_CODE

    def __post_init__(self) -> None:
        positive = ("stall_floor", "stall_ceiling", "stall_factor", "heartbeat_interval",
                    "deadlock_floor", "deadlock_factor",
                    "dead_after", "agree_timeout", "dump_wait")
        for name in positive:
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"GuardConfig.{name} must be > 0 seconds, got {value!r}")
        if self.grace < 0:
            raise ValueError(f"GuardConfig.grace must be >= 0 seconds, got {self.grace!r}")
        if self.stall_timeout is not None and not self.stall_timeout > 0:
            raise ValueError(
                f"GuardConfig.stall_timeout must be > 0 seconds or None, got {self.stall_timeout!r}"
            )
        if self.stall_ceiling < self.stall_floor:
            raise ValueError(
                f"GuardConfig.stall_ceiling={self.stall_ceiling} is below "
                f"stall_floor={self.stall_floor}"
            )
        if not 0 < self.exit_code < 256:
            raise ValueError(f"GuardConfig.exit_code must be in 1..255, got {self.exit_code!r}")

    def timeout_for(self, max_step_s: float) -> float:
        """The stall timeout given the slowest step observed on any rank (seconds)."""
        if self.stall_timeout is not None:
            return self.stall_timeout
        return min(self.stall_ceiling, max(self.stall_floor, self.stall_factor * max_step_s))

    def deadlock_timeout_for(self, max_step_s: float) -> float:
        """How long every rank may sit in collectives with no progress before it is a deadlock."""
        return min(self.timeout_for(max_step_s),
                   max(self.deadlock_floor, self.deadlock_factor * max_step_s))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> GuardConfig:
        """Defaults, then DDPGUARD_* variables, then explicit `overrides` (which win)."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for var, name in _ENV_FIELDS.items():
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            if name == "report_dir":
                values[name] = raw
                continue
            try:
                values[name] = float(raw)
            except ValueError:
                raise ValueError(f"{var}={raw!r} is not a number of seconds") from None
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]
