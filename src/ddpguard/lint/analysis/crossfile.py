"""The other files on the command line: resolve `from utils import save_on_master` (or
`comm.synchronize()`) to the function defined in one of them, so its schedule summary is
inlined at the call. Modules are keyed by their dotted path suffixes (`comm`, `utils.comm`,
`detectron2.utils.comm`); among several candidates the one nearest to the caller wins."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from pathlib import Path

from .context import CallRec, Func, ModuleInfo, dotted, foreign_ddp, is_collective
from .instances import method_rank_seeds
from .provenance import GLOBAL, is_predicate, key_name

# Packages that are never one of the files being linted (`torch.distributed.barrier` must
# not resolve to a project file named distributed.py).
EXTERNAL = {"torch", "numpy", "np", "os", "sys", "math", "time", "json", "logging", "pickle",
             "random", "collections", "functools", "itertools", "typing", "re", "shutil",
             "subprocess", "argparse", "copy", "pathlib", "datetime", "warnings", "tqdm",
             "torchvision", "transformers", "accelerate", "PIL", "cv2", "scipy", "sklearn",
             "yaml", "omegaconf", "hydra", "wandb", "apex", "timm", "fvcore", "iopath",
             "deepspeed", "lightning", "pytorch_lightning", "contextlib", "io", "glob"}


class FileSet:
    def __init__(self, infos: list[ModuleInfo], root: str | None = None) -> None:
        self.index: dict[str, list[ModuleInfo]] = {}
        self.multi = len(infos) > 1   # a lone file resolves nothing elsewhere
        # Some file sets the CUDA device per process (often where the group is formed).
        self.sets_device = self.multi and any(r.last == "set_device" for i in infos
                                              for r in i.calls)
        # Resolved once: path work per lookup costs more than the analysis it serves. A lone
        # file needs none (it is linted alone most of the time: `ddpguard lint train.py`).
        self.parts: dict[int, tuple[str, ...]] = {
            id(i): Path(os.path.abspath(i.path)).parts for i in infos} if self.multi else {}
        paths = [os.path.abspath(i.path) for i in infos] if self.multi else []
        # The trees are the folders just below what the command line names, not below the
        # files' common folder: a checkout whose files all sit in its package
        # (`sslsv/bin/train.py` importing `sslsv.trainer.Trainer`) is one tree, not two.
        top = os.path.commonpath(paths) if paths else "/"
        named = os.path.abspath(root) if root is not None else None
        if paths and named is not None and os.path.commonpath([top, named]) == named:
            top = named
        self.depth = len(Path(top).parts)
        # An attribute set from the rank in one file is the same flag in the others
        # (`args.should_save = ... and is_master(args)` in main.py, tested in train.py;
        # `self._primary = self._rank == 0` in a base class): each file learns the ones it
        # does not assign itself. Plain names stay local to their file.
        shared: dict[str, int] = {}
        for info in infos:
            for name, level in info.rank_names.items():
                if "." in name and name not in info.armed_flags:
                    shared.setdefault(name, level)
        self.infos = infos
        self.memo: dict[str, object] = {}   # facts of the whole set a rule reads once
        self._grouped: set[int] | None = None
        self._handed: dict[int, list[ModuleInfo]] | None = None
        for info in infos:
            if shared:
                own = info.rank_names
                for name, level in shared.items():
                    if name not in own and name not in info.assigns:
                        own[name] = level
            parts = list(Path(info.path).with_suffix("").parts) if self.multi else []
            if parts and parts[-1] == "__init__":
                parts.pop()
            for k in range(1, min(4, len(parts)) + 1):
                self.index.setdefault(".".join(parts[-k:]), []).append(info)
            info.file_set = self
        _ddp_class_aliases(self, infos)
        _constructor_wrappers(self, infos)
        _function_wrappers(self, infos)
        if self.multi:
            self._multi_node_program(infos)

    def _multi_node_program(self, infos: list[ModuleInfo]) -> None:
        """Multi-node is a fact of the program, not of the file that spells it: a trainer
        whose set-up module reads `SLURM_PROCID` or `NODE_RANK` runs on several nodes too.
        Learnt across one import, either way (the trainer imports the set-up, or a launcher
        that reads them imports the trainer)."""
        if not any(i.multi_node for i in infos):
            return
        learnt: list[ModuleInfo] = []
        for info in infos:
            for m in self.imported(info):
                if m.multi_node != info.multi_node:
                    learnt.append(info if m.multi_node else m)
        for info in learnt:
            info.multi_node = True

    def imported(self, info: ModuleInfo) -> list[ModuleInfo]:
        """The files given that `info` imports (`from a import f`, `import a.b`)."""
        plain = {a.name for n in info.tree.body if isinstance(n, ast.Import) for a in n.names}
        return [m for qual in set(info.aliases.values()) | plain
                for m in self._modules(qual, info)]

    def _same_tree(self, m: ModuleInfo, caller: ModuleInfo) -> bool:
        """Several trees on one command line (`lint repo_a/ repo_b/`): a call resolves
        within the caller's own top folder, never into a neighbour's module of that name."""
        a = self.parts.get(id(m), ())[self.depth:]
        b = self.parts.get(id(caller), ())[self.depth:]
        return len(a) < 2 or len(b) < 2 or a[0] == b[0]

    def visible(self, m: ModuleInfo, caller: ModuleInfo, name: str) -> bool:
        """`m`'s definition of `name` is the one `caller` calls: in the caller's own tree, or
        in the module the caller imports it from by a dotted name (`from models.pangu_sample
        import train` in finetune/, a sibling folder of models/ below the folder linted)."""
        if m is caller or self._same_tree(m, caller):
            return True
        qual = caller.aliases.get(name)
        return qual is not None and qual.count(".") > 1 and any(
            x is m for x in self._modules(qual.rpartition(".")[0], caller))

    def in_group(self, info: ModuleInfo) -> bool:
        """`info` runs as a group itself, or a file on the command line that does imports it
        (directly or through others): the trainer's checkpoint module, not a conversion tool
        that sits beside it."""
        if self._grouped is None:
            self._grouped = {id(i) for i in self.infos if runs_as_a_group(i)}
            todo = [i for i in self.infos if id(i) in self._grouped]
            while todo:
                caller = todo.pop()
                plain = {a.name for n in ast.walk(caller.tree) if isinstance(n, ast.Import)
                         for a in n.names}
                for qual in set(caller.aliases.values()) | plain:
                    for m in self._modules(qual, caller):
                        if id(m) not in self._grouped:
                            self._grouped.add(id(m))
                            todo.append(m)
        return id(info) in self._grouped

    def ddp_handed_in(self, info: ModuleInfo) -> list[ModuleInfo]:
        """A file on the command line wraps a model in DDP and passes the wrapper to a class or
        a module-level function that `info` defines, and no other file of the caller's tree
        defines that name (`Trainer(opts=opts, model=model)` in ml-cvnets' main_train.py, the
        class in engine/training_engine.py): `info` trains a DDP model it never wraps. Returns
        the files that hand it over."""
        if self._handed is None:
            self._handed = {}
            owners: dict[str, list[ModuleInfo]] = {}
            for i in self.infos:
                for name in i.classes:
                    owners.setdefault(name, []).append(i)
                for name, fns in i.funcs.items():
                    if any(f not in i.func_class and id(f) not in i.parents for f in fns):
                        owners.setdefault(name, []).append(i)
            for caller in self.infos:
                wrapped = caller.ddp_names() if caller.wraps_ddp else {}
                if not wrapped:
                    continue
                for rec in caller.calls_named(*(n for n in caller.call_lasts() if n in owners)):
                    target = [m for m in owners[rec.last] if self.visible(m, caller, rec.last)]
                    if len(target) == 1 and target[0] is not caller and any(
                            dotted(a) in wrapped for a in
                            (*rec.node.args, *(k.value for k in rec.node.keywords))):
                        self._handed.setdefault(id(target[0]), []).append(caller)
        return self._handed.get(id(info), [])

    def _modules(self, qual: str, caller: ModuleInfo) -> list[ModuleInfo]:
        """The files an import names: `pkg.mod` for `from pkg.mod import f` or `import
        pkg.mod`; within the caller's own tree for a bare name."""
        parts = qual.split(".")
        if parts[0] in EXTERNAL:
            return []
        for end in (len(parts), len(parts) - 1):
            for k in range(min(4, end), 0, -1):
                cands = [m for m in self.index.get(".".join(parts[end - k:end]), ())
                         if m is not caller and (k > 1 or self._same_tree(m, caller))]
                if cands:
                    return cands
        return []

    def find(self, qual: str, caller: ModuleInfo) -> tuple[ModuleInfo, Func] | None:
        module, _, name = qual.rpartition(".")
        if not module or module.split(".", 1)[0] in EXTERNAL:
            return None
        mod_parts = module.split(".")
        for k in range(min(4, len(mod_parts)), 0, -1):
            # A dotted match (`olmo.torch_util`) names the module; a bare one (`utils`) may
            # be any tree's, so it must come from the caller's own.
            cands = [m for m in self.index.get(".".join(mod_parts[-k:]), ())
                     if m is not caller and (k > 1 or self._same_tree(m, caller))]
            if not cands:
                continue
            mine = self.parts.get(id(caller), ())
            cands.sort(key=lambda m: -_common(self.parts.get(id(m), ()), mine))
            for m in cands:
                fns = [f for f in m.funcs.get(name, []) if f not in m.func_class]
                if len(fns) == 1:
                    return m, fns[0]
            return None
        return None


def imported_function(info: ModuleInfo, rec: CallRec) -> tuple[ModuleInfo, Func] | None:
    """The plain function of another file given that a call names through an import (`from
    engine import train_one_epoch`), and that file."""
    find = getattr(info.file_set, "find", None)
    qual = rec.qual or info.qualify(rec.node.func)
    return find(qual, info) if find is not None and qual else None


def _ddp_class_aliases(file_set: FileSet, infos: list[ModuleInfo]) -> None:
    """torch's wrapper under a project's own name: `DDP = DistributedDataParallel` in a module,
    called there (`DDP(model)`) or through an import of that module (`ext_dist.DDP(model)`,
    `from ext_dist import DDP`). Those calls become DistributedDataParallel calls, so every
    rule sees the wrap. A class or function of that name elsewhere is not taken for it: the
    call must name the module that made the alias."""
    owners: dict[str, set[int]] = {}
    for info in infos:
        for name, entries in info.assigns.items():
            if "." not in name and any(
                    type(v) in (ast.Name, ast.Attribute)
                    and (q := info.qualify(v) or "").rsplit(".", 1)[-1]
                    == "DistributedDataParallel" and not foreign_ddp(q)
                    for _, v in entries):
                owners.setdefault(name, set()).add(id(info))
    if not owners:
        return
    for info in infos:
        hit = False
        for rec in info.calls_named(*(n for n in owners if n in info.call_lasts())):
            mod, _, name = (info.qualify(rec.node.func) or "").rpartition(".")
            mine = owners.get(name, set())
            if (id(info) in mine and not mod) or (mod and any(
                    id(m) in mine for m in file_set._modules(mod, info))):
                rec.last = "DistributedDataParallel"
                info._last[id(rec.node)] = rec.last
                info.wraps_ddp = hit = True
        if hit:
            info._by_last.clear()
            info._memo.clear()


Seed = tuple[dict[str, int], dict[str, int], dict[str, str]]


def walk_seeds(infos: list[ModuleInfo]) -> dict[int, Seed]:
    """Per file (by id) to walk again: the rank predicates of other files it calls
    (rank_function_seeds), the names it assigns the rank (rank_name_seeds) and the names a
    `from mod import *` of a project module brings (star_seeds)."""
    funcs, names = rank_function_seeds(infos), rank_name_seeds(infos)
    stars = star_seeds(infos)
    return {k: (funcs.get(k, {}), names.get(k, {}), stars.get(k, {}))
            for k in {*funcs, *names, *stars}}


def star_seeds(infos: list[ModuleInfo]) -> dict[int, dict[str, str]]:
    """`from utils.dist_utils import *` where utils/dist_utils.py is one of the files: its
    torch imports (`from torch import distributed as dist`) and its functions are names of
    this file too, unless this file binds them itself. A package's `__init__.py` is such a
    module (`from src import *`), and the torch imports it brings by star imports of its own
    (`from .ddp_utils import *`) pass on, a few links deep."""
    edges: dict[int, list[tuple[ast.ImportFrom, ModuleInfo]]] = {}
    by_stem: dict[str, list[ModuleInfo]] | None = None
    for info in infos:
        for s in info.tree.body:
            if type(s) is not ast.ImportFrom or s.names[0].name != "*" or not s.module:
                continue
            if by_stem is None:
                by_stem = {}
                for m in infos:
                    p = Path(m.path)
                    by_stem.setdefault(p.parent.name if p.stem == "__init__" else p.stem,
                                       []).append(m)
            target = _star_target(info, s, by_stem)
            if target is not None:
                edges.setdefault(id(info), []).append((s, target))
    by_id = {id(i): i for i in infos}
    out: dict[int, dict[str, str]] = {}
    for _ in range(3):  # a chain of star imports, a few links deep
        grew = False
        for k, targets in edges.items():
            info, seed = by_id[k], out.setdefault(k, {})
            for s, m in targets:
                torch = {n: q for n, q in m.aliases.items()
                         if q.startswith(("torch", "mpi4py"))}
                for name, qual in {**out.get(id(m), {}), **torch}.items():
                    if qual.startswith(("torch", "mpi4py")) and name not in info.aliases \
                            and name not in seed:
                        seed[name] = qual
                        grew = True
                for name in m.funcs:
                    if name not in info.funcs and name not in info.aliases and any(
                            f not in m.func_class for f in m.funcs[name]) and name not in seed:
                        seed[name] = f"{s.module}.{name}"
        if not grew:
            break
    return {k: v for k, v in out.items() if v}


def _star_target(info: ModuleInfo, s: ast.ImportFrom,
                 by_stem: dict[str, list[ModuleInfo]]) -> ModuleInfo | None:
    """The file of the project that `from <s.module> import *` in `info` reads: the module's
    own file or its package's `__init__.py`, matched on the path's tail (absolute) or from
    `info`'s folder (relative)."""
    tail = (s.module or "").replace(".", "/")
    here = os.path.dirname(os.path.abspath(info.path))
    for m in by_stem.get(tail.rsplit("/", 1)[-1], ()):
        mp = os.path.abspath(m.path)[:-3]
        if mp.endswith("/__init__"):
            mp = mp[:-len("/__init__")]
        if m is not info and (mp.endswith("/" + tail) if not s.level else mp == (
                os.path.normpath(os.path.join(here, *[".."] * (s.level - 1), tail)))):
            return m
    return None


def rank_name_seeds(infos: list[ModuleInfo]) -> dict[int, dict[str, int]]:
    """The expression the program passes as `init_process_group(rank=...)` is the global rank
    wherever it is assigned: `self.gpu_rank = opt.gpu_ranks[device_id]` in the trainer, when
    the launcher forms the group with `rank=opt.gpu_ranks[device_id]` (OpenNMT)."""
    exprs = {e for i in infos for e in i.rank_exprs}
    out: dict[int, dict[str, int]] = {}
    for info in infos if exprs else ():
        for name, entries in info.assigns.items():
            if name not in info.rank_names and any(
                    type(v) in (ast.Subscript, ast.Call, ast.BinOp) and ast.dump(v) in exprs
                    for _, v in entries):
                out.setdefault(id(info), {})[name] = GLOBAL
    # A rank passed to a project class's constructor and kept on `self` (`Trainer(...,
    # device=rank)`, then `self.device = device` and `if self.device == 0:`) is the rank in
    # the class's own tests, which the walk must know to guard what they hold.
    for target, attr, level, _, _ in _constructor_ranks(infos):
        if attr not in target.rank_names:
            out.setdefault(id(target), {}).setdefault(attr, level)
    # A config key one file sets from the rank (`params['verb'] = params['world_rank'] == 0`)
    # is that flag where another file reads it (`self.verb = params['verb']`).
    keys = {k: v for i in infos for k, v in i.rank_names.items() if k.startswith("['")}
    for info in infos if keys and len(infos) > 1 else ():
        seed = {k: v for k, v in keys.items() if k not in info.rank_names}
        if not seed:
            continue
        for name, entries in info.assigns.items():
            if name in info.rank_names:
                continue
            for _, v in entries:
                if type(v) is ast.Subscript and type(v.slice) is ast.Constant \
                        and key_name(str(v.slice.value)) in seed:
                    seed[name] = seed[key_name(str(v.slice.value))]
                    break
        out.setdefault(id(info), {}).update(seed)
    return out


def _constructor_ranks(infos: list[ModuleInfo]
                       ) -> Iterator[tuple[ModuleInfo, str, int, ast.Assign, ast.expr]]:
    """(class's file, `self.x`, level, the `self.x = param` line, the caller's value) for each
    rank-derived value a call in the files passes to a project class's constructor that keeps
    it as it came: `Trainer(..., device=rank)`, or `Checkpointer(model,
    save_to_disk=comm.is_main_process())` then `self.save_to_disk = save_to_disk` and `if not
    self.save_to_disk: return`."""
    classes: dict[str, tuple[ModuleInfo, ast.FunctionDef]] = {}
    for info in infos:
        for name, cls in info.classes.items():
            init = next((f for f in cls.body if isinstance(f, ast.FunctionDef)
                         and f.name == "__init__"), None)
            if init is not None:
                classes.setdefault(name, (info, init))
    if not classes:
        return
    for info in infos:
        for rec in info.calls_named(*(n for n in info.call_lasts() if n in classes)):
            target, init = classes[rec.last]
            names = [a.arg for a in init.args.args][1:]
            passed = [*zip(names, rec.node.args, strict=False),
                      *((k.arg, k.value) for k in rec.node.keywords if k.arg is not None)]
            for param, value in passed:
                level = info.rank_level(value)
                if not level:
                    continue
                for st in init.body:
                    if isinstance(st, ast.Assign) and isinstance(st.value, ast.Name) \
                            and st.value.id == param:
                        for tgt in st.targets:
                            d = dotted(tgt)
                            if d is not None and d.startswith("self."):
                                yield target, d, level, st, value


def rank_function_seeds(infos: list[ModuleInfo]) -> dict[int, dict[str, int]]:
    """A project's own rank predicate, read where it is defined: `def main_proc(): return
    dist.get_rank() == 0` in comm.py makes `comm.main_proc()` (or `main_proc()` imported by
    name) a rank test in train.py too. Returns, per file (by id) that calls one through the
    import naming its module, the names to know before that file's walk. Names that say what
    they are (`is_main_process`) need no seed; a same-named function elsewhere is no match."""
    owners: dict[str, list[ModuleInfo]] = {}
    names: set[str] = set()
    for info in infos:
        own = {n for n in info.rank_funcs if not is_predicate(n)}
        if not own:
            continue
        names |= own
        parts = list(Path(info.path).with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts.pop()
        for k in range(1, min(4, len(parts)) + 1):
            owners.setdefault(".".join(parts[-k:]), []).append(info)
    out: dict[int, dict[str, int]] = {}
    for info in infos if names else ():
        wanted = [n for n in info.call_lasts() if n in names and n not in info.funcs]
        for rec in info.calls_named(*wanted) if wanted else ():
            mod, _, name = (info.qualify(rec.node.func) or "").rpartition(".")
            tail = mod.split(".")[-4:]
            for k in range(len(tail), 0, -1):
                cands = [m for m in owners.get(".".join(tail[-k:]), ()) if m is not info
                         and name in m.rank_funcs]
                if cands:
                    out.setdefault(id(info), {})[name] = cands[0].rank_funcs[name]
                    break
    for k, found in (method_rank_seeds(infos, names) if names else {}).items():
        for name, level in found.items():
            out.setdefault(k, {}).setdefault(name, level)
    return out


def _constructor_wrappers(file_set: FileSet, infos: list[ModuleInfo]) -> None:
    """A DDP wrapper passed to a project class's constructor and kept on `self` as it came
    (`trainer = Trainer(model, ...)` after `model = DDP(model)`; `self.model = model` in
    `Trainer.__init__`, in this file or another): `self.model` holds the wrapper in the
    class's file, so its forwards there are DDP forwards (a rank-0 `break` before the next
    epoch's forward parts the ranks). The class name must be defined once in the caller's tree,
    and the argument must be a name the caller wrapped; a bare model passed teaches nothing."""
    classes: dict[str, list[tuple[ModuleInfo, ast.FunctionDef]]] = {}
    for info in infos:
        for name, cls in info.classes.items():
            init = next((f for f in cls.body if isinstance(f, ast.FunctionDef)
                         and f.name == "__init__"), None)
            if init is not None:
                classes.setdefault(name, []).append((info, init))
    if not classes:
        return
    for info in infos:
        if not info.wraps_ddp:
            continue
        for rec in info.calls_named(*(n for n in info.call_lasts() if n in classes)):
            mine = [c for c in classes[rec.last] if file_set.visible(c[0], info, rec.last)]
            if len(mine) != 1:
                continue
            target, init = mine[0]
            names = [a.arg for a in init.args.args][1:]
            passed = [*zip(names, rec.node.args, strict=False),
                      *((k.arg, k.value) for k in rec.node.keywords if k.arg is not None)]
            for param, value in passed:
                if not info.is_ddp_call(value) and not _wrapped_before(info, value, rec):
                    continue
                for st in init.body:
                    if isinstance(st, ast.Assign) and _kept(st.value, param):
                        for tgt in st.targets:
                            d = dotted(tgt)
                            if d is not None and d.startswith("self.") and d.count(".") == 1:
                                target.handed_ddp.setdefault(d, {}).setdefault(
                                    rec.last, st.lineno)
                                target._memo.pop(("ddp_names", 0), None)


def _function_wrappers(file_set: FileSet, infos: list[ModuleInfo]) -> None:
    """A module-level function of the project whose parameter every call in the files given
    passes a DDP wrapper (`fit(model, loader)` after `model = DDP(model)`, in this file or
    another): calls of that parameter in the function are forwards of the wrapper, also when
    the function is read on its own (a rank-0 `break` in its epoch loop). Not where the
    function is named other than in a call (handed to `mp.spawn`, a callback: other callers
    out of sight), nor where one call passes something else, unpacks `*args`, or the name is
    defined twice in the caller's tree."""
    defs: dict[str, list[tuple[ModuleInfo, Func]]] = {}
    for info in infos:
        for name, fns in info.funcs.items():
            for fd in fns:
                if fd not in info.func_class and id(fd) not in info.parents:
                    defs.setdefault(name, []).append((info, fd))
    if not defs or not any(i.wraps_ddp for i in infos):
        return
    sites: dict[tuple[int, str], list[bool]] = {}
    targets: dict[int, tuple[ModuleInfo, Func]] = {}
    for info in infos:
        for rec in info.calls_named(*(n for n in info.call_lasts() if n in defs)):
            f = rec.node.func
            if not isinstance(f, ast.Name | ast.Attribute):
                continue
            mine = [d for d in defs[rec.last] if file_set.visible(d[0], info, rec.last)]
            if isinstance(f, ast.Name) and any(d[0] is info for d in mine):
                # a plain name calls this file's own definition (so-vits-svc's train.py and
                # train_diff.py each define and call their own `train_and_evaluate`)
                mine = [d for d in mine if d[0] is info]
            if len(mine) != 1:
                continue
            target, fn = mine[0]
            if isinstance(f, ast.Attribute) and target is info:
                continue  # `obj.fit(...)`: a method of something else
            names = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
            star = any(isinstance(a, ast.Starred) for a in rec.node.args) or any(
                k.arg is None for k in rec.node.keywords)
            passed = dict(zip(names, rec.node.args, strict=False))
            passed.update((k.arg, k.value) for k in rec.node.keywords if k.arg is not None)
            targets[id(fn)] = (target, fn)
            for param in names:
                value = passed.get(param)
                sites.setdefault((id(fn), param), []).append(
                    not star and value is not None and info.wraps_ddp and (
                        info.is_ddp_call(value) or _wrapped_before(info, value, rec)))
    for (key, param), wrapped in sites.items():
        if wrapped and all(wrapped):
            target, fn = targets[key]
            if not _named_elsewhere(infos, fn.name):
                target.handed_params.setdefault(key, set()).add(param)


def _named_elsewhere(infos: list[ModuleInfo], name: str) -> bool:
    """`name` is read other than as the function of a call (`mp.spawn(fit, ...)`,
    `partial(fit, ...)`, `callbacks=[fit]`) in some file."""
    for info in infos:
        called = {id(r.node.func) for r in info.calls}
        for n in ast.walk(info.tree):
            if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) \
                    and id(n) not in called:
                return True
    return False


def _kept(value: ast.expr, param: str) -> bool:
    """`value` is the parameter itself, or the parameter moved (`model.to(device)`,
    `model.cuda()`: a module's move returns that module, the wrapper itself)."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and \
            value.func.attr in ("to", "cuda"):
        value = value.func.value
    return isinstance(value, ast.Name) and value.id == param


def _wrapped_before(info: ModuleInfo, value: ast.expr, rec: CallRec) -> bool:
    """`value` holds a DDP wrapper at the call `rec`: a name the same function (or the module,
    for both) wrapped on an earlier line; an attribute wrapped anywhere in the file (it crosses
    methods). A bare model passed before the wrap, or a name of another function, does not."""
    held = dotted(value)
    if held is None or held not in info.ddp_names():
        return False
    if "." in held:
        return True
    wraps = [w.node.lineno for w in info.ddp_wraps(held)
             if w.func is rec.func and w.node.lineno < rec.node.lineno]
    if not wraps:
        return False
    # rebound between the wrap and the call (SGC-Net's `if args.distributed: model =
    # model.module` before `evaluate(model, ...)`): not the wrapper, at least on one path
    lo, hi = max(wraps), rec.node.lineno
    top = rec.func
    return not any(lo < line < hi and not info.is_ddp_call(v)
                   and (top is None or top.lineno <= line <= (top.end_lineno or line))
                   for line, v in info.assigns.get(held, ()))


_GROUP_SETUP = ("init_process_group", "init_dist", "init_distributed", "setup_dist",
                "dist_init", "distributed_init", "setup_ddp", "ddp_setup")
_GROUP_CALLS = (*_GROUP_SETUP, "spawn", "start_processes", "DistributedDataParallel", "DDP",
                "DistributedSampler")


def sets_up_group(last: str) -> bool:
    """A call that forms the process group (`init_process_group`, mmcv's `init_dist`, the
    reference scripts' `init_distributed_mode`)."""
    return last.startswith(_GROUP_SETUP) or "distributed_mode" in last


def runs_as_a_group(info: ModuleInfo) -> bool:
    """The module shows a multi-process run: it sets up a group, wraps a model, shards data or
    calls a collective. A conversion tool that only reads the rank through a copied helper
    (CenterPoint's `convert_voxelnet.py`: mmcv's `load_state_dict` prints on rank 0) runs as
    one process, and its one write is no race."""
    return any(r.last.startswith(_GROUP_CALLS) or sets_up_group(r.last) or is_collective(r)
               for r in info.calls)


def _common(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
