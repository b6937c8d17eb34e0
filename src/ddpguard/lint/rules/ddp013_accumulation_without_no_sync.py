"""DDP013 accumulation without no_sync.

`optimizer.step()` (or AMP's `scaler.step(optimizer)`) under `if (i + 1) % k == 0` or a counter
such as `if ni - last_opt_step >= accumulate`, in a module that wraps in DDP (also via helpers
named `*_DDP`), with neither `no_sync` (called, or bound to a name: `ctx = model.no_sync if
micro else nullcontext`) nor `require_backward_grad_sync` in the step's function, the functions
it calls or those that call it (another loop of the file using no_sync says nothing about this
one), and with a backward on the
same path outside that `if` that no optimizer step follows: every micro-step all-reduces for
nothing. A GAN's generator stepping every few discriminator steps is no accumulation (each
backward is followed by its own step). Nor when every DDP wrap sits in the arm of a flag
opposite to the one the accumulating loop runs under (`if configs.only_eval: DDP(...) else:
FSDP(...)`, then `if not configs.only_eval:` train). Pitfall in [pitfalls.md](pitfalls.md).
Also: a micro-step counter compared with `==` (`if batch_id - start_id + 1 ==
gradient_interval:`, torchdrug; names with `accum`, `grad_interval`, `gradient_interval` or
`update_freq`), accumulation in a method called once per batch rather than in a loop (`def
step(self, x, global_steps): ... loss.backward(); if global_steps % self.num_accum == 0:
self.optimizer.step()`, ddpm-torch, HF's distiller), `scaler.step(optimizer=...)` by keyword,
and a module that never wraps the model itself but gets the wrapper from another file on the
command line: that file wraps in DDP and passes the wrapper to a class or function the module
defines, a name no other file of its tree defines (`Trainer(opts=opts, model=model)` in
ml-cvnets' `main_train.py`, the loop in `engine/training_engine.py`). Then `no_sync` in either
file is enough; in the other files of a repository of independent scripts it says nothing about
this one. Fix: `with model.no_sync():` on micro-steps.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator

from ..analysis.context import (
    CallRec,
    ModuleInfo,
    dotted,
    exclusive,
    is_optimizer_step,
)
from ..registry import Hit, rule

# Names of the number of micro-steps per optimizer step.
_ACCUM = re.compile(r"accum|grad(ient)?_interval|update_freq")


@rule('DDP013', 'accumulation-without-no-sync', 'warning',
      'gradient accumulation on a DDP model without no_sync',
      'wrap the micro-steps in `with model.no_sync():`')
def ddp013(info: ModuleInfo) -> Iterator[Hit]:
    """Every micro-step's backward all-reduces the gradients, though only the last one's
    sum is used: (k-1)/k of the gradient traffic is wasted. The module wraps the model in
    DDP itself, or another file on the command line hands it the wrapper
    (`Trainer(model=ddp_model)`); neither uses `no_sync`. Other files of the repository
    may (a repository of independent scripts, one of which accumulates with no_sync)."""
    origin = ""
    if not info.wraps_ddp:
        givers = _handed_a_wrapper(info)
        if not givers or any("no_sync" in g.spelled for g in givers):
            return
        g = givers[0]
        origin = (f" (the DDP wrapper comes from {os.path.basename(g.path)}:"
                  f"{min(g.ddp_names().values())})")
    for rec in info.calls_named("step"):
        if is_optimizer_step(rec.node) and not _uses_no_sync(info, rec) \
                and any(_unstepped_backward(info, c, rec) for c in _accumulating_ifs(info, rec)) \
                and not _wrapped_only_in_another_mode(info, rec.node):
            yield rec.node, "DDP013", (
                "the optimizer steps once every few iterations but every "
                f"micro-step's backward all-reduces the gradients anyway{origin}: wrap the "
                "micro-steps in model.no_sync()")
            return


def _uses_no_sync(info: ModuleInfo, step: CallRec) -> bool:
    """The loop of this step uses `no_sync`: the function that holds the step, a function it
    calls or one that calls it (a trainer's `train_epoch` around `with model.no_sync():
    self.training_step(b)`) spells it: called, bound to a name (`ctx = model.no_sync if micro
    else nullcontext`, SAM-Med3D; also an attribute set elsewhere, `self.ctx =
    model.no_sync`), or nanoGPT's `require_backward_grad_sync = ...`. A module with two loops,
    one of them with no_sync, says nothing about the other."""
    if "no_sync" not in info.spelled:
        return False
    func = step.func
    if func is None:
        return True  # a script's top level: the module is the loop's whole program
    key = ("DDP013 no_sync", id(func))
    hit = info._memo.get(key)
    if hit is None:
        near = {id(func)}
        callers = {id(r.func) for r in info.calls if r.func is not None
                   and func in info.local_callees(r)}
        callees = {id(f) for r in info.calls if r.func is func for f in info.local_callees(r)}
        near |= callers | callees
        scopes = [f for fns in info.funcs.values() for f in fns if id(f) in near]
        hit = info._memo[key] = any(_spells_no_sync(info, f) for f in scopes)
    return bool(hit)


def _spells_no_sync(info: ModuleInfo, func: ast.AST) -> bool:
    for n in ast.walk(func):
        name = n.attr if isinstance(n, ast.Attribute) else n.id if isinstance(n, ast.Name) \
            else ""
        if name in ("no_sync", "require_backward_grad_sync"):
            return True
        d = dotted(n) if name else None
        if d is not None and any(
                isinstance(a, ast.Attribute) and a.attr == "no_sync"
                for _, v in info.assigns.get(d, [])[:3] for a in ast.walk(v)):
            return True
    return False


def _handed_a_wrapper(info: ModuleInfo) -> list[ModuleInfo]:
    """The files on the command line that pass this module a DDP wrapper they made."""
    file_set = info.file_set
    return file_set.ddp_handed_in(info) if file_set is not None else []  # type: ignore[attr-defined]


def _accumulating_ifs(info: ModuleInfo, rec: CallRec) -> list[ast.If]:
    """The `if`s whose bodies hold this call and whose tests count micro-steps, innermost
    first: in Swin's `if ACCUMULATION_STEPS > 1: ... if (idx + 1) % ACCUMULATION_STEPS == 0:
    step` the backward is inside the outer one, outside the inner one."""
    arms = [key for key, arm in rec.branch if arm == 0]
    if not arms:
        return []
    ifs = {id(n): n for n in _enclosing_ifs(rec.func or info.tree, rec.node.lineno)}
    found = [ifs[k] for k in reversed(arms) if k in ifs and _accumulates(ifs[k].test)]
    return [] if any(_every_step(info, rec.func, c.test) for c in found) else found


def _every_step(info: ModuleInfo, func: ast.AST | None, test: ast.expr) -> bool:
    """`(i + 1) % grad_accumu == 0` or `grad_accumu > 1` where the program only ever sets
    `grad_accumu = 1` (a factor written into the code, not an option): the step runs on every
    iteration, and an arm for more is dead."""
    for n in ast.walk(test):
        name = n.right.id if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) \
            and isinstance(n.right, ast.Name) else n.left.id if isinstance(n, ast.Compare) \
            and isinstance(n.left, ast.Name) and isinstance(n.ops[0], ast.Gt) else None
        if name is None:
            continue
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef) and name in {
                a.arg for a in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs)}:
            return False
        values = [v for _, v in info.assigns.get(name, [])]
        return bool(values) and all(isinstance(v, ast.Constant) and v.value == 1
                                    for v in values)
    return False


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


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch
from torch.nn.parallel import DistributedDataParallel


def train(model, loader, optimizer, gradient_interval, device):
    model = DistributedDataParallel(model, device_ids=[device])
    start_id = 0
    for batch_id, batch in enumerate(loader):
        loss = model(batch) / gradient_interval
        loss.backward()
        if batch_id - start_id + 1 == gradient_interval:
            optimizer.step()
            optimizer.zero_grad()
            start_id = batch_id + 1
"""

RULE = ddp013
