"""Random splits each rank draws for itself (DDP038).

torch's `random_split` without a `generator=` draws from the process's global generator, which
a fresh process seeds from the operating system's entropy; sklearn's `train_test_split`
without `random_state` (and a Hugging Face dataset's `.train_test_split()` without `seed`)
draw from NumPy's global state, seeded the same way. In a program whose ranks each run that
split, each gets its own train and validation sets unless something seeds that generator with
the same value on every rank first. The facts here are about the program (every file linted
with the split), because the seeding helper, the split and the sampler usually live in
different files."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from .callgraph import params_of, resolve
from .context import CallRec, Func, ModuleInfo, kwarg
from .provenance import NONE, combine, value_level

TORCH, NUMPY, PYTHON = "torch", "numpy", "random"

# Whose global generator a seeding call sets, by its resolved name's start. Anything else
# whose name says "seed" is taken to seed both (`seed_everything`, transformers' `set_seed`):
# a wrong guess there only keeps the rule silent.
_ONLY = (("torch.cuda.", ""), ("numpy.random.", NUMPY), ("random.", PYTHON),
         ("torch.manual_seed", TORCH), ("torch.random.manual_seed", TORCH))


@dataclass(frozen=True, slots=True)
class Split:
    rec: CallRec
    kind: str        # TORCH or NUMPY: the global generator it draws from
    spelled: str     # how the message names it


@dataclass(frozen=True, slots=True)
class Seeding:
    same_everywhere: bool       # some call seeds it with one value on every rank
    per_rank: tuple[str, ...]   # "path:line `call`" of seeds computed from the rank


def unseeded_splits(info: ModuleInfo) -> list[Split]:
    """The module's splits that draw from a global generator, run on every rank."""
    out = []
    for rec in info.calls:
        if rec.last not in ("random_split", "train_test_split"):
            continue
        kind = _kind(info, rec)
        if kind and info.effective_guard(rec) == NONE and _kept(rec):
            out.append(Split(rec, kind, ast.unparse(rec.node.func)))
    return out


# Calls that permute from a global generator: (resolved name, generator, the argument they
# shuffle in place or None when they return the permutation).
_PERMUTES = {"numpy.random.permutation": (NUMPY, None), "numpy.random.shuffle": (NUMPY, 0),
             "numpy.random.choice": (NUMPY, None), "random.shuffle": (PYTHON, 0),
             "random.sample": (PYTHON, None), "torch.randperm": (TORCH, None)}


def shuffled_splits(info: ModuleInfo) -> list[Split]:
    """An index list permuted from a global generator on every rank, then cut into the
    dataset a DistributedSampler shards, in one function (`np.random.shuffle(idx)`,
    `Subset(ds, idx[:n])`, `DistributedSampler(subset)`)."""
    out = []
    for rec in info.calls:
        if rec.func is None or rec.last not in ("permutation", "shuffle", "choice", "sample",
                                                "randperm"):
            continue
        hit = _PERMUTES.get(_qual(info, rec))
        if hit is None:
            continue
        kind, in_place = hit
        if info.effective_guard(rec) != NONE or kwarg(rec.node, "generator") is not None:
            continue
        if in_place is not None:
            arg = rec.node.args[in_place] if len(rec.node.args) > in_place else None
            start = {arg.id} if isinstance(arg, ast.Name) else set()
        else:
            start = _targets(rec.stmt) if isinstance(rec.stmt, ast.Assign) \
                and rec.stmt.value is rec.node else set()
        if start and _reaches_a_sampler(info, rec.func, start):
            out.append(Split(rec, kind, ast.unparse(rec.node.func)))
    return out


def _targets(stmt: ast.Assign) -> set[str]:
    return {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _reaches_a_sampler(info: ModuleInfo, fn: Func, names: set[str]) -> bool:
    """Some DistributedSampler in `fn` takes a value computed from `names` (followed through
    the function's assignments, in any order: a loop may assign before it reads)."""
    names = set(names)
    assigns = [n for n in ast.walk(fn) if isinstance(n, ast.Assign)]
    for _ in range(4):
        grown = {t for a in assigns if _mentions(a.value, names) for t in _targets(a)}
        if grown <= names:
            break
        names |= grown
    return any(info.is_dist_sampler(c) and any(_mentions(a, names) for a in
                                                 [*c.args, *(k.value for k in c.keywords)])
               for c in ast.walk(fn) if isinstance(c, ast.Call))


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _kind(info: ModuleInfo, rec: CallRec) -> str:
    call, qual = rec.node, _qual(info, rec)
    if rec.last == "random_split":
        if not qual.startswith("torch.utils.data") or len(call.args) > 2 \
                or not _none(kwarg(call, "generator"), missing=True):
            return ""
        return TORCH
    if qual.startswith("sklearn."):
        seed = kwarg(call, "random_state")
    elif isinstance(call.func, ast.Attribute) and resolve(info, rec) is None \
            and not qual.startswith(("sklearn", "torch", "numpy")):
        # a datasets.Dataset's method: its seed is `seed=` (or a `generator=`)
        if kwarg(call, "generator") is not None:
            return ""
        seed = kwarg(call, "seed")
    else:
        return ""
    shuffle = kwarg(call, "shuffle")
    if isinstance(shuffle, ast.Constant) and shuffle.value is False:
        return ""
    return NUMPY if _none(seed, missing=True) else ""


def _none(node: ast.expr | None, missing: bool) -> bool:
    if node is None:
        return missing
    return isinstance(node, ast.Constant) and node.value is None


def _kept(rec: CallRec) -> bool:
    """The split's parts are kept (assigned or returned), not thrown away."""
    return isinstance(rec.stmt, ast.Assign | ast.AnnAssign | ast.Return)


def shards_by_rank(infos: list[ModuleInfo]) -> bool:
    """Some file of the program builds a DistributedSampler: the ranks each take their share
    of a dataset, so they must agree on which samples it holds."""
    return any(i.is_dist_sampler(r.node) for i in infos for r in i.calls
               if r.last.endswith(("Sampler", "BatchSampler")) or r.last in i.classes)


def seeding(infos: list[ModuleInfo], kind: str) -> Seeding:
    """How the program seeds the global generator `kind` before anything draws from it (any
    call anywhere: where it runs is not followed, so a seed anywhere keeps the rule silent).
    A seed that is a parameter of its function (`def init(seed): torch.manual_seed(seed)`)
    is judged at that function's calls."""
    same, per_rank = False, []
    deferred: dict[str, list[tuple[ModuleInfo, CallRec]]] = {}
    found: list[tuple[ModuleInfo, CallRec, int | None]] = []
    for info in infos:
        for rec in info.calls:
            if "seed" not in rec.last.lower():
                continue
            if _param_args(rec):
                deferred.setdefault(rec.func.name, []).append((info, rec))  # type: ignore
                continue
            found.append((info, rec, _seeds(info, rec, kind, None, 0)))
    called: set[str] = set()
    if deferred:
        for info in infos:
            for rec in info.calls:
                if rec.last in deferred and "seed" not in rec.last.lower() \
                        and not _param_args(rec) and resolve(info, rec) is not None:
                    called.add(rec.last)
                    found.append((info, rec, _seeds(info, rec, kind, None, 0)))
    # a function no call in sight runs (`mp.spawn(main, ...)`, a library's callback): its
    # seed is judged where it stands
    found += [(info, rec, _seeds(info, rec, kind, None, 0))
              for name, recs in deferred.items() if name not in called for info, rec in recs]
    for info, rec, level in found:
        if level is None:
            continue
        if level == NONE and info.effective_guard(rec) == NONE:
            same = True
        else:
            per_rank.append(f"{info.path}:{rec.node.lineno} `{ast.unparse(rec.node)}`")
    return Seeding(same, tuple(per_rank))


def _param_args(rec: CallRec) -> bool:
    fn = rec.func
    if fn is None:
        return False
    params = params_of(fn)
    return any(isinstance(a, ast.Name) and a.id in params
               for a in [*rec.node.args, *(k.value for k in rec.node.keywords)])


# The level of each of a helper's parameters, from the call that runs it.
Bound = dict[str, int]


def _seeds(info: ModuleInfo, rec: CallRec, kind: str, bound: Bound | None,
           depth: int) -> int | None:
    """None when the call does not seed `kind`'s global generator; else the rank level of the
    value it seeds it with (`bound`: the levels of the parameters of the function it is in)."""
    qual = _qual(info, rec)
    for prefix, sets in _ONLY:
        if qual.startswith(prefix):
            return _level(info, rec, bound) if sets == kind else None
    if rec.last == "manual_seed" and isinstance(rec.node.func, ast.Attribute):
        return None  # a Generator object's own seed (`g.manual_seed(0)`), not the global one
    target = resolve(info, rec)
    if target is None:
        return _level(info, rec, bound)   # a library's seeding helper
    if depth > 2:
        return None
    m, fn = target
    inner_bound = _bind(info, rec, fn, bound)
    inner = [_seeds(m, r, kind, inner_bound, depth + 1) for r in _calls_in(m, fn)
             if "seed" in r.last.lower()]
    levels = [lv for lv in inner if lv is not None]
    return combine(*levels) if levels else None


def _bind(info: ModuleInfo, rec: CallRec, fn: Func, bound: Bound | None) -> Bound:
    names = [a.arg for a in fn.args.args]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    out = {n: NONE for n in [*names, *(a.arg for a in fn.args.kwonlyargs)]}
    for name, value in zip(names, rec.node.args, strict=False):
        out[name] = _value(info, value, bound)
    for k in rec.node.keywords:
        if k.arg in out:
            out[k.arg] = _value(info, k.value, bound)
    return out


def _value(info: ModuleInfo, node: ast.expr, bound: Bound | None) -> int:
    if bound is not None and isinstance(node, ast.Name) and node.id in bound:
        return bound[node.id]
    return value_level(info, node)


def _level(info: ModuleInfo, rec: CallRec, bound: Bound | None) -> int:
    args = [*rec.node.args, *(k.value for k in rec.node.keywords)]
    return combine(NONE, *(_value(info, a, bound) for a in args))


def _qual(info: ModuleInfo, rec: CallRec) -> str:
    """The callee's name through the imports (the walk records it only for a few calls)."""
    return rec.qual or info.qualify(rec.node.func) or ""


def _calls_in(m: ModuleInfo, fn: Func) -> list[CallRec]:
    return [r for r in m.calls if r.func is fn]
