"""Does a script start its own ranks? Then torchrun must not start it once per rank.

`ddpguard run script.py` starts the script on every rank through torchrun. A script that calls
`torch.multiprocessing.spawn` (or `start_processes`, detectron2's `launch`, or one
`multiprocessing.Process` per rank around `init_process_group`, as PyTorch's own tutorial
does) would then run its whole launch twice: the copies fight over the script's port and the
job hangs with no word from anyone. Read from the script's syntax tree, before anything runs.
"""

from __future__ import annotations

import ast

__all__ = ["own_launch"]

_SPAWNERS = {
    "torch.multiprocessing.spawn": "torch.multiprocessing.spawn",
    "torch.multiprocessing.spawn.spawn": "torch.multiprocessing.spawn",
    "torch.multiprocessing.start_processes": "torch.multiprocessing.start_processes",
    "torch.multiprocessing.spawn.start_processes": "torch.multiprocessing.start_processes",
    "detectron2.engine.launch": "detectron2's launch()",
    "detectron2.engine.launch.launch": "detectron2's launch()",
}
# One process per rank by hand (PyTorch's own tutorial): a Process whose target forms the group.
_PROCESS = ("Process",)


def _aliases(tree: ast.AST) -> dict[str, str]:
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                    a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node: ast.AST, names: dict[str, str]) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([names.get(node.id, node.id), *reversed(parts)])


def _group_formers(tree: ast.AST, names: dict[str, str]) -> set[str]:
    """Functions of the file that call init_process_group themselves."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                isinstance(c, ast.Call)
                and (_dotted(c.func, names) or "").endswith("init_process_group")
                for c in ast.walk(node)):
            out.add(node.name)
    return out


def _target(call: ast.Call) -> str | None:
    for kw in call.keywords:
        if kw.arg == "target" and isinstance(kw.value, ast.Name):
            return kw.value.id
    return None


def own_launch(source: str) -> str | None:
    """How the script starts its own ranks ('torch.multiprocessing.spawn at line 20'), or
    None. Pure; a file that does not parse is left to Python to complain about. A process
    started for other work (a helper, a pool) is not a rank: only a Process whose target
    forms the process group counts."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    names = _aliases(tree)
    formers: set[str] | None = None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, names) or ""
        if name in _SPAWNERS:
            return f"{_SPAWNERS[name]} at line {node.lineno}"
        called = node.func.attr if isinstance(node.func, ast.Attribute) else \
            node.func.id if isinstance(node.func, ast.Name) else ""
        if called in _PROCESS and (target := _target(node)) is not None:
            formers = _group_formers(tree, names) if formers is None else formers
            if target in formers:
                return f"a Process per rank (target {target}) at line {node.lineno}"
    return None
