"""A plain `python train.py`: one process, rank 0 of a world of one."""

from __future__ import annotations

from collections.abc import Mapping

from .place import World


class SingleProcessEnvironment:
    name = "single"

    def detected(self, env: Mapping[str, str]) -> bool:
        return True

    def world(self, env: Mapping[str, str]) -> World:
        return World()
