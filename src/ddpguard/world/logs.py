"""Logging with the rank on every record; ranks other than 0 quiet below WARNING."""

from __future__ import annotations

import logging
import sys

from .place import World


class _RankFilter(logging.Filter):
    def __init__(self, world: World, all_ranks: bool) -> None:
        super().__init__()
        self.rank = world.rank
        self.all_ranks = all_ranks

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        # Non-zero ranks stay quiet below WARNING unless asked: N copies of every line help nobody.
        return self.all_ranks or self.rank == 0 or record.levelno >= logging.WARNING


def setup_logging(
    world: World, level: int = logging.INFO, *, all_ranks: bool = False, name: str = "ddpguard"
) -> logging.Logger:
    """Configure logger `name` so each record carries `[rank N]`; idempotent."""
    log = logging.getLogger(name)
    log.setLevel(level)
    for h in list(log.handlers):
        if getattr(h, "_ddpguard", False):
            log.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[rank %(rank)s] %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_RankFilter(world, all_ranks))
    handler._ddpguard = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.propagate = False
    return log


def get_logger(name: str = "ddpguard") -> logging.Logger:
    return logging.getLogger(name)
