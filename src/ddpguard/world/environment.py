"""One interface for every launcher environment, as Lightning Fabric's cluster environments:
each says whether the variables in front of it are its own and, if so, where this process
sits. Pure in the mapping it is given, so every launcher is testable in one process."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .place import World


class Environment(Protocol):
    """A launcher's view of the process environment."""

    name: str

    def detected(self, env: Mapping[str, str]) -> bool:
        """Whether `env` was set up by this launcher."""
        ...

    def world(self, env: Mapping[str, str]) -> World:
        """This process's place, from this launcher's variables; ValueError naming the variable
        when they are half-set or inconsistent."""
        ...


def int_var(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
