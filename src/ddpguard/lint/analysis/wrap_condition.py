"""The condition a DDP wrap sits under, and the sites that run only where it failed.

`if num_gpus > 1: model = DDP(model)` wraps only when `num_gpus > 1` holds; a later
`model.module.state_dict() if num_gpus > 1 else model.state_dict()`, or the `else` of another
`if num_gpus > 1:`, runs only where it did not, so `model` there is the bare model. Whatever
the test is (`args.distributed`, `world_size > 1`, `len(gpus) > 1`, `ddp`), the two are matched
by their structure (`ast.dump`), never by a list of spellings:

- each arm knows its test (or the test's negation); `not F` knows `F` false, `a <= b` knows
  `a > b` false, the body of `if A and B:` knows both, the `else` of `if A or B:` neither;
- a name that one assignment in its scope gives a test (`ddp = world_size > 1`) stands also
  for that test, on both sides alike;
- the names a test reads must resolve to the same binding at both places: the same function
  (or one nested in it that does not bind them), the same class through `self`, or the
  module; and none may be assigned again between the wrap and the site.
"""

from __future__ import annotations

import ast

from .context import CallRec, Func, ModuleInfo
from .enclosing import enclosing

Fact = tuple[str, bool]  # (ast.dump of a test, the truth an arm knows it has)

# The negative comparison of each pair, and the positive one it is the negation of.
_NEGATED: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.LtE: ast.Gt, ast.Lt: ast.GtE, ast.NotEq: ast.Eq, ast.IsNot: ast.Is, ast.NotIn: ast.In}
_SELF = ("self", "cls")


def unwrapped_at(info: ModuleInfo, wrap: CallRec, site: CallRec, node: ast.AST) -> bool:
    """`node` (inside the call `site`) runs only where a condition that guards `wrap` is
    false: the arm of the same test (or of its negation) that the wrap is not in."""
    wrap_facts = _facts_around(info, wrap.func, wrap.node)
    if not wrap_facts:
        return False
    site_facts = _facts_around(info, site.func, node)
    lo, hi = sorted((wrap.node.lineno, site.node.lineno))
    for (dump, truth), test in wrap_facts.items():
        other = site_facts.get((dump, not truth))
        if other is not None and _same_bindings(info, wrap.func, test, site.func, other, lo, hi):
            return True
    return False


def _facts_around(info: ModuleInfo, func: Func | None, node: ast.AST) -> dict[Fact, ast.expr]:
    """What the `if` / conditional-expression arms around `node` (in its function) know."""
    chain = enclosing(func, info.tree, node)
    out: dict[Fact, ast.expr] = {}
    for i, n in enumerate(chain or []):
        inner = chain[i + 1] if chain and i + 1 < len(chain) else node
        if isinstance(n, ast.If):
            arm = True if any(s is inner for s in n.body) else \
                False if any(s is inner for s in n.orelse) else None
        elif isinstance(n, ast.IfExp):
            arm = True if n.body is inner else False if n.orelse is inner else None
        else:
            continue
        if arm is not None:
            _facts(info, func, n.test, arm, out, 0)
    return out


def _facts(info: ModuleInfo, func: Func | None, test: ast.expr, truth: bool,
           out: dict[Fact, ast.expr], depth: int) -> None:
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, truth = test.operand, not truth
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) == truth:
        for v in test.values:  # `A and B` true: each true; `A or B` false: each false
            _facts(info, func, v, truth, out, depth)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 \
            and type(test.ops[0]) in _NEGATED:
        flipped = ast.Compare(test.left, [_NEGATED[type(test.ops[0])]()], test.comparators)
        out.setdefault((ast.dump(flipped), not truth), test)
    else:
        out.setdefault((ast.dump(test), truth), test)
    if isinstance(test, ast.Name) and depth < 2:
        value = _single_test_value(info, func, test.id)
        if value is not None:
            _facts(info, func, value, truth, out, depth + 1)


def _single_test_value(info: ModuleInfo, func: Func | None, name: str) -> ast.expr | None:
    """The one value assigned to `name` in its scope, when it is a test (a comparison, a
    `not`, an `and` / `or`, a call): `ddp = world_size > 1`."""
    scope = _binding_scope(info, func, name)
    values = _scope_table(info, scope)[1].get(name, [])
    if len(values) != 1:
        return None
    v = values[0][1]
    return v if isinstance(v, ast.Compare | ast.BoolOp | ast.UnaryOp | ast.Call) else None


def _same_bindings(info: ModuleInfo, fa: Func | None, ta: ast.expr, fb: Func | None,
                   tb: ast.expr, lo: int, hi: int) -> bool:
    """Every name the two (equal) tests read is the same binding at both places, and none
    is assigned again between lines `lo` and `hi`."""
    for a, b in zip(_roots(ta), _roots(tb), strict=False):
        if a in _SELF:
            if fa is None or fb is None or info.func_class.get(fa) != info.func_class.get(fb):
                return False
            continue
        sa, sb = _binding_scope(info, fa, a), _binding_scope(info, fb, b)
        if sa is not sb:
            return False
        if any(lo < line < hi for line, _ in _scope_table(info, sa)[1].get(a, [])):
            return False
    return True


def _roots(test: ast.expr) -> list[str]:
    """The names a test reads, in order (`args` of `args.world_size`)."""
    return [n.id for n in ast.walk(test) if isinstance(n, ast.Name)]


def _binding_scope(info: ModuleInfo, func: Func | None, name: str) -> Func | None:
    """The function whose local `name` is at `func` (it or one enclosing it); None: global."""
    cur = func
    while cur is not None:
        params, stores = _scope_table(info, cur)
        if name in params or name in stores:
            return cur
        cur = info.parents.get(id(cur))
    return None


_Table = tuple[set[str], dict[str, list[tuple[int, ast.expr | None]]]]


def _scope_table(info: ModuleInfo, func: Func | None) -> _Table:
    """A scope's parameters, and each name it binds -> (line, value of a plain `name = v`)."""
    memo: dict[int, _Table] = info._memo.setdefault(
        ("wrap_scopes", 0), {})  # type: ignore[assignment]
    key = id(func) if func is not None else 0
    hit = memo.get(key)
    if hit is None:
        params: set[str] = set()
        if func is not None:
            a = func.args
            params = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs,
                                      *filter(None, (a.vararg, a.kwarg))]}
        stores: dict[str, list[tuple[int, ast.expr | None]]] = {}
        stack: list[ast.AST] = list(func.body if func is not None else info.tree.body)
        while stack:
            n = stack.pop()
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
                          | ast.Lambda):
                continue
            if isinstance(n, ast.Assign) and len(n.targets) == 1 \
                    and isinstance(n.targets[0], ast.Name):
                stores.setdefault(n.targets[0].id, []).append((n.lineno, n.value))
                stack.append(n.value)
                continue
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del):
                stores.setdefault(n.id, []).append((n.lineno, None))
            stack.extend(ast.iter_child_nodes(n))
        hit = memo[key] = (params, stores)
    return hit
