"""The names a statement binds, read the way Python scopes them (DDP027's question: where
is a name bound, and does the rank test's arm bind it alone)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from .context import Func
from .enclosing import block_statements


def targets(st: ast.stmt) -> list[ast.expr]:
    if isinstance(st, ast.Assign):
        return st.targets
    if isinstance(st, ast.AnnAssign | ast.AugAssign) and st.value is not None:
        return [st.target]
    if isinstance(st, ast.For | ast.AsyncFor):
        return [st.target]
    if isinstance(st, ast.With | ast.AsyncWith):
        return [i.optional_vars for i in st.items if i.optional_vars is not None]
    return []


def names_of(st: ast.stmt) -> Iterator[str]:
    for t in targets(st):
        # `cfg[k] = v` and `cfg.lr = v` store into an object bound elsewhere (an imported
        # config): only a bare name (in a tuple or starred target too) is bound here.
        for n in ast.walk(t):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                yield n.id
    if isinstance(st, ast.Import | ast.ImportFrom):
        for a in st.names:
            yield (a.asname or a.name).split(".")[0]
    if isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        yield st.name
    if isinstance(st, ast.Global | ast.Nonlocal):
        yield from st.names


def names_bound(body: list[ast.stmt]) -> set[str]:
    return {n for st in block_statements(body) for n in names_of(st)}


def bindings(stmts: list[ast.stmt]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for st in stmts:
        line = 0 if isinstance(st, ast.Global | ast.Nonlocal) else st.lineno
        for n in names_of(st):
            out.setdefault(n, []).append(line)
    return out


def params(func: Func | None) -> set[str]:
    if func is None:
        return set()
    a = func.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
    return {x.arg for x in names if x is not None}


def names_in(node: ast.AST) -> set[str]:
    """Every plain name `node` reads or writes, at any depth."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def stores(node: ast.AST, name: str) -> int:
    """How many times `node` (at any depth) binds the plain name `name`: 0 where it never
    rebinds it."""
    return sum(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
               for n in ast.walk(node))
