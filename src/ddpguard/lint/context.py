"""One pass over a module: import aliases, a symbol table of simple assignments, every call
with the rank guard and loops around it. Rules read this instead of walking the tree again,
which keeps linting within a small factor of `ast.parse` itself."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

Func = ast.FunctionDef | ast.AsyncFunctionDef
Loop = ast.For | ast.AsyncFor | ast.While

# Guard levels: 0 = runs on every rank, 1 = inside a branch on the global rank,
# 2 = inside a branch on the local rank only (every node's local rank 0 takes it).
NONE, GLOBAL, LOCAL = 0, 1, 2

_RANK_ATTRS = {"rank", "global_rank", "local_rank", "node_rank", "process_index",
               "local_process_index", "gpu"}
_RANK_PREDICATES = {"is_main_process", "is_master", "is_main", "is_rank_zero", "is_rank0",
                    "is_global_zero", "is_local_main", "is_local_main_process",
                    "is_local_master", "is_world_process_zero", "is_local_process_zero"}
_LOCAL_HINTS = ("local",)
_UNWRAP = {"enumerate", "tqdm", "iter", "zip", "islice", "list"}


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


@dataclass
class CallRec:
    node: ast.Call
    qual: str | None        # callee resolved through imports: torch.distributed.barrier
    last: str               # final name: barrier
    guard: int
    loops: tuple[Loop, ...]
    func: Func | None


@dataclass
class LoopRec:
    node: Loop
    loops: tuple[Loop, ...]  # enclosing loops, outermost first
    func: Func | None
    guard: int


@dataclass
class ModuleInfo:
    tree: ast.Module
    aliases: dict[str, str] = field(default_factory=dict)
    assigns: dict[str, list[tuple[int, ast.expr]]] = field(default_factory=dict)
    calls: list[CallRec] = field(default_factory=list)
    loops: list[LoopRec] = field(default_factory=list)
    funcs: dict[str, list[Func]] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    nccl_strings: list[ast.Constant] = field(default_factory=list)
    rank_names: dict[str, int] = field(default_factory=dict)   # name -> GLOBAL/LOCAL
    rank_funcs: dict[str, int] = field(default_factory=dict)
    guarded_funcs: set[Func] = field(default_factory=set)
    no_sync: bool = False
    uses_cuda: bool = False
    distributed: bool = False
    multi_node: bool = False
    batchnorm: bool = False
    _memo: dict[tuple[str, int], object] = field(default_factory=dict, repr=False)

    # -- name resolution -------------------------------------------------------------
    def qualify(self, node: ast.AST) -> str | None:
        d = dotted(node)
        if d is None:
            return None
        head, _, rest = d.partition(".")
        if head in self.aliases:
            return self.aliases[head] + ("." + rest if rest else "")
        return d

    def values_of(self, node: ast.AST, depth: int = 0) -> list[ast.expr]:
        """Expressions `node` may hold, following simple assignments and `x.sampler`."""
        if depth > 5:
            return []
        if isinstance(node, ast.Call):
            return [node]
        d = dotted(node)
        if d is None:
            return []
        out: list[ast.expr] = []
        if d in self.assigns:
            for _, value in self.assigns[d]:
                out.extend(self.values_of(value, depth + 1) or [value])
            return out
        if isinstance(node, ast.Attribute) and node.attr in ("sampler", "batch_sampler"):
            for loader in self.values_of(node.value, depth + 1):
                if isinstance(loader, ast.Call) and self.callee_last(loader) == "DataLoader":
                    for s in loader_samplers(loader):
                        out.extend(self.values_of(s, depth + 1))
        return out

    def callee_last(self, call: ast.Call) -> str:
        key = ("last", id(call))
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._callee_last(call)
        return hit  # type: ignore[return-value]

    def _callee_last(self, call: ast.Call) -> str:
        f = call.func
        if isinstance(f, ast.Attribute):
            return f.attr
        if isinstance(f, ast.Name):
            q = self.aliases.get(f.id, f.id)
            return q.rsplit(".", 1)[-1]
        return ""

    def is_dist_sampler(self, call: ast.expr) -> bool:
        if not isinstance(call, ast.Call):
            return False
        last = self.callee_last(call)
        if last.endswith(("DistributedSampler", "DistributedBatchSampler")):
            return True
        cls = self.classes.get(last)
        if cls is None:
            return False
        return any((dotted(b) or "").endswith("DistributedSampler") for b in cls.bases) or any(
            isinstance(s, ast.FunctionDef) and s.name == "set_epoch" for s in cls.body)

    def samplers_of(self, node: ast.AST, depth: int = 0) -> list[ast.Call]:
        """Distributed samplers behind a loader/sampler expression (loop iterables unwrapped)."""
        key = ("samplers", id(node))
        if depth == 0 and key in self._memo:
            return self._memo[key]  # type: ignore[return-value]
        result = self._samplers_of(node, depth)
        if depth == 0:
            self._memo[key] = result
        return result

    def _samplers_of(self, node: ast.AST, depth: int) -> list[ast.Call]:
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in _UNWRAP and node.args:
            node = node.args[0]
        found: list[ast.Call] = []
        if depth > 3:
            return found
        for v in self.values_of(node):
            if not isinstance(v, ast.Call):
                continue
            last = self.callee_last(v)
            if last in ("DataLoader", "BatchSampler"):
                for s in loader_samplers(v, first_arg=last == "BatchSampler"):
                    found.extend(self.samplers_of(s, depth + 1))
            elif self.is_dist_sampler(v):
                found.append(v)
        return found

    def is_ddp_value(self, node: ast.AST) -> bool:
        return any(isinstance(v, ast.Call) and self.callee_last(v) == "DistributedDataParallel"
                   for v in self.values_of(node))

    def ddp_names(self) -> dict[str, int]:
        """Names holding a DDP wrapper -> line where it was wrapped."""
        out: dict[str, int] = {}
        for name, entries in self.assigns.items():
            for line, value in entries:
                if isinstance(value, ast.Call) and \
                        self.callee_last(value) == "DistributedDataParallel":
                    out[name] = min(out.get(name, line), line)
        return out

    def local_callees(self, rec: CallRec) -> list[Func]:
        f = rec.node.func
        if isinstance(f, ast.Name):
            return self.funcs.get(f.id, [])
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                and f.value.id in ("self", "cls"):
            return self.funcs.get(f.attr, [])
        return []

    def effective_guard(self, rec: CallRec | LoopRec) -> int:
        if rec.guard:
            return rec.guard
        return GLOBAL if rec.func is not None and rec.func in self.guarded_funcs else NONE

    # -- rank conditions --------------------------------------------------------------
    def rank_level(self, node: ast.AST | None) -> int:
        """GLOBAL/LOCAL when `node` (an if-test) depends on the rank, else NONE."""
        if node is None:
            return NONE
        if isinstance(node, ast.BoolOp):
            levels = [self.rank_level(v) for v in node.values]
            return GLOBAL if GLOBAL in levels else max(levels)
        if isinstance(node, ast.UnaryOp):
            return self.rank_level(node.operand)
        if isinstance(node, ast.Compare):
            consts = [c for c in [node.left, *node.comparators] if not _rank_expr(self, c)]
            # `local_rank != -1` tells distributed from not; it does not split the ranks.
            if all(_is_minus_one(c) for c in consts) and consts:
                return NONE
            levels = [_rank_expr(self, c) for c in [node.left, *node.comparators]]
            return GLOBAL if GLOBAL in levels else max(levels)
        return _rank_expr(self, node)


def _is_minus_one(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return isinstance(node.operand, ast.Constant) and node.operand.value == 1
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return bool(node.elts) and all(_is_minus_one(e) for e in node.elts)
    return False


def _rank_expr(info: ModuleInfo, node: ast.AST) -> int:
    if isinstance(node, ast.Call):
        last = info.callee_last(node)
        if last in ("get_rank", "get_global_rank", "get_node_local_rank"):
            return LOCAL if "local" in last else GLOBAL
        if last in _RANK_PREDICATES or last in info.rank_funcs:
            return LOCAL if "local" in last else info.rank_funcs.get(last, GLOBAL)
        if last == "int" and node.args:
            return _rank_expr(info, node.args[0])
        if last in ("get", "getenv") and node.args and isinstance(node.args[0], ast.Constant):
            return _env_rank(node.args[0].value)
        return NONE
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return _env_rank(node.slice.value)
    d = dotted(node)
    if d is None:
        return NONE
    if d in info.rank_names:
        return info.rank_names[d]
    last = d.rsplit(".", 1)[-1]
    if last in _RANK_ATTRS or last in _RANK_PREDICATES:
        return LOCAL if last.startswith(_LOCAL_HINTS) or last == "gpu" else GLOBAL
    return NONE


def _env_rank(key: object) -> int:
    if key in ("RANK", "SLURM_PROCID"):
        return GLOBAL
    if key in ("LOCAL_RANK", "SLURM_LOCALID"):
        return LOCAL
    return NONE


def loader_samplers(call: ast.Call, first_arg: bool = False) -> list[ast.expr]:
    out = [k.value for k in call.keywords if k.arg in ("sampler", "batch_sampler")]
    if first_arg and call.args:
        out.append(call.args[0])
    return out


def kwarg(call: ast.Call, name: str) -> ast.expr | None:
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def build(tree: ast.Module) -> ModuleInfo:
    from .walker import Walker

    info = ModuleInfo(tree)
    Walker(info).block(tree.body)
    _guard_functions(info)
    return info


def _guard_functions(info: ModuleInfo) -> None:
    """A function every call site of which is rank-guarded runs under that guard."""
    sites: dict[Func, list[CallRec]] = {}
    for rec in info.calls:
        for fn in info.local_callees(rec):
            sites.setdefault(fn, []).append(rec)
    for fns in info.funcs.values():
        for fn in fns:
            if any("rank_zero" in (dotted(d.func if isinstance(d, ast.Call) else d) or "")
                   for d in fn.decorator_list):
                info.guarded_funcs.add(fn)
    for _ in range(3):
        changed = False
        for fn, recs in sites.items():
            if fn not in info.guarded_funcs and all(info.effective_guard(r) for r in recs):
                info.guarded_funcs.add(fn)
                changed = True
        if not changed:
            break
