"""Every rule, in code order: the one table the engine, the CLI and SARIF read."""

from __future__ import annotations

from . import (
    rules_ckpt,
    rules_data,
    rules_epoch,
    rules_forward,
    rules_model,
    rules_rank,
    rules_step,
)
from .registry import Rule
from .source import DDP000_FIX

DDP000 = Rule("DDP000", "unreadable", "error",
              "Python cannot compile the file (syntax error, bad encoding, null bytes)",
              DDP000_FIX, "a file Python refuses is skipped by every other rule, so say why")
RULES: dict[str, Rule] = {r.code: r for r in sorted(
    [DDP000, *rules_epoch.RULES, *rules_data.RULES, *rules_ckpt.RULES,
     *rules_model.RULES, *rules_rank.RULES, *rules_step.RULES,
     *rules_forward.RULES], key=lambda r: r.code)}
