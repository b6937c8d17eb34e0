"""`[tool.ddpguard.lint]` from the nearest pyproject.toml."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .engine import Selection
from .pyproject import find_pyproject, toml_loads


def _codes(table: dict[str, Any], key: str, source: Path) -> tuple[str, ...]:
    value = table.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{source}: [tool.ddpguard.lint] {key} must be a list of codes, "
                         f"got {value!r}")
    return tuple(v.upper() for v in value)


def load_selection(start: Path, select: tuple[str, ...] = (), ignore: tuple[str, ...] = (),
                   extend_select: tuple[str, ...] = (), preview: bool = False) -> Selection:
    """Command-line codes override the file's select; ignores add up; `--preview` or the
    file's `preview = true` turns the preview rules on."""
    table: dict[str, Any] = {}
    path = find_pyproject(start)
    if path is not None:
        data = toml_loads(path.read_text(encoding="utf-8")) or {}
        table = data.get("tool", {}).get("ddpguard", {}).get("lint", {})
    if not isinstance(table, dict):
        raise ValueError(f"{path}: [tool.ddpguard.lint] must be a table")
    src = path or start
    severity = table.get("severity", {})
    if not isinstance(severity, dict):
        raise ValueError(f"{src}: [tool.ddpguard.lint] severity must be a table of CODE = level")
    file_preview = table.get("preview", False)
    if not isinstance(file_preview, bool):
        raise ValueError(f"{src}: [tool.ddpguard.lint] preview must be true or false, "
                         f"got {file_preview!r}")
    return Selection(
        preview=preview or file_preview,
        select=select or _codes(table, "select", src),
        ignore=(*_codes(table, "ignore", src), *ignore),
        extend_select=(*_codes(table, "extend-select", src), *extend_select),
        severity={k.upper(): str(v) for k, v in severity.items()},
    )
