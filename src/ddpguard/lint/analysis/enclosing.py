"""The statements around one node, for the few rules that ask about a handful of calls (an
explicit search from the function's top, not a parent map of every node)."""

from __future__ import annotations

import ast

from .context import Func

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def enclosing(func: Func | None, tree: ast.Module, node: ast.AST) -> list[ast.AST] | None:
    """The nodes enclosing `node` inside its function (outermost first), None if not found."""
    stack: list[tuple[ast.AST, list[ast.AST]]] = [
        (st, []) for st in (func.body if func is not None else tree.body)]
    while stack:
        cur, up = stack.pop()
        if cur is node:
            return up
        if isinstance(cur, _SCOPES):
            continue
        down = [*up, cur]
        stack.extend((child, down) for child in ast.iter_child_nodes(cur))
    return None


def dead(chain: list[ast.AST], node: ast.AST) -> bool:
    """`node` sits in an arm that a constant test never takes (`if 0:`, `if False:`, the
    `else` of `if True:`)."""
    for i, n in enumerate(chain):
        if isinstance(n, ast.If) and isinstance(n.test, ast.Constant):
            inner = chain[i + 1] if i + 1 < len(chain) else node
            taken = n.body if n.test.value else n.orelse
            if inner not in taken:
                return True
    return False
