"""The guard package's modules import each other without cycles (type-checking imports
included), the live watchdog imports nothing of the after-the-fact rendering, and no module
of the package imports the monitor back."""

from __future__ import annotations

import ast
from pathlib import Path

GUARD = Path(__file__).resolve().parents[2] / "src" / "ddpguard" / "guard"


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in GUARD.glob("*.py"):
        mod = path.stem
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    deps.add(node.module.split(".")[0])
                else:
                    deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "ddpguard.guard."):
                deps.add(node.module.split(".")[2])
        graph[mod] = {d for d in deps if (GUARD / f"{d}.py").exists()} - {mod}
    return graph


def test_no_import_cycles_inside_the_guard():
    graph = _imports()
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m: str, path: list[str]) -> bool:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycle.extend(path[path.index(d):] + [m, d] if d in path else [m, d])
                return True
            if d not in state and visit(d, path + [m]):
                return True
        state[m] = 2
        return False

    for m in sorted(graph):
        if m not in state and visit(m, []):
            break
    assert not cycle, " -> ".join(cycle)


def test_nothing_imports_the_monitor_back_and_rendering_stays_out():
    graph = _imports()
    back = sorted(m for m, deps in graph.items() if "monitor" in deps and m != "__init__"
                  and m != "bootstrap")
    assert back == [], back
    for path in GUARD.glob("*.py"):
        text = path.read_text()
        assert "ddpguard.reporting" not in text and "from ..reporting" not in text, path.name
