"""One pass over a module: import aliases, a symbol table of simple assignments, every call
with the rank guard and loops around it. Rules read this instead of walking the tree again,
which keeps linting within a small factor of `ast.parse` itself."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from .provenance import NONE, dotted, test_level

Func = ast.FunctionDef | ast.AsyncFunctionDef
Loop = ast.For | ast.AsyncFor | ast.While

# Guard levels (provenance.py): NONE = runs on every rank, GLOBAL = inside a branch on the
# global rank, LOCAL = inside a branch on the local rank only (every node's local rank 0).

_UNWRAP = {"enumerate", "tqdm", "iter", "zip", "islice", "list"}


def wraps_iterable(last: str) -> bool:
    """A call that iterates what it is given: enumerate, tqdm, and a project's own progress
    bar (`progress_bar(train_dataloader)`, `ProgressBar(loader)`)."""
    low = last.lower()
    return last in _UNWRAP or "progress" in low or low.endswith("bar")
COLLECTIVE_PREFIXES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                       "gather", "scatter")
COLLECTIVE_EXACT = {"barrier", "monitored_barrier", "reduce"}
# The only callees whose fully qualified name a rule reads (CallRec.qual); for the rest the
# walker skips resolving it once the module is known to be distributed.
# mpi4py's collectives (a communicator's methods): a program whose group is MPI's has these too.
MPI_COLLECTIVES = {"bcast", "Bcast", "allreduce", "Allreduce", "Reduce", "Gather", "allgather",
                   "Allgather", "Allgatherv", "Gatherv", "Scatter", "Scatterv", "alltoall",
                   "Alltoall", "Barrier", "Reduce_scatter", "exscan", "scan"}
QUALIFIED = {"save", "load", "print", *COLLECTIVE_EXACT, *MPI_COLLECTIVES}


@dataclass(slots=True)
class CallRec:
    node: ast.Call
    qual: str | None        # callee resolved through imports: torch.distributed.barrier
    last: str               # final name: barrier
    guard: int
    loops: tuple[Loop, ...]
    func: Func | None
    branch: tuple[tuple[int, int], ...] = ()   # (id(if), arm) from the function's top down
    stmt: ast.stmt | None = None               # the innermost statement holding the call
    # The name local_callees looks up (`f(...)`, `self.f(...)`): "" for none, None when not
    # recorded (then it is worked out from the node).
    callee: str | None = None


# Names that mark an evaluation sampler or loader (`val_sampler`, `test_loader`).
EVAL_HINTS = ("val", "test", "eval")


def is_optimizer_step(call: ast.Call) -> bool:
    f = call.func
    if not (isinstance(f, ast.Attribute) and f.attr == "step"):
        return False
    # `optimizer.step()`, or AMP's `scaler.step(optimizer)` / `scaler.step(optimizer=opt)`
    return any("opt" in (dotted(x) or "").lower()
               for x in [f.value, *call.args, *(k.value for k in call.keywords)])


def is_main_guard(test: ast.expr) -> bool:
    """`if __name__ == "__main__":`: the script's own run."""
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) \
        and test.left.id == "__name__"


def is_collective(rec: CallRec) -> bool:
    if rec.last in MPI_COLLECTIVES:
        return (rec.qual or "").startswith("mpi4py.")
    if not (rec.last in COLLECTIVE_EXACT or rec.last.startswith(COLLECTIVE_PREFIXES)):
        return False
    return (rec.qual or "").startswith(("torch.distributed.", "mpi4py."))


def mpi_qual(info: ModuleInfo, qual: str, last: str) -> str:
    """`comm.bcast` where `comm = MPI.COMM_WORLD` (or `self.comm = ...`) in a module that
    imports mpi4py: mpi4py's, spelled through the communicator's name."""
    if not (last in MPI_COLLECTIVES or last in COLLECTIVE_EXACT
            or last.startswith(COLLECTIVE_PREFIXES)) or qual.startswith(("torch.", "mpi4py.")) \
            or not any(v.startswith("mpi4py") for v in info.aliases.values()):
        return qual
    owner, _, method = qual.rpartition(".")
    for _, v in info.assigns.get(owner, [])[:3]:
        q = info.qualify(v.func if isinstance(v, ast.Call) else v) or ""
        if q.startswith("mpi4py."):
            return f"{q}.{method}"
    return qual


@dataclass(slots=True)
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
    subscripts: list[ast.Subscript] = field(default_factory=list)  # x[a:b:c], f(...)[i], k[7:]
    rank_names: dict[str, int] = field(default_factory=dict)   # name -> GLOBAL/LOCAL
    rank_funcs: dict[str, int] = field(default_factory=dict)
    rank_exprs: set[str] = field(default_factory=set)  # ast.dump of init_process_group(rank=)
    guarded_funcs: dict[Func, int] = field(default_factory=dict)   # function -> guard level
    func_class: dict[Func, str] = field(default_factory=dict)      # method -> its class name
    parents: dict[int, Func] = field(default_factory=dict)  # id(nested function) -> enclosing
    split_funcs: set[int] = field(default_factory=set)  # ids of functions with a rank test
    rank_ifs: list[tuple[Func | None, ast.If]] = field(default_factory=list)  # and the tests
    local_tests: bool = False         # some test reads the local rank (`local_rank == 0`)
    exit_splits: set[int] = field(default_factory=set)  # functions with an exit under one
    generators: set[int] = field(default_factory=set)   # functions that yield
    catching: set[int] = field(default_factory=set)   # functions with an `except` clause
    guarded_calls: list[CallRec] = field(default_factory=list)  # calls under a rank test
    path: str = "<string>"
    file_set: object = None            # crossfile.FileSet: the other files on the command line
    uses_cuda: bool = False
    distributed: bool = False
    multi_node: bool = False
    # Spellings one rule interprets, noted by the one walk: "no_sync" (an attribute, a call,
    # `require_backward_grad_sync = ...`; DDP013), "join" (`model.join`; DDP003), "gloo" (DDP010)
    spelled: set[str] = field(default_factory=set)
    batchnorm: bool = False
    wraps_ddp: bool = False           # some call wraps a model in DDP (is_ddp_call)
    # `self.model = model` in `__init__` where a caller passes a DDP wrapper for `model`
    # (crossfile._constructor_wrappers): name -> {class: line of that assignment}
    handed_ddp: dict[str, dict[str, int]] = field(default_factory=dict)
    # id(function) -> its parameters every call site in the files given passes a DDP wrapper
    # (crossfile._function_wrappers)
    handed_params: dict[int, set[str]] = field(default_factory=dict)
    # flags one rank class computes (armed_flags.py): read as rank tests, never shared
    armed_flags: dict[str, str] = field(default_factory=dict)   # name -> what it assumes
    # counters one class advances (armed_flags.py): name -> (the arm's test, first value)
    armed_counters: dict[str, tuple[ast.expr, int]] = field(default_factory=dict)
    has_main: bool = False            # an `if __name__ == "__main__":` block: a script
    torch_floor: tuple[int, int] | None = None   # oldest torch the project supports, if known
    _memo: dict[tuple[object, ...], object] = field(default_factory=dict, repr=False)
    _last: dict[int, str] = field(default_factory=dict, repr=False)   # callee_last cache
    _by_last: dict[str, list[int]] = field(default_factory=dict, repr=False)  # calls_named

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
        if isinstance(node, ast.IfExp):
            # `RandomSampler(d) if args.local_rank == -1 else DistributedSampler(d)`
            return [*(self.values_of(node.body, depth + 1) or [node.body]),
                    *(self.values_of(node.orelse, depth + 1) or [node.orelse])]
        d = dotted(node)
        if d is None:
            return []
        # Past a Call, the answer depends on the dotted name alone (not on which node spells
        # it): memoised by name, as every class's `self.loader` is asked for every sampler.
        key = ("values", d, depth)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._values_of(node, d, depth)
        return hit  # type: ignore[return-value]

    def _values_of(self, node: ast.AST, d: str, depth: int) -> list[ast.expr]:
        out: list[ast.expr] = []
        if d in self.assigns:
            for _, value in self.assigns[d]:
                out.extend(self.values_of(value, depth + 1) or [value])
            return out
        if isinstance(node, ast.Attribute) and f"self.{node.attr}" in self.assigns and any(
                isinstance(v, ast.Call) and self.callee_last(v) in self.classes
                for v in self.values_of(node.value, depth + 1)):
            # `trainer.dataloader` where `trainer = Trainer(cfg)` is this file's class and
            # its methods set `self.dataloader` (physicsnemo's MGNTrainer)
            for _, value in self.assigns[f"self.{node.attr}"]:
                out.extend(self.values_of(value, depth + 1) or [value])
            return out
        if isinstance(node, ast.Attribute) and node.attr in ("sampler", "batch_sampler"):
            for loader in self.values_of(node.value, depth + 1):
                if isinstance(loader, ast.Call) and self.callee_last(loader) == "DataLoader":
                    for s in loader_samplers(loader):
                        out.extend(self.values_of(s, depth + 1))
        return out

    def callee_last(self, call: ast.Call) -> str:
        hit = self._last.get(id(call))
        if hit is None:
            hit = self._last[id(call)] = self._callee_last(call)
        return hit

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
        # Memoized at every depth: `self.loader` in a module of many classes resolves to every
        # class's loader, each to every class's sampler (quadratic without the memo).
        key = ("samplers", id(node), depth)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._samplers_of(node, depth)
        return hit  # type: ignore[return-value]

    def _samplers_of(self, node: ast.AST, depth: int) -> list[ast.Call]:
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and wraps_iterable(node.func.id) and node.args:
            node = node.args[0]
        found: list[ast.Call] = []
        if depth > 3:
            return found
        if isinstance(node, ast.IfExp):
            # `sampler=DistributedSampler(ds) if ddp else None`: the distributed arm
            return [*self.samplers_of(node.body, depth + 1),
                    *self.samplers_of(node.orelse, depth + 1)]
        if not isinstance(node, ast.Call):
            # then the samplers depend on the dotted name alone (see values_of)
            d = dotted(node)
            if d is None:
                return found
            key = ("samplers_of_name", d, depth)
            hit = self._memo.get(key)
            if hit is None:
                hit = self._memo[key] = self._samplers_in(node, depth)
            return hit  # type: ignore[return-value]
        return self._samplers_in(node, depth)

    def _samplers_in(self, node: ast.AST, depth: int) -> list[ast.Call]:
        found: list[ast.Call] = []
        for v in self.values_of(node):
            if not isinstance(v, ast.Call):
                continue
            last = self.callee_last(v)
            if orders_by_sampler(last):
                for s in loader_samplers(v, first_arg=last == "BatchSampler"):
                    found.extend(self.samplers_of(s, depth + 1))
            elif wraps_iterable(last) and v.args:  # `bar = tqdm(train_loader)`
                found.extend(self.samplers_of(v.args[0], depth + 1))
            elif self.is_dist_sampler(v):
                found.append(v)
        return found

    def is_ddp_call(self, node: ast.AST) -> bool:
        """`DistributedDataParallel(...)` under any alias, or a wrapper helper such as
        yolov5's `smart_DDP(model)`."""
        if not isinstance(node, ast.Call):
            return False
        last = self.callee_last(node)
        return (last == "DistributedDataParallel" or last.endswith("_DDP")) and \
            not foreign_ddp(self.qualify(node.func))

    def ddp_names(self) -> dict[str, int]:
        """Names holding a DDP wrapper -> line where it was wrapped."""
        key = ("ddp_names", 0)
        hit = self._memo.get(key)
        if hit is None:
            out: dict[str, int] = {}
            # is_ddp_call inlined: the walker cached the callee name of every call it saw
            last_of, ddp_call = self._last, self.is_ddp_call
            for name, entries in self.assigns.items():
                for line, value in entries:
                    if type(value) is not ast.Call:
                        continue
                    last = last_of.get(id(value))
                    if ((last == "DistributedDataParallel" or last.endswith("_DDP"))
                            and ddp_call(value)) if last is not None else ddp_call(value):
                        out[name] = min(out.get(name, line), line)
            for name, by_class in self.handed_ddp.items():
                out.setdefault(name, min(by_class.values()))
            hit = self._memo[key] = out
        return hit  # type: ignore[return-value]

    def call_rec(self, node: ast.Call) -> CallRec | None:
        """The record the walker made of this call."""
        return self._by_node().get(id(node))

    def _by_node(self) -> dict[int, CallRec]:
        key = ("by_node", 0)
        by_node = self._memo.get(key)
        if by_node is None:
            by_node = self._memo[key] = {id(r.node): r for r in self.calls}
        return by_node  # type: ignore[return-value]

    def ddp_wraps(self, name: str) -> list[CallRec]:
        """The wrapping calls whose result is assigned to `name`."""
        by_node = self._by_node()
        return [by_node[id(v)] for _, v in self.assigns.get(name, [])
                if self.is_ddp_call(v) and id(v) in by_node]

    def calls_named(self, *lasts: str) -> list[CallRec]:
        """The calls whose `last` is one of `lasts`, in the order of `calls` (an index built
        once, so a rule after a few names does not scan every call)."""
        idx = self._by_last
        if not idx and self.calls:
            for i, rec in enumerate(self.calls):
                idx.setdefault(rec.last, []).append(i)
        calls = self.calls
        if len(lasts) == 1:
            return [calls[i] for i in idx.get(lasts[0], ())]
        return [calls[i] for i in sorted(i for last in set(lasts) for i in idx.get(last, ()))]

    def call_lasts(self) -> list[str]:
        """Every distinct `last` among the calls (see calls_named)."""
        if not self._by_last and self.calls:
            self.calls_named()
        return list(self._by_last)

    def local_callees(self, rec: CallRec) -> list[Func]:
        name = rec.callee
        if name is not None:
            if name:
                return self.funcs.get(name, [])
            return self.instance_methods(rec) if self.classes else []
        f = rec.node.func
        if isinstance(f, ast.Name):
            return self.funcs.get(f.id, [])
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                and f.value.id in ("self", "cls"):
            return self.funcs.get(f.attr, [])
        return []

    def instance_methods(self, rec: CallRec) -> list[Func]:
        """`trainer.save()` where `trainer = Engine(...)` and Engine is a class of this file:
        Engine's `save`."""
        f = rec.node.func
        if type(f) is not ast.Attribute or f.attr not in self.funcs \
                or type(f.value) is not ast.Name:
            return []
        key = ("instance", f.value.id, f.attr)
        hit = self._memo.get(key)
        if hit is None:
            classes = {self.callee_last(v) for _, v in self.assigns.get(f.value.id, [])
                       if isinstance(v, ast.Call)} & set(self.classes)
            hit = self._memo[key] = [fn for fn in self.funcs.get(f.attr, [])
                                     if self.func_class.get(fn) in classes] if classes else []
        return hit  # type: ignore[return-value]

    def effective_guard(self, rec: CallRec | LoopRec) -> int:
        if rec.guard:
            return rec.guard
        return self.guarded_funcs.get(rec.func, NONE) if rec.func is not None else NONE

    # -- rank conditions --------------------------------------------------------------
    def rank_level(self, node: ast.AST | None) -> int:
        """GLOBAL/LOCAL when `node` (an if-test) depends on the rank, else NONE."""
        return test_level(self, node)


# Wrappers named DistributedDataParallel that are not torch's: apex's makes no collective in
# its forward (parameters are broadcast once, gradients synced in backward hooks) and has
# no no_sync.
_FOREIGN_DDP = ("apex.", "horovod.", "paddle.", "mindspore.", "oneflow.", "jittor.")


def foreign_ddp(qual: str | None) -> bool:
    return qual is not None and qual.startswith(_FOREIGN_DDP)


def dominates(first: CallRec, later: CallRec) -> bool:
    """`first` runs before `later` on every path that reaches `later`: same function, an
    enclosing (or the same) branch, earlier line. Sibling `if`/`else` arms never dominate."""
    n = len(first.branch)
    return first.func is later.func and later.branch[:n] == first.branch \
        and first.node.lineno < later.node.lineno


def exclusive(a: CallRec, b: CallRec) -> bool:
    """`a` and `b` sit in different arms of the same `if`: one run takes only one of them."""
    if a.func is not b.func:
        return False
    for x, y in zip(a.branch, b.branch, strict=False):
        if x != y:
            return x[0] == y[0]
    return False


def orders_by_sampler(last: str) -> bool:
    """A call of this name iterates in the order of the sampler it is given: torch's
    DataLoader and BatchSampler, and a project's loader factory (`ds.get_dataloader(sampler=s,
    ...)`, Scene-Diffuser), which hands it on to one."""
    return last in ("DataLoader", "BatchSampler") or "loader" in last.lower()


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


def option_names(call: ast.Call) -> set[str]:
    """The attribute names an `add_argument(...)` call stores its value under: its `dest=`,
    else each flag without its dashes (`--master-addr` -> `master_addr`)."""
    dest = kwarg(call, "dest")
    if isinstance(dest, ast.Constant):
        return {str(dest.value)}
    return {str(a.value).lstrip("-").replace("-", "_") for a in call.args
            if isinstance(a, ast.Constant)}


def is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True
