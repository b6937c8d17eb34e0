"""DDP007 every rank writes one file.

Rank 0 and the ranks > 0 both reach a write of one path (schedule above, through callers and
other files): `torch.save`, and `pickle.dump` / `np.save*` of contents that differ per rank
(names with `local`, `shard`, `rank`, or rank-derived values; the same `params.pkl` from every
rank is a benign race, not reported). Not for per-rank paths (`f"queue{rank}.pth"`, a name
assigned `os.path.join(d, "mb" + str(args.rank))`, a loop variable over `range(rank, n,
world_size)`), also when the path is a parameter the caller fills with a per-rank path
(allennlp's `best_w{rank}.th` for sharded models), `io.BytesIO`, writes in a launch-mode arm
(`if not args.distributed:`), nor inside a helper this module never calls or passes on; and only
where every rank surely writes: a write under a rank test a class cannot decide (`if not single
and local_rank != 0: return` with an unknown first part, `if rank % 8 == 0:`) is not proven
shared. Only in a module that runs as a group (it sets one up, wraps a model, shards data or
calls a collective) or that such a file on the command line imports: a conversion tool that
reads the rank through a copied helper writes alone (CenterPoint). Not in a subcommand arm that
sets up no group while another arm of the same test does (deepmd's `change-bias`), nor in a
block that ends the process (a crash dump before `sys.exit`), nor in a method reached only from
methods nobody in the project calls (a framework hook such as HF Trainer's `_save`, which the
framework calls on the process that saves). The message names the call that runs the writing
function. Off by default: on code nobody here wrote, its 11 first findings were 0 true, 8 false
(rank flags the analysis did not follow, a function nobody calls) and 3 debatable (every rank
writing the same bytes, a branch no config reaches); `--extend-select DDP007` for a script where
ranks write different contents. Pitfall in [pitfalls.md](pitfalls.md). Fix: `if rank == 0:
torch.save(...)`, then `dist.barrier()`, or the rank in the file name.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

from ..analysis.callgraph import mode_without_group, params_of, reaches
from ..analysis.context import (
    Func,
    ModuleInfo,
    dotted,
)
from ..analysis.crossfile import runs_as_a_group
from ..analysis.projection import project
from ..analysis.ranks import OTHERS, RANK0
from ..registry import At, Hit, rule

_WRITE_HINT = {"save", "dump", "savez", "savez_compressed"}


@rule("DDP007", "shared-file-write", "warning",
      "every rank writes the same file (torch.save, pickle.dump, np.save to a path that does "
      "not depend on the rank)",
      "write on rank 0 only (then barrier), or put the rank in the file name", default=False)
def ddp007(info: ModuleInfo) -> Iterator[Hit]:
    """Rank 0 and the ranks > 0 both reach a write of one path: the writes race, and when
    the contents differ per rank (shards, per-rank state) all but one are lost."""
    if not info.distributed or not (runs_as_a_group(info) or (
            info.file_set is not None and info.file_set.in_group(info))):  # type: ignore[attr-defined]
        return
    # Only writes outside every rank branch (the walker's guards) can be reached by all
    # classes; the schedule then decides, through callers, launch-mode arms and other files.
    if not any(r.last in _WRITE_HINT and not info.effective_guard(r) for r in info.calls):
        return
    called = {id(fn) for rec in info.calls for fn in info.local_callees(rec)}
    used: tuple[set[str], set[str]] | None = None
    roots: list[Func | None] = [None, *(f for fns in info.funcs.values() for f in fns
                                        if id(f) not in called and reaches(info, id(f)))]
    done: set[int] = set()
    for root in roots:
        zero = {id(ev) for ev, *_ in project(info, root, RANK0).writes}
        if not zero:
            continue
        for ev, via, per_rank, paths in project(info, root, OTHERS).writes:
            if id(ev) not in zero or per_rank or id(ev) in done:
                continue
            lines = [ln for ln, p in zip([*via, ev.line], [*paths, ev.path or info.path],
                                         strict=False) if p == info.path]
            if mode_without_group(info, lines) or (
                    (ev.path or info.path) == info.path and _dump_on_the_way_out(info, ev.line)):
                continue
            if root is not None:
                # A helper nobody here calls runs under its caller's guard, elsewhere (also
                # when it writes through another helper: fairseq's save_ema_as_checkpoint).
                used = _referenced_names(info) if used is None else used
                # A method may be called on any object (`ckpt.save()`); a function of the
                # module only by its own name (LSGM's unused `utils.save` is no method of
                # the `writer.save()` the module calls).
                names = used[0] if root in info.func_class else used[1]
                if root.name not in names or (root in info.func_class and
                                              not _live_method_call(info, root.name, called)):
                    continue
            done.add(id(ev))
            if ev.path and ev.path != info.path and via:
                # A write in another file: reported here, at the last call of this file on the
                # way to it.
                here = max(k for k, p in enumerate(paths) if p == info.path)
                yield At(via[here]), "DDP007", (
                    f"rank 0 and the ranks > 0 all reach the {ev.op} of `{ev.text}` at "
                    f"{os.path.basename(ev.path)}:{ev.line} through this call: every rank "
                    "writes the same file at once (torn or clobbered, and only one rank's "
                    "contents survive)")
                continue
            # the call that runs the writing function (a nested helper's call, not `main()`)
            how = f" (through the call at line {via[-1]})" if via else ""
            yield At(ev.line), "DDP007", (
                f"rank 0 and the ranks > 0 all reach this {ev.op} of `{ev.text}`{how}: every "
                "rank writes the same file at once (torn or clobbered, and only one rank's "
                "contents survive)")


def _dump_on_the_way_out(info: ModuleInfo, line: int) -> bool:
    """The write sits in a block that ends the process (`if not math.isfinite(loss):
    torch.save(batch, "debug.pt"); sys.exit(1)`): a crash dump, not a checkpoint."""
    spans: list[tuple[int, int]] | None = info._memo.get(("dump_spans", 0))  # type: ignore[assignment]
    if spans is None:
        spans = info._memo[("dump_spans", 0)] = [
            (node.body[0].lineno, node.body[-1].end_lineno or 0) for node in ast.walk(info.tree)
            if isinstance(node, ast.If) and node.body and _ends_process(node.body[-1])]
    return any(first <= line <= last for first, last in spans)


def _ends_process(st: ast.stmt) -> bool:
    return isinstance(st, ast.Raise) or (
        isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)
        and (dotted(st.value.func) or "") in ("sys.exit", "exit", "os._exit", "quit"))


def _live_method_call(info: ModuleInfo, name: str, called: set[int]) -> bool:
    """Some `obj.name(...)` runs when the program's own code runs: at module level, in a
    function called in its file or passed on by its bare name, or in a method that such a
    call reaches (also from the other files on the command line). Only from inside methods
    nobody calls (RetroMAE's `save()`, which HF's Trainer calls on the process that saves),
    it runs wherever the framework calls them."""
    file_set = info.file_set
    infos = getattr(file_set, "infos", None) or [info]
    live: set[str] | None = getattr(file_set, "live_attrs", None)
    if live is None:
        live = _live_attrs(infos, {id(info): called})
        if file_set is not None:
            file_set.live_attrs = live  # type: ignore[attr-defined]
    return name in live


def _live_attrs(infos: list[ModuleInfo], known: dict[int, set[int]]) -> set[str]:
    sites: list[tuple[str, bool, str | None]] = []   # (name, live by place, enclosing method)
    for inf in infos:
        called = known.get(id(inf)) or {id(fn) for rec in inf.calls
                                         for fn in inf.local_callees(rec)}
        modules = set(inf.aliases) | {(a.asname or a.name).split(".", 1)[0] for s in
                                      inf.tree.body if isinstance(s, ast.Import)
                                      for a in s.names}
        bare = {rec.node.func.id for rec in inf.calls if isinstance(rec.node.func, ast.Name)}
        for rec in inf.calls:
            f = rec.node.func
            if not isinstance(f, ast.Attribute) or \
                    (dotted(f.value) or "").split(".", 1)[0] in modules:
                continue
            fn = rec.func
            here = fn is None or id(fn) in called or fn not in inf.func_class or fn.name in bare
            sites.append((f.attr, here, None if here or fn is None else fn.name))
    live = {n for n, here, _ in sites if here}
    for _ in range(4):
        more = {n for n, here, m in sites if not here and m in live} - live
        if not more:
            break
        live |= more
    return live


def _referenced_names(info: ModuleInfo) -> tuple[set[str], set[str]]:
    """Function names this module calls or passes on (`mp.spawn(main_worker, ...)`): every
    name, and the names used bare (a call `f(...)`, a value `f`), not as an attribute."""
    out: set[str] = set()
    bare: set[str] = set()
    for rec in info.calls:
        f = rec.node.func
        if isinstance(f, ast.Attribute):
            # a method call on an object may be this module's method (`_live_method_call`
            # then leaves out `torch.save(...)`, a module's function)
            out.add(f.attr)
        elif isinstance(f, ast.Name):
            out.add(f.id)
            bare.add(f.id)
        params = params_of(rec.func) if rec.func is not None else set()
        for a in [*rec.node.args, *(k.value for k in rec.node.keywords)]:
            name = dotted(a)
            if name is not None:
                out.add(name.rsplit(".", 1)[-1])
                # a function passed on (`mp.spawn(main_worker)`), not a variable of that
                # name (LSGM's `save` directory, a parameter)
                if isinstance(a, ast.Name) and a.id not in params and a.id not in info.assigns:
                    bare.add(a.id)
    return out, bare


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
dist.init_process_group("nccl")
torch.save(model.state_dict(), "ckpt.pt")  # every rank writes the same file
"""

RULE = ddp007
