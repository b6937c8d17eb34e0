"""Guard settings: a typed, validated dataclass, overridable from the environment so a launcher
(or a test) can tune a guard it does not construct itself."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

__all__ = ["GuardConfig", "EXIT_CODE", "ENV_PREFIX", "ENV_FIELDS"]

# Distinct from Python's 1 so a job log tells "the guard stopped this" from "the script raised".
EXIT_CODE = 17
ENV_PREFIX = "DDPGUARD_"

# env var -> field; each parsed as float seconds unless noted.
ENV_FIELDS: dict[str, str] = {
    "DDPGUARD_STALL_TIMEOUT": "stall_timeout",
    "DDPGUARD_NO_LIFE": "no_life",
    "DDPGUARD_NOTICE_AFTER": "notice_after",
    "DDPGUARD_SETTLE": "settle",
    "DDPGUARD_GRACE": "grace",
    "DDPGUARD_HEARTBEAT": "heartbeat_interval",
    "DDPGUARD_DEAD_AFTER": "dead_after",
    "DDPGUARD_FALLBACK_DEADLOCK": "fallback_deadlock",
    "DDPGUARD_DIGEST_INTERVAL": "digest_interval",
    "DDPGUARD_DUMP_WAIT": "dump_wait",
    "DDPGUARD_CHECK_LENGTHS": "check_lengths",
    "DDPGUARD_LEDGER": "ledger",
    "DDPGUARD_REPORT_DIR": "report_dir",
}
_BOOLS = {"check_lengths", "ledger"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclasses.dataclass(frozen=True)
class GuardConfig:
    """When the run-time guard stops a job (docs/guard.md says it in full).

    It stops on proof: ranks pending on different collectives at the same sequence number,
    every rank blocked with none able to move, a rank waiting on a peer that exited or died,
    a rank that ran out of batches leaving the others in a collective it will not join, or a
    desync in the ledgers (different loader lengths alone are a notice).
    Those need `settle` seconds of a rank sitting still to count as blocked, plus `grace` for
    a gone peer. It stops on a stall only when the rank the others wait for has shown no sign
    of life for `no_life` seconds; `stall_timeout` is an optional hard limit on any wait.
    """

    # Optional hard limit (s) on how long any rank may wait in a collective; None: no limit.
    stall_timeout: float | None = None
    # A rank others wait for, with no sign of life for this long (s), is stuck.
    no_life: float = 45.0
    # A first notice (one line) about a slow but working rank after this many seconds of
    # waiting, then after 2x, 4x, ...
    notice_after: float = 60.0
    # A rank pending in a collective, with its ledger and signs of life unchanged for this
    # long, counts as blocked.
    settle: float = 1.0
    # How long a blocked rank waits after a peer left before stopping.
    grace: float = 1.0
    heartbeat_interval: float = 0.5
    # A peer on another host whose heartbeat has not changed for this long is dead (on the
    # same host, its pid says so at once).
    dead_after: float = 10.0
    # Without the flight recorder: every rank blocked, silent, for this long is a deadlock.
    fallback_deadlock: float = 15.0
    # How often rank 0 compares every rank's recent collectives for a desync.
    digest_interval: float = 2.0
    # Bound on waiting for the other ranks' stack dumps once the job is being stopped.
    dump_wait: float = 5.0
    check_lengths: bool = True
    # Read the flight recorder (torch's collective ledger) when torch has it.
    ledger: bool = True
    report_dir: str | None = None
    exit_code: int = EXIT_CODE

    def __post_init__(self) -> None:
        positive = ("no_life", "notice_after", "settle", "heartbeat_interval", "dead_after",
                    "fallback_deadlock", "digest_interval", "dump_wait")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"GuardConfig.{name} must be > 0 seconds, got {value!r}")
        if not isinstance(self.grace, int | float) or self.grace < 0:
            raise ValueError(f"GuardConfig.grace must be >= 0 seconds, got {self.grace!r}")
        if self.stall_timeout is not None and not self.stall_timeout > 0:
            raise ValueError(
                f"GuardConfig.stall_timeout must be > 0 seconds or None, got {self.stall_timeout!r}"
            )
        if self.settle < self.heartbeat_interval:
            raise ValueError(
                f"GuardConfig.settle={self.settle} is shorter than heartbeat_interval="
                f"{self.heartbeat_interval}: a rank could never be seen sitting still"
            )
        if not 0 < self.exit_code < 256:
            raise ValueError(f"GuardConfig.exit_code must be in 1..255, got {self.exit_code!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> GuardConfig:
        """Defaults, then DDPGUARD_* variables, then explicit `overrides` (which win)."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for var, name in ENV_FIELDS.items():
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            if name == "report_dir":
                values[name] = raw
            elif name in _BOOLS:
                low = raw.strip().lower()
                if low not in _TRUE | _FALSE:
                    raise ValueError(f"{var}={raw!r} is not one of 1/0, true/false, on/off")
                values[name] = low in _TRUE
            else:
                try:
                    values[name] = float(raw)
                except ValueError:
                    raise ValueError(f"{var}={raw!r} is not a number of seconds") from None
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]
