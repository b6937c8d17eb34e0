"""Which torch versions a project supports, read from the nearest pyproject.toml.

DDP010's advice depends on it: since torch 2.6 `torch.load` defaults to `weights_only=True`,
so a missing `weights_only` only matters where the project still supports older torch.
The floor comes from the `torch` requirement in `[project] dependencies` and from
`requires-python` (a Python that no older torch supports raises the floor).
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path
from typing import Any

Version = tuple[int, int]

# First torch release with wheels for each Python: the floor that `requires-python >= 3.X`
# implies when the dependency itself names none.
_TORCH_FOR_PYTHON: dict[Version, Version] = {(3, 11): (1, 13), (3, 12): (2, 2), (3, 13): (2, 5),
                                            (3, 14): (2, 9)}
_REQ = re.compile(r"^\s*torch(?![\w.-])\s*(?:\[[^\]]*\])?\s*(?P<spec>[^;]*)", re.I)
_LOWER = re.compile(r"(>=|~=|==|>)\s*(\d+)\.(\d+)")
_PY_LOWER = re.compile(r">=?\s*3\.(\d+)")


def toml_loads(text: str) -> dict[str, Any] | None:
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib.loads(text)
    try:  # pragma: no cover - Python 3.10 only
        import tomli
    except ImportError:  # pragma: no cover
        warnings.warn("pyproject.toml settings ignored: install `tomli` on Python 3.10",
                      stacklevel=2)
        return None
    return tomli.loads(text)  # pragma: no cover


def find_pyproject(start: Path) -> Path | None:
    start = start.resolve()
    for d in [start, *start.parents] if start.is_dir() else list(start.parents):
        candidate = d / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def torch_floor(requirements: list[str], requires_python: str | None) -> Version | None:
    """Oldest torch (major, minor) the project allows; (0, 0) when torch is unbounded below;
    None when neither the dependencies nor requires-python say anything."""
    floor: Version | None = None
    for req in requirements:
        m = _REQ.match(req)
        if m is None:
            continue  # another package (`torchvision` does not match: see _REQ)
        lows = [(int(a), int(b)) for _, a, b in _LOWER.findall(m.group("spec"))]
        floor = max(lows) if lows else (0, 0)
    if requires_python:
        m = _PY_LOWER.search(requires_python)
        if m is not None:
            py = (3, int(m.group(1)))
            implied = max((t for p, t in _TORCH_FOR_PYTHON.items() if p <= py), default=(0, 0))
            floor = max(floor or (0, 0), implied)
    return floor


def project_torch_floor(path: Path) -> Version | None:
    """`torch_floor` of the pyproject.toml nearest to `path` (None without one)."""
    pyproject = find_pyproject(path)
    if pyproject is None:
        return None
    try:
        data = toml_loads(pyproject.read_text(encoding="utf-8")) or {}
    except (OSError, ValueError):
        return None  # an unreadable pyproject must not stop the lint; the rule stays quiet
    project = data.get("project", {})
    if not isinstance(project, dict):
        return None
    deps = project.get("dependencies", [])
    deps = [d for d in deps if isinstance(d, str)] if isinstance(deps, list) else []
    rp = project.get("requires-python")
    return torch_floor(deps, rp if isinstance(rp, str) else None)
