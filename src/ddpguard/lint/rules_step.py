"""Step rules: how many steps each rank takes (DDP004), and whether a step syncs the
gradients every micro-step (DDP013; DDP024, a step that never syncs them, is
rules_forward.py)."""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator

from .callgraph import is_collective
from .context import CallRec, Func, Loop, ModuleInfo, dotted, exclusive, kwarg
from .registry import Hit, rule

_COMPS = (ast.GeneratorExp, ast.ListComp, ast.SetComp)
# Names of the number of micro-steps per optimizer step.
_ACCUM = re.compile(r"accum|grad(ient)?_interval|update_freq")


def _returns_none(fn: Func) -> ast.AST | None:
    """A `return None` (or a bare `return`): that batch is None on one rank. A collate_fn
    that only filters samples out (`[b for b in batch if b is not None]`, `filter(...)`)
    makes a smaller batch, not fewer steps: every rank still gets one batch per index the
    sampler yields (DeCLIP's and deepmd's collate functions, issue 20 round 10)."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and (
                node.value is None or (isinstance(node.value, ast.Constant)
                                       and node.value.value is None)):
            return node
    return None


def _empty_test(test: ast.expr, names: set[str]) -> bool:
    # `any(len(t) < 1 for t in targets)` tests the batch's items (maskrcnn-benchmark)
    names = names | {n.id for c in ast.walk(test) if isinstance(c, _COMPS) for g in c.generators
                     if isinstance(g.iter, ast.Name) and g.iter.id in names
                     for n in ast.walk(g.target) if isinstance(n, ast.Name)}
    for node in ast.walk(test):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) \
                and node.left.id in names and any(
                    isinstance(c, ast.Constant) and c.value in (None, 0)
                    for c in node.comparators):
            return True
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) \
                and isinstance(node.operand, ast.Name) and node.operand.id in names:
            return True
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) \
                and isinstance(node.left.func, ast.Name) and node.left.func.id == "len" \
                and node.left.args and isinstance(node.left.args[0], ast.Name) \
                and node.left.args[0].id in names:
            return True
    return False


@rule('DDP004', 'rank-dependent-step-count', 'error',
      'a collate_fn can return None, or a training loop skips empty/None batches, on one '
      'rank only',
      'never return None from collate_fn; resample in the Dataset instead')
def ddp004(info: ModuleInfo) -> Iterator[Hit]:
    """A step one rank skips pairs every later all-reduce with the wrong step and ends in a
    hang. Only where the module runs with other ranks: it uses torch.distributed, or a file
    on the command line that forms the group imports it (a single-process script may skip
    what it likes)."""
    if not info.distributed and not (info.project is not None
                                     and info.project.in_group(info)):  # type: ignore[attr-defined]
        return
    for rec in info.calls:
        if rec.last != "DataLoader":
            continue
        collate = kwarg(rec.node, "collate_fn")
        if isinstance(collate, ast.Name):
            for fn in info.funcs.get(collate.id, []):
                bad = _returns_none(fn)
                if bad is not None:
                    yield bad, "DDP004", (f"collate_fn {fn.name}() can return None: a rank "
                                          "that skips that batch does one step fewer than "
                                          "the others")
    for lrec in info.loops:
        node = lrec.node
        if isinstance(node, ast.While):
            continue
        skips = [s for s in node.body if isinstance(s, ast.If) and any(
            isinstance(b, ast.Continue | ast.Break) for b in s.body)]
        if not skips or not _batch_loop(info, node.iter) or not _steps_together(info, node):
            continue
        target = node.target
        if isinstance(node.iter, ast.Call) and isinstance(node.iter.func, ast.Name) and \
                node.iter.func.id == "enumerate" and isinstance(target, ast.Tuple) and \
                len(target.elts) == 2:
            target = target.elts[1]  # `for i, batch in enumerate(...)`: `i == 0` is no batch
        names = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        for s in skips:
            if _empty_test(s.test, names):
                yield s, "DDP004", ("loop skips an empty/None batch with continue/break: ranks "
                                    "do different numbers of steps and DDP's all-reduce hangs")
                continue
            loss = _local_nonfinite(info, node, s)
            if loss is not None:
                how = "leaves the loop" if any(isinstance(b, ast.Break) for b in s.body) \
                    else "skips the step"
                yield s, "DDP004", (
                    f"a rank whose own `{loss}` is not finite {how} while the others go on: "
                    "the loss is this rank's alone (no collective reached it), so the ranks do "
                    "different numbers of steps and DDP's all-reduce hangs; all_reduce the "
                    "flag first so that every rank decides alike")


def _steps_together(info: ModuleInfo, loop: Loop) -> bool:
    """The loop body syncs the ranks every step: a backward (DDP's gradient all-reduce), an
    optimizer step or a collective, in the loop or in a function of this file it calls. A
    skipped batch in an evaluation loop under no_grad (DiffSinger's `if batch is None:
    continue` before a forward) makes no rank wait: DDP broadcasts buffers only on the first
    forward after training, which every rank makes."""
    def syncs(rec: CallRec) -> bool:
        return rec.last in ("backward", "step") or is_collective(rec)

    seen: set[int] = set()
    todo = [r for r in info.calls if loop in r.loops]
    for depth in range(3):
        nxt: list[CallRec] = []
        for rec in todo:
            if syncs(rec):
                return True
            for fn in info.local_callees(rec) if depth < 2 else ():
                if id(fn) not in seen:
                    seen.add(id(fn))
                    nxt.extend(r for r in info.calls if r.func is fn)
        todo = nxt
    return False


def _batch_loop(info: ModuleInfo, it: ast.expr) -> bool:
    """A loop over a DataLoader (or something named like one), not `kwargs.items()`."""
    while isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.args \
            and it.func.id in ("enumerate", "tqdm", "iter", "zip"):
        it = it.args[0]
    if any(isinstance(v, ast.Call) and info.callee_last(v) == "DataLoader"
           for v in info.values_of(it)):
        return True
    name = (dotted(it) or "").rsplit(".", 1)[-1].lower()
    return "loader" in name or name in ("batches", "data_iter", "train_iter", "dl") \
        or name.endswith("_dl")


_NONFINITE = {"isnan", "isinf", "isfinite"}
_SHARED = ("reduce", "gather", "sync", "broadcast")


def _local_nonfinite(info: ModuleInfo, loop: Loop, skip: ast.If) -> str | None:
    """`if torch.isnan(loss): break` (or `not math.isfinite(loss.item())`: continue) on a
    loss this rank computed from its own batch: the test is the rank's own, unlike a value
    that went through a collective or a helper that reduces it first (`reduce_mean(loss)`)
    before the test; then every rank decides alike (MoRec's NaN break, issue 20 round 12)."""
    tested = [n for c in ast.walk(skip.test) if isinstance(c, ast.Call)
              and info.callee_last(c) in _NONFINITE for a in c.args for n in ast.walk(a)
              if isinstance(n, ast.Name) and "loss" in n.id.lower()]
    if not tested:
        return None
    before = [r for r in info.calls if loop in r.loops and r.node.lineno < skip.lineno]
    if any(is_collective(r) or any(w in r.last.lower() for w in _SHARED) for r in before):
        return None
    return tested[0].id



@rule('DDP013', 'accumulation-without-no-sync', 'warning',
      'gradient accumulation on a DDP model without no_sync',
      'wrap the micro-steps in `with model.no_sync():`')
def ddp013(info: ModuleInfo) -> Iterator[Hit]:
    """Every micro-step's backward all-reduces the gradients, though only the last one's
    sum is used: (k-1)/k of the gradient traffic is wasted. The module wraps the model in
    DDP itself, or another file on the command line hands it the wrapper
    (`Trainer(model=ddp_model)`); neither uses `no_sync`. Other files of the repository
    may (a repository of independent scripts, one of which accumulates with no_sync)."""
    if info.no_sync:
        return
    origin = ""
    if not info.wraps_ddp:
        givers = _handed_a_wrapper(info)
        if not givers or any(g.no_sync for g in givers):
            return
        g = givers[0]
        origin = (f" (the DDP wrapper comes from {os.path.basename(g.path)}:"
                  f"{min(g.ddp_names().values())})")
    for rec in info.calls_named("step"):
        if is_optimizer_step(rec.node) \
                and any(_unstepped_backward(info, c, rec) for c in _accumulating_ifs(info, rec)) \
                and not _wrapped_only_in_another_mode(info, rec.node):
            yield rec.node, "DDP013", (
                "the optimizer steps once every few iterations but every "
                f"micro-step's backward all-reduces the gradients anyway{origin}: wrap the "
                "micro-steps in model.no_sync()")
            return


def _handed_a_wrapper(info: ModuleInfo) -> list[ModuleInfo]:
    """The files on the command line that pass this module a DDP wrapper they made."""
    project = info.project
    return project.ddp_handed_in(info) if project is not None else []  # type: ignore[attr-defined]


def _accumulating_ifs(info: ModuleInfo, rec: CallRec) -> list[ast.If]:
    """The `if`s whose bodies hold this call and whose tests count micro-steps, innermost
    first: in Swin's `if ACCUMULATION_STEPS > 1: ... if (idx + 1) % ACCUMULATION_STEPS == 0:
    step` the backward is inside the outer one, outside the inner one."""
    arms = [key for key, arm in rec.branch if arm == 0]
    if not arms:
        return []
    ifs = {id(n): n for n in _enclosing_ifs(rec.func or info.tree, rec.node.lineno)}
    return [ifs[k] for k in reversed(arms) if k in ifs and _accumulates(ifs[k].test)]


def _enclosing_ifs(scope: ast.AST, line: int) -> list[ast.If]:
    """The `if` statements around `line`, found by descending only into the statements whose
    lines hold it (a walk of the whole function for every step call cost more than DDP013)."""
    out: list[ast.If] = []
    node: ast.AST | None = scope
    while node is not None:
        inner = None
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt) and \
                    child.lineno <= line <= (child.end_lineno or child.lineno):
                inner = child
                break
        if isinstance(inner, ast.If):
            out.append(inner)
        node = inner
    return out


def _unstepped_backward(info: ModuleInfo, cond: ast.If, rec: CallRec) -> bool:
    """Accumulation means backward passes that no step follows: on the path of this `if`
    (not in a sibling arm), a backward runs every iteration outside it and no optimizer step
    does. The iteration is the innermost loop around the step, or, with no loop, one call of
    the function (ddpm-torch's `step(x, global_steps)`, called once per batch). A GAN's
    generator every few discriminator steps (`d_loss.backward(); opt_d.step()`, then `if i %
    n_critic == 0: g_loss.backward(); opt_g.step()`) steps after every backward."""
    inside = {id(n) for n in ast.walk(cond)}
    if rec.loops:
        loop = rec.loops[-1]
        scope = [r for r in info.calls if loop in r.loops]
    else:
        scope = [r for r in info.calls if r.func is rec.func and not r.loops]
    outside = [r for r in scope if id(r.node) not in inside and not exclusive(r, rec)]
    return any(r.last == "backward" for r in outside) and \
        not any(is_optimizer_step(r.node) for r in outside)


def _wrapped_only_in_another_mode(info: ModuleInfo, step: ast.Call) -> bool:
    """Every DDP wrap sits in the arm of a flag test (`if configs.only_eval: DDP(...) else:
    FSDP(...)`) opposite to the one the training loop runs under (`if not
    configs.only_eval:`): the model that accumulates is not the DDP one (coconut)."""
    rec = info.call_rec(step)
    if rec is None or not rec.branch:  # the step runs in every mode
        return False
    wraps = [w for name in info.ddp_names() for w in info.ddp_wraps(name)]
    if not wraps or not all(w.branch for w in wraps):
        return False
    ifs: dict[int, ast.If] = {}
    for fn in {id(r.func): r.func for r in (rec, *wraps)}.values():
        ifs.update((id(n), n) for n in ast.walk(fn if fn is not None else info.tree)
                   if isinstance(n, ast.If))

    def modes(r: CallRec) -> set[tuple[str, bool]]:
        out = set()
        for key, arm in r.branch:
            node = ifs.get(key)
            if node is None or info.rank_level(node.test):
                continue
            test, on = node.test, arm == 0
            while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                test, on = test.operand, not on
            name = dotted(test)
            if name is not None:
                out.add((name, on))
        return out
    mine = modes(rec)
    return all(any((name, not on) in mine for name, on in modes(w)) for w in wraps)


def _accumulates(test: ast.expr) -> bool:
    """`(i + 1) % k == 0`, or a counter compared with the number of micro-steps:
    `ni - last_opt_step >= accumulate`, `batch_id - start_id + 1 == gradient_interval`
    (torchdrug)."""
    for n in ast.walk(test):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod):
            return True
        if isinstance(n, ast.Compare) \
                and any(isinstance(op, ast.GtE | ast.Gt | ast.Eq) for op in n.ops) \
                and any(_ACCUM.search((dotted(x) or "").lower())
                        for x in [n.left, *n.comparators]):
            return True
    return False


def is_optimizer_step(call: ast.Call) -> bool:
    f = call.func
    if not (isinstance(f, ast.Attribute) and f.attr == "step"):
        return False
    # `optimizer.step()`, or AMP's `scaler.step(optimizer)` / `scaler.step(optimizer=opt)`
    return any("opt" in (dotted(x) or "").lower()
               for x in [f.value, *call.args, *(k.value for k in call.keywords)])


RULES = [ddp004, ddp013]
