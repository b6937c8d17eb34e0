"""Every rule, in code order: the one table the engine, the CLI, SARIF and the docs read."""

from __future__ import annotations

from .analysis.source import DDP000_FIX
from .registry import Rule
from .rules import ALL

DDP000 = Rule("DDP000", "unreadable", "error",
              "Python cannot compile the file (syntax error, bad encoding, null bytes)",
              DDP000_FIX, "a file Python refuses is skipped by every other rule, so say why")
RULES: dict[str, Rule] = {r.code: r for r in sorted([DDP000, *ALL], key=lambda r: r.code)}
