"""Whether a module-level function of a script can run at all, asked only of the few places a
rule reports (a finding in code that never runs is false, whatever the rule).

Dead, for this question: every reference to the function in its own file is a call in an arm
no run takes (`if False:`, or the `else` of `if args.distill:` after `assert args.distill`,
new-vrwkv's shadowed `main()`), or, in a script linted with other files, nothing refers to it
at all; and no other file given imports its module and names it.
A lone file gives no view of its importers, so a function it never names stays alive there.
"""

from __future__ import annotations

import ast
import os

from .context import ModuleInfo
from .enclosing import block_statements, dead, enclosing


def dead_lines(info: ModuleInfo, lines: set[int]) -> set[int]:
    """Those of `lines` (a file's findings) inside a module-level function that never runs
    (see the module's docstring)."""
    others = getattr(info.file_set, "infos", [info])
    # A cheap gate first: a function is dead only through a dead arm of the module's own code
    # or, in a script linted with other files, by being unnamed.
    if not (info.has_main and len(others) > 1) and not any(
            type(st) is ast.Assert or (type(st) is ast.If and type(st.test) is ast.Constant)
            for st in block_statements(info.tree.body)):
        return set()
    if info.calls_named("globals") or any(
            not r.node.args for r in info.calls_named("Fire", "vars", "locals")):
        return set()   # functions looked up by name at run time (`fire.Fire()`, `globals()[x]`)
    out: set[int] = set()
    for st in info.tree.body:
        if type(st) is not ast.FunctionDef or st.decorator_list:
            continue   # a decorator registers or wraps it: called out of sight
        inside = {n for n in lines if st.lineno <= n <= (st.end_lineno or st.lineno)}
        if inside and _dead(info, st, others):
            out |= inside
    return out


def _dead(info: ModuleInfo, fn: ast.FunctionDef, others: list[ModuleInfo]) -> bool:
    # The calls index first: most functions holding a finding are called from another
    # function (live, whatever that one's fate), and then no tree is walked.
    calls = info.calls_named(fn.name)
    if any(r.func is not None for r in calls) or not all(_dead_at(info, r.node) for r in calls):
        return False
    if not calls and not (info.has_main and len(others) > 1):
        return False   # never called, but a lone file shows none of its importers
    refs = [n for n in ast.walk(info.tree) if _names(n, fn.name)]
    if not all(_dead_call(info, n) for n in refs):
        return False
    stem = os.path.splitext(os.path.basename(info.path))[0]
    return not any(_named_in(o, stem, fn.name) for o in others if o is not info)


def _names(node: ast.AST, name: str) -> bool:
    return (type(node) is ast.Name and node.id == name) or (
        type(node) is ast.Constant and node.value == name)


def _dead_call(info: ModuleInfo, ref: ast.AST) -> bool:
    """`ref` is the callee of a call that sits in a dead arm at module level."""
    call = next((c for c in ast.walk(info.tree) if type(c) is ast.Call and c.func is ref),
                None)
    return call is not None and _dead_at(info, call)


def _dead_at(info: ModuleInfo, call: ast.Call) -> bool:
    chain = enclosing(None, info.tree, call)
    return chain is not None and (dead(chain, call) or _asserted_away(info, chain, call))


def _asserted_away(info: ModuleInfo, chain: list[ast.AST], node: ast.AST) -> bool:
    """`node` sits in the `else` of `if X:` where the same block asserted `X` first (or in
    the body where it asserted `not X`)."""
    for i, n in enumerate(chain):
        if not isinstance(n, ast.If):
            continue
        inner = chain[i + 1] if i + 1 < len(chain) else node
        parent = chain[i - 1] if i else None
        block = _block_of(parent, n) if parent is not None else info.tree.body
        test = ast.dump(n.test)
        for st in block[:block.index(n)] if n in block else []:
            if not isinstance(st, ast.Assert):
                continue
            said = st.test
            negated = isinstance(said, ast.UnaryOp) and isinstance(said.op, ast.Not)
            if ast.dump(said.operand if negated else said) != test:  # type: ignore[attr-defined]
                continue
            if (inner in n.orelse) != negated:
                return True
    return False


def _block_of(parent: ast.AST, st: ast.stmt) -> list[ast.stmt]:
    for name in ("body", "orelse", "finalbody"):
        block = getattr(parent, name, None)
        if isinstance(block, list) and st in block:
            return block
    return []


def _named_in(other: ModuleInfo, stem: str, name: str) -> bool:
    """Another file imports the function's module (by its file name: `from distill_main
    import main`, `import distill_main`, `from . import distill_main`, or the name as a string
    for importlib) and names `name` in any form: its own `main()` is not this one."""
    names = False
    imports = False
    for n in ast.walk(other.tree):
        t = type(n)
        if t is ast.ImportFrom and (n.module or "").rsplit(".", 1)[-1] == stem:  # type: ignore[attr-defined]
            imports = True
        elif t is ast.alias:
            last = n.name.rsplit(".", 1)[-1]  # type: ignore[attr-defined]
            imports = imports or last == stem
            names = names or name in (last, n.asname)  # type: ignore[attr-defined]
        elif t is ast.Constant:
            imports = imports or n.value == stem  # type: ignore[attr-defined]
            names = names or n.value == name  # type: ignore[attr-defined]
        elif (t is ast.Name and n.id == name) or (t is ast.Attribute and n.attr == name):  # type: ignore[attr-defined]
            names = True
        if imports and names:
            return True
    return False
