"""The single traversal that fills a ModuleInfo (see context.py), and `build`."""

from __future__ import annotations

import ast
from typing import Any

from .armed_flags import armed_flags
from .armed_returns import armed_returns
from .context import (
    COLLECTIVE_PREFIXES,
    QUALIFIED,
    CallRec,
    Func,
    Loop,
    LoopRec,
    ModuleInfo,
    dotted,
    foreign_ddp,
    is_main_guard,
    mpi_qual,
)
from .provenance import GLOBAL, LOCAL, NONE, key_name, test_level
from .rank_functions import _flags_set_in_arms, _guard_functions, _rank_functions_first

_EXITS = (ast.Return, ast.Continue, ast.Raise, ast.Break)
_EXIT_TYPES = {ast.Return, ast.Continue, ast.Raise, ast.Break, ast.Assert}
_MULTI_NODE_STRINGS = {"RANK", "NODE_RANK", "SLURM_PROCID", "SLURM_NODEID", "GROUP_RANK",
                       "nnodes", "node_rank", "--nnodes"}
# (MASTER_ADDR is not among them: single-node scripts set it to localhost.)
_DIST_NAMES = {"DistributedDataParallel", "DistributedSampler", "init_process_group"}
# Fields that never hold child expressions (contexts, operators, identifiers): skipping them
# halves the nodes the expression walk touches.
_LEAF_FIELDS = {"ctx", "op", "ops", "id", "attr", "arg", "kind", "type_comment", "conversion",
                "is_async", "level", "format_spec"}
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
_Assign, _AnnAssign, _AugAssign, _Expr, _Return, _If = \
    ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, ast.Return, ast.If
_For, _AsyncFor, _While, _Constant = ast.For, ast.AsyncFor, ast.While, ast.Constant
_Name = ast.Name
# The expression walk's common types, as module globals (cheap to read in 3.11+, nothing to
# set up on each of its many calls)
Name, Attribute, Call, Constant, keyword = \
    ast.Name, ast.Attribute, ast.Call, ast.Constant, ast.keyword
_FunctionDef, _AsyncFunctionDef = ast.FunctionDef, ast.AsyncFunctionDef
_TryStar = getattr(ast, "TryStar", None)
_SELF = ("self", "cls")
_FLAG_LASTS = {"no_sync", "DistributedDataParallel", "cuda", "get_rank",
               "get_node_local_rank", "init_process_group"}


def _child_fields(t: type) -> tuple[str, ...]:
    fields = _CHILD_FIELDS.get(t)
    if fields is None:
        fields = _CHILD_FIELDS[t] = tuple(f for f in t._fields  # type: ignore[attr-defined]
                                          if f not in _LEAF_FIELDS)
    return fields


def _combine(outer: int, inner: int) -> int:
    if not inner:
        return outer
    if not outer:
        return inner
    return GLOBAL if GLOBAL in (outer, inner) else inner


class Walker:
    __slots__ = ("info", "guard", "loops", "func", "in_class", "branch", "cur", "cls")

    def __init__(self, info: ModuleInfo) -> None:
        self.info = info
        self.guard = NONE
        self.loops: tuple[Loop, ...] = ()
        self.func: Func | None = None
        self.in_class = False
        self.branch: tuple[tuple[int, int], ...] = ()
        self.cur: ast.stmt | None = None
        self.cls: str | None = None

    def block(self, stmts: list[ast.stmt]) -> None:
        saved = self.guard
        stmt = self.stmt
        for s in stmts:
            # The statement that holds the calls visited next (a compound statement's own
            # expressions are visited before its blocks, so no restore is needed).
            self.cur = s
            t = type(s)
            if self.guard and t in _EXIT_TYPES:  # an exit on some ranks only
                self.info.exit_splits.add(id(self.func) if self.func is not None else 0)
            stmt(s)
            # `if not is_main: return` guards everything after it in this block.
            if t is _If:
                s_if: Any = s
                if not s_if.orelse and s_if.body and isinstance(s_if.body[-1], _EXITS):
                    self.guard = _combine(self.guard, test_level(self.info, s_if.test))
        self.guard = saved

    def stmt(self, st: ast.stmt) -> None:
        info = self.info
        t = type(st)
        s: Any = st  # narrowed by `t` below (isinstance asserts cost time on every statement)
        if t is _Assign or t is _AnnAssign:
            value = s.value
            if value is None:
                return
            self.expr(value)
            targets = s.targets if t is _Assign else [s.target]
            level = test_level(info, value) if type(value) is not _Constant else NONE
            if type(value) is ast.Tuple and any(type(g) is ast.Tuple for g in targets):
                # `train_loader, val_loader = DataLoader(...), DataLoader(...)`
                for tgt in targets:
                    if type(tgt) is ast.Tuple and len(tgt.elts) == len(value.elts):
                        for el, v in zip(tgt.elts, value.elts, strict=True):
                            name = dotted(el)
                            if name is not None:
                                info.assigns.setdefault(name, []).append((s.lineno, v))
                                # `r, w = dist.get_rank(), dist.get_world_size()`
                                el_level = (test_level(info, v) if type(v) is not _Constant
                                            else NONE)
                                if el_level:
                                    info.rank_names[name] = el_level
            for tgt in targets:
                name = dotted(tgt)
                if name is not None:
                    info.assigns.setdefault(name, []).append((s.lineno, value))
                    if level:
                        info.rank_names[name] = level
                    if name.endswith(".require_backward_grad_sync"):
                        info.spelled.add("no_sync")  # nanoGPT's spelling of no_sync
                else:
                    if level and type(tgt) is ast.Subscript and type(tgt.slice) is _Constant \
                            and type(tgt.slice.value) is str:
                        # `params['verb'] = params['world_rank'] == 0`: the key is a rank
                        # flag wherever the config travels (read by key in another file)
                        info.rank_names[key_name(tgt.slice.value)] = level
                    self.expr(tgt)
        elif t is _Expr:
            if type(s.value) is not _Constant:  # docstrings mention variables freely
                self.expr(s.value)
        elif t is _Return:
            if s.value is not None:
                self.expr(s.value)
        elif t is _If:
            self.expr(s.test)
            saved = self.guard
            level = test_level(info, s.test)
            if level:
                key = id(self.func) if self.func is not None else 0
                info.split_funcs.add(key)
                info.rank_ifs.append((self.func, s))
                if level == LOCAL:
                    info.local_tests = True
            self.guard = _combine(saved, level)
            saved_branch = self.branch
            self.branch = saved_branch + ((id(s), 0),)
            self.block(s.body)
            self.branch = saved_branch + ((id(s), 1),)
            self.block(s.orelse)
            self.guard, self.branch = saved, saved_branch
            if level:
                _flags_set_in_arms(info, s, level)
            if not self.func and is_main_guard(s.test):
                info.has_main = True
        elif t is _For or t is _AsyncFor or t is _While:
            if t is _While:
                self.expr(s.test)
            else:
                self.expr(s.iter)
            info.loops.append(LoopRec(s, self.loops, self.func, self.guard))
            saved_loops = self.loops
            self.loops = saved_loops + (s,)
            self.block(s.body)
            self.loops = saved_loops
            self.block(s.orelse)
        elif t is _FunctionDef or t is _AsyncFunctionDef:
            for d in s.decorator_list:
                self.expr(d)
            info.funcs.setdefault(s.name, []).append(s)
            if self.in_class and self.cls is not None:
                info.func_class[s] = self.cls
            if len(s.body) >= 1:
                last = s.body[-1]
                if type(last) is _Return and last.value is not None:
                    level = test_level(info, last.value)
                    if level:
                        info.rank_funcs[s.name] = level
            outer = (self.guard, self.loops, self.func, self.in_class, self.branch)
            if self.func is not None:
                info.parents[id(s)] = self.func
            self.guard, self.loops, self.func, self.in_class, self.branch = NONE, (), s, False, ()
            self.block(s.body)
            self.guard, self.loops, self.func, self.in_class, self.branch = outer
        elif t is _AugAssign:
            self.expr(s.target)
            self.expr(s.value)
            if type(s.op) is ast.Div:
                info.spelled.add("/=")  # DDP044 walks its scopes only where one is spelled
        elif t is ast.ClassDef:
            info.classes[s.name] = s
            for b in s.bases:
                self.expr(b)
            saved_cls, saved_name = self.in_class, self.cls
            self.in_class, self.cls = True, s.name
            self.block(s.body)
            self.in_class, self.cls = saved_cls, saved_name
        elif t is ast.Import:
            for a in s.names:
                if a.asname:
                    info.aliases[a.asname] = a.name
                else:
                    # `import pkg.dist_util` binds `pkg`: `pkg.dist_util.f()` names a module
                    # of the project as much as `from pkg import dist_util` does
                    head = a.name.split(".", 1)[0]
                    info.aliases.setdefault(head, head)
                if a.name.startswith("torch.distributed"):
                    info.distributed = True
        elif t is ast.ImportFrom:
            mod = s.module or ""
            for a in s.names:
                info.aliases[a.asname or a.name] = f"{mod}.{a.name}"
                if a.name in _DIST_NAMES or mod.startswith("torch.distributed"):
                    info.distributed = True
        elif t is ast.With or t is ast.AsyncWith:
            for item in s.items:
                self.expr(item.context_expr)
            self.block(s.body)
        elif t is ast.Try or t is _TryStar:
            if s.handlers:
                info.catching.add(id(self.func) if self.func is not None else 0)
            self.block(s.body)
            for h in s.handlers:
                self.block(h.body)
            self.block(s.orelse)
            self.block(s.finalbody)
        else:
            for child in ast.iter_child_nodes(s):
                if isinstance(child, ast.stmt):
                    self.stmt(child)
                elif isinstance(child, ast.expr):
                    self.expr(child)

    def expr(self, root: ast.AST) -> None:
        if type(root) is _Name:  # nothing to record (a test or an argument `x`)
            return
        info = self.info
        stack: list[ast.AST | None] = [root]
        pop, push, extend = stack.pop, stack.append, stack.extend
        calls, last_memo, aliases = info.calls, info._last, info.aliases
        while stack:
            node = pop()
            t = type(node)
            # The most common types first, their children pushed directly (the same order
            # as the generic field loop below: fields in order, lists left to right).
            if t is Name:
                continue
            if t is Attribute:
                # Down the chain `a.b.c` at once: the value would be popped next anyway.
                while True:
                    attr = node.attr  # type: ignore[union-attr]
                    if attr == "cuda":
                        info.uses_cuda = True
                    elif attr[0] == "B" and attr.startswith("BatchNorm"):
                        info.batchnorm = True
                    elif attr == "join" and _model_like(node.value):  # type: ignore[union-attr]
                        info.spelled.add("join")
                    elif attr == "no_sync":
                        # also where it is not called here: `ctx = model.no_sync if micro
                        # else nullcontext`, then `with ctx():` (SAM-Med3D)
                        info.spelled.add("no_sync")
                    node = node.value  # type: ignore[union-attr]
                    t = type(node)
                    if t is not Attribute:
                        break
                if t is not Name:
                    push(node)
                continue
            if t is Call:
                f = node.func  # type: ignore[union-attr]
                ft = type(f)
                # ModuleInfo.callee_last, its cache filled here (the first time it is asked),
                # and the name ModuleInfo.local_callees looks up
                if ft is Attribute:
                    last = f.attr
                    fv = f.value
                    callee = last if type(fv) is Name and fv.id in _SELF else ""
                elif ft is Name:
                    callee = f.id
                    q = aliases.get(callee)
                    last = callee if q is None else q.rsplit(".", 1)[-1]
                else:
                    last = callee = ""
                known = last_memo.get(id(node))
                if known is None:
                    last_memo[id(node)] = last
                else:  # asked before the walk came here (a function's returned value)
                    last = known
                qual = info.qualify(f) if not info.distributed or last in QUALIFIED \
                    or last.startswith(COLLECTIVE_PREFIXES) else None
                if qual is not None:  # `comm.bcast` where `comm = MPI.COMM_WORLD`
                    qual = mpi_qual(info, qual, last)
                rec = CallRec(node, qual, last, self.guard, self.loops,  # type: ignore[arg-type]
                              self.func, self.branch, self.cur, callee)
                calls.append(rec)
                if self.guard:
                    info.guarded_calls.append(rec)
                if not info.distributed and (
                        last in _DIST_NAMES or (qual or "").startswith("torch.distributed")):
                    info.distributed = True
                if last in _FLAG_LASTS:
                    if last == "no_sync":
                        info.spelled.add("no_sync")
                    elif last == "DistributedDataParallel":
                        # the same test as ModuleInfo.is_ddp_call
                        info.wraps_ddp = info.wraps_ddp or not foreign_ddp(info.qualify(f))
                    elif last == "cuda":
                        info.uses_cuda = True
                    elif last == "init_process_group":
                        # `init_process_group(..., rank=proc_id)`: that name is the global
                        # rank (dgl's `if proc_id == 0:` guards a save).
                        for k in node.keywords:  # type: ignore[union-attr]
                            d = dotted(k.value) if k.arg == "rank" else None
                            if d is not None and d not in info.rank_names:
                                info.rank_names[d] = GLOBAL
                            elif d is None and k.arg == "rank":
                                # `rank=opt.gpu_ranks[device_id]`: what is assigned the same
                                # expression (here or in another file) is the rank too
                                info.rank_exprs.add(ast.dump(k.value))
                    else:  # get_rank, get_node_local_rank
                        info.multi_node = True
                elif last.endswith("_DDP"):
                    info.wraps_ddp = True
                elif last.startswith("BatchNorm"):
                    info.batchnorm = True
                if ft is not Name:
                    push(f)
                extend(node.args)  # type: ignore[union-attr]
                extend(node.keywords)  # type: ignore[union-attr]
                continue
            if t is Constant:
                v = node.value  # type: ignore[union-attr]
                if type(v) is str and len(v) < 200:
                    if "NCCL_" in v:
                        info.nccl_strings.append(node)  # type: ignore[arg-type]
                    elif v in _MULTI_NODE_STRINGS:
                        info.multi_node = True
                        info.spelled.add(v)  # RANK: DDP032/DDP033 look further only then
                    elif v in ("cuda", "nccl"):
                        info.uses_cuda = True
                    elif v == "gloo":
                        info.spelled.add("gloo")
                    elif v == "LOCAL_RANK":
                        info.distributed = True
                        info.spelled.add(v)
                    elif v in ("MASTER_ADDR", "WORLD_SIZE"):
                        info.spelled.add(v)
                continue
            if t is keyword:
                push(node.value)  # type: ignore[union-attr]
                continue
            if node is None:  # Dict keys for `**x`, absent Slice bounds, kw_defaults
                continue
            if t is ast.Subscript:
                sl = node.slice  # type: ignore[attr-defined]
                if (type(sl) is ast.Slice and (sl.step is not None or (
                        # `k[7:]`: a state_dict key stripped of `module.` (DDP008)
                        type(sl.lower) is Constant and sl.lower.value == 7))) \
                        or type(node.value) is Call:  # type: ignore[attr-defined]
                    info.subscripts.append(node)  # type: ignore[arg-type]
            elif t is ast.Yield or t is ast.YieldFrom:
                info.generators.add(id(self.func) if self.func is not None else 0)
            fields = _CHILD_FIELDS.get(t)
            if fields is None:  # () is a valid entry: test for None
                fields = _child_fields(t)
            # Past the leaf fields and Constant (handled above), a child field of an
            # expression holds a node, a list of nodes, or None: no isinstance needed.
            for name in fields:
                v = getattr(node, name, None)
                if type(v) is list:
                    extend(v)
                elif v is not None:
                    push(v)


_NAME = ast.Name


def _model_like(node: ast.expr) -> bool:
    """`model.join` / `self.ddp_model.join`: DDP's context for uneven inputs, not str.join or
    os.path.join."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id \
        if isinstance(node, ast.Name) else ""
    return any(h in name.lower() for h in ("model", "ddp", "net"))


def build(tree: ast.Module, path: str = "<string>",
          seed: tuple[dict[str, int], dict[str, int], dict[str, str]] | None = None) -> ModuleInfo:
    """One walk over `tree`, then the functions' guard levels. `seed`: what other files tell
    this one (crossfile.walk_seeds: rank predicates, rank expressions, star imports)."""
    info = ModuleInfo(tree, path=path)
    walker = Walker(info)
    if seed is not None:
        info.rank_funcs.update(seed[0])
        info.rank_names.update(seed[1])
        info.aliases.update(seed[2])
    _rank_functions_first(info, tree.body)
    # What that look-ahead cached was read before the imports were: read it again.
    info._memo.clear()
    info._last.clear()
    walker.block(tree.body)
    learnt = armed_flags(info)
    learnt.update(armed_returns(info))
    if learnt and not (seed is not None and learnt.keys() <= seed[1].keys()):
        # the flags' tests are rank tests: walk again knowing them (what guards what)
        names = {**(seed[1] if seed is not None else {}), **learnt}
        return build(tree, path, (seed[0] if seed else {}, names, seed[2] if seed else {}))
    _guard_functions(info)
    return info


