"""One registry: each rule's code, name, severity, rationale and fix sit beside its function
(`@rule(...)` in rules_*.py); catalog.py collects them. Imports nothing from this package."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

SEVERITIES = ("error", "warning", "info")

# A rule yields (node, code, message) or, where its certainty varies per finding,
# (node, code, message, severity); a severity set in the configuration wins over both.
Hit = tuple[ast.AST, str, str] | tuple[ast.AST, str, str, str]
Check = Callable[[Any], Iterator[Hit]]


class At(ast.AST):
    """A position for a finding that is no single AST node (a divergence)."""

    _fields = ()

    def __init__(self, line: int, col: int = 0) -> None:
        super().__init__()
        self.lineno, self.col_offset = line, col


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    severity: str
    summary: str
    fix: str
    rationale: str = ""
    default: bool = True
    # Not yet proven on code nobody here wrote (a default rule needs 90 % precision on its
    # first findings in unseen code): on only with `--preview`, as ruff does.
    preview: bool = False
    check: Check | None = None

    def __call__(self, info: Any) -> Iterator[Hit]:
        if self.check is None:
            return iter(())
        return self.check(info)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    col: int
    code: str
    severity: str
    message: str
    fix: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def rule(code: str, name: str, severity: str, summary: str, fix: str, rationale: str = "",
         default: bool = True, preview: bool = False) -> Callable[[Check], Rule]:
    """Declare a rule at its function: `@rule("DDP005", "collective-divergence", ...)`."""
    if severity not in SEVERITIES:
        raise ValueError(f"{code}: severity {severity!r}")

    def wrap(fn: Check) -> Rule:
        return Rule(code, name, severity, summary, fix, rationale or (fn.__doc__ or "").strip(),
                    default, preview, fn)

    return wrap
