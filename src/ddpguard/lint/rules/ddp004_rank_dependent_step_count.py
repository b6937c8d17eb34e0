"""DDP004 rank-dependent step counts.

A `collate_fn` that can return `None`, or a loop over a DataLoader (or a name like `*loader`)
that `continue`s/`break`s on an empty/None batch and syncs every step (a backward, an optimizer
step or a collective, in the loop or in a function of the file it calls): ranks do different
numbers of steps and the all-reduce hangs. Loops over anything else (`kwargs.items()`) are not
batches; an evaluation loop under no_grad that skips a batch makes no rank wait (DDP broadcasts
buffers only on the first forward after training), and a `collate_fn` that only filters samples
out makes a smaller batch, not fewer steps. The batch is the loop's target and what the loop
builds from it before the skip (`images, targets = batch["image"], batch["targets"]`, then `if
len(targets) == 0: continue`). Also: a skip on a test of the batch's items (`if
any(len(t) < 1 for t in targets): continue`, maskrcnn-benchmark's trainer), and a rank that
leaves or skips the step on its own non-finite loss (`if torch.isnan(loss): break`, `if not
torch.isfinite(loss): continue`, `torch.logical_or(loss.isnan(), loss.isinf())`, or a
status-0 `exit()`/`quit()` there; a `*_dl` loader, a call wrapping a loader
(`self._stable(self.train_loader, seed)`), or a name the loop's function binds to one before
the loop (`pbar = tqdm(loader) if progress else loader`) counts as a loader): the loss
comes from this rank's batch alone, so one rank may meet a NaN the others do not. Such a
skip may sit inside a test on the step's progress (`if i % log_every == 0:`, no `else`, no
rank in it): every rank passes that test at the same step. And a step function the loop
calls with its batch every step that returns early when a value drawn from that batch is
empty (`texts = tok.batch_decode(model.module.generate(batch["ids"]))`, then `if not texts:
return`), before the step's backward or collective: reported at the test, or at the loop's
call when the function is another file's. A
`dist.reduce(loss, dst=0)`, or a helper of the file whose only collectives are such reduces,
does not make the test common: only the destination holds the sum. Not when the tested value went
through a collective or a reducing helper (`reduce_mean(loss)`, any call named `*reduce*`,
`*gather*`, `*sync*`, `*broadcast*`) earlier in the loop: its result is what the test reads (or
it works in place on it); a reduction kept apart for the log line (`loss_dict_reduced =
reduce_dict(loss_dict)` beside `if torch.isnan(losses): continue`) leaves the test the rank's
own. Not for names other than a loss (a gradient norm is read after DDP's all-reduce and is the
same everywhere), and not for `raise`/`sys.exit`, which the launcher turns into the end of the
job. Also: an `except` in such a loop that swallows an error (an out-of-memory "batch skipped"
handler, a bad sample logged and passed) around a step that syncs (a backward, an optimizer
step, a collective), or that leaves the step with `continue`/`break`: the error is this rank's,
which skips the sync the others wait in. Not a handler that re-raises or exits at its top level,
nor one for `StopIteration` (the end of a second loader comes on every rank at the same step),
but `if "out of memory" in str(e): continue` ahead of a top-level `raise e` is this rank's way
out; the same in a function the loop calls (a `self.` method too, a subclass's in another file
of the project) whose handler returns before the backward or collective after it (`return
False`), and then the loop's tests of what it returned, or of a counter advanced only when it
held, that leave the loop or reach a sync (`if succ: step += 1` ... `if step % k == 0:
evaluate()`); not a handler that all-reduces a skip flag;
a handler that only sets a flag around a block without the sync, which a later collective
shares, stays silent. A handler that ends the rank with status 0 (`exit(0)`, `exit()`,
`sys.exit()`, `os._exit(0)`) is this rank's own exit, not a re-raise: neither torchrun nor
mp.spawn reads status 0 as a failure, so nothing ends the peers waiting in the step's
all-reduce (a non-zero exit is the launcher's to act on, and stays silent); such a handler is
reported in any loop whose guarded block calls `.backward()` itself (`for i, batch in t:` over
a project's own batch generator), the message naming what it assumed (the error is not met on
every rank at once). The same for a catch-all (`except Exception:`, bare `except:`) around the
whole of a rank's run, the last statement of its function, whose block reaches a sync through
the project's code and whose handler neither raises, exits with a failure, makes a
collective nor hands the error to another process (OpenNMT's `error_queue.put(...)`, read by a
parent that ends every child; an `os.kill`): the failing rank returns normally and ends with
status 0 (not a handler for one kind of error, `except FileNotFoundError:`). A retry loop
around that `try` (pytracking's trainer: `for i in range(num_tries): try: ... except: ...`) is
the same run, which the failing rank starts again alone; a `raise` in the handler counts only
where it can run: under `if fail_safe: ... else: raise` with `fail_safe=True` the parameter's
default and no call of the function in the project passing anything else, it cannot. And an
early stop decided on the rank's own validation result, in a loop that reaches a backward or a
collective: the stop's test follows (by assignment, by an assignment under a test of it: `else:
bad += 1`, or as the state of an object fed it: `stopper(val_loss)`, then `if
stopper.early_stop: break`) what a project function returned that evaluates (a loop under
`no_grad`/`inference_mode` or after `.eval()`) over sharded data and reaches no collective that
hands every rank the result (a `dist.reduce(loss, dst=0)` leaves the others their own value):
each rank's loss is its shard's, so one rank
leaves while the others wait in the next epoch's all-reduce. The data is sharded where the
loader the evaluation reads is built in its file with a DistributedSampler; where it arrives
from elsewhere (a constructor's `self.val_data`), the message says what was assumed: that it is
the program's validation loader built with one (a loader named for validation, built by a
DataLoader with a DistributedSampler or returned by a project function that builds one, also
in a tuple and through a second such function: `vali_data, vali_loader =
self._get_data(flag="val")`; none such: silent). Not once a collective, a
helper named for one (`reduce_mean(val_loss)`) or a call that reaches one is given (or assigns)
what the test follows, not under a rank test (DDP019's), and not a loop that only counts
batches. The same for a stop on the rank's own running sum of its training loss (`total_loss
+= loss.item()` in the epoch's loop that calls `.backward()`, then `if total_loss < best: ...
else: patience -= 1`, `if patience <= 0: break`): each rank trains on its own shard, so the
sums differ. Where the loader is built in the file it must have a DistributedSampler; where it
comes from elsewhere the message says what was assumed (the program's DistributedSampler; none
such: silent). Not a sum of a loss a collective or a reducing helper shared in that loop
(`reduce_mean(loss)`), not a count of batches, and not a stop in an arm that cannot run in the
iteration that tests the sum (`if monitor_bleu: ... break` beside `else: if total_loss <
best:`). Each step's loss kept in a list (`epoch_losses.append(loss.item())`, then
`np.mean(epoch_losses)`) is such a sum, and a loader the file builds only for the
single-process run (the `else` of `if world_size > 1:`) is not what the ranks read. The same
test on the rank's own value (validation result or training sum) whose one arm reaches a
collective the other does not is reported too: `if avg_loss < best_loss:
save_checkpoint(...)` where the save waits in a barrier (corpus35v B108): only the ranks
whose value improved enter it, while the others go on to the next epoch's all-reduce. Not
where both arms reach a collective or the arm's call makes none, nor for a test against a
literal or a period (`val_loss < 0.1`, `epoch % 5 == 0`), which the analysis does not
follow. And a status-0 exit (`quit()`) on the rank's own non-finite loss in an evaluation
loop that syncs nothing, where the evaluation is called (in any file of the project, not
under a rank test) from a loop that reaches a backward or a collective, over sharded data:
the loader the call passes, where its file builds it, has a DistributedSampler (a plain
DataLoader gives every rank the same loss: silent), else the evaluation's own reading above.
And only in a module that
runs with other ranks: it uses torch.distributed, or a file on the command line that forms the
group imports it (a single-process script may skip what it likes). Pitfall in
[pitfalls.md](pitfalls.md). Fix: resample inside the Dataset; never skip a batch on one rank;
for a non-finite loss or a caught error, all-reduce a flag so that every rank skips or stops
alike.
And a loop that stops on the rank's own clock (`if time.time() - start > budget: break`,
directly or through a name assigned from a clock reading) while each turn reaches a collective
or a backward through a DDP wrapper the program keeps: each rank crosses the budget at its own
step (not where the elapsed time goes through a collective first).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from functools import partial

from ..analysis.callgraph import is_collective
from ..analysis.clock_exits import clock_exits
from ..analysis.collective_reach import reaches_collective
from ..analysis.context import (
    CallRec,
    Func,
    Loop,
    ModuleInfo,
    dotted,
    kwarg,
)
from ..analysis.eval_exits import evaluation_exits
from ..analysis.local_metric import own_metric_stops
from ..analysis.nonfinite import local_nonfinite
from ..analysis.provenance import NONE
from ..analysis.rank_failures import (
    caught_here,
    clean_exit,
    exits_cleanly,
    failing_return,
    rank_local_tests,
    reraises_first,
    swallowed_main,
    swallowed_run,
    training_calls,
)
from ..analysis.step_returns import batch_step_returns, has_step_calls
from ..registry import Hit, rule

_COMPS = (ast.GeneratorExp, ast.ListComp, ast.SetComp)


_RUNNERS = ("trainer", "engine", "runner", "solver")


def _syncs_or_trains(info: ModuleInfo, fn: Func | None, rec: CallRec) -> bool:
    return reaches_collective(info, rec, _SYNCS) or _trainer_run(info, fn, rec)


def _trainer_run(info: ModuleInfo, fn: Func | None, rec: CallRec) -> bool:
    """`trainer.train()` (`.fit()`, `.run()`) on an object named for a trainer, in a function
    that wrapped the model in DDP or formed the group before it: the run of the training,
    whose class may sit in a file not given (RARE-UNet's `RARETrainer`)."""
    f = rec.node.func
    if not (isinstance(f, ast.Attribute) and f.attr in ("train", "fit", "run")):
        return False
    owner = (dotted(f.value) or "").rsplit(".", 1)[-1].lower()
    if not any(w in owner for w in _RUNNERS):
        return False
    return any(r.func is fn and r.node.lineno < rec.node.lineno
               and (r.last == "init_process_group" or info.is_ddp_call(r.node))
               for r in info.calls)


def _swallowed(hit: tuple[ast.ExceptHandler, str] | None) -> Iterator[Hit]:
    if hit is not None:
        yield hit[0], "DDP004", (
            f"an error caught here {hit[1]} (the handler neither re-raises nor exits with a "
            "failure): that process ends with status 0, which no launcher reads as a failure, "
            "while the other ranks wait for it in their next collective or gradient all-reduce "
            "(assumed: the error is met on some ranks only); re-raise after the clean-up")


def _returns_none(fn: Func) -> ast.AST | None:
    """A `return None` (or a bare `return`): that batch is None on one rank. A collate_fn
    that only filters samples out (`[b for b in batch if b is not None]`, `filter(...)`)
    makes a smaller batch, not fewer steps: every rank still gets one batch per index the
    sampler yields (DeCLIP's and deepmd's collate functions)."""
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
      'one rank leaves the common sequence of steps on its own: a skipped batch, a '
      'swallowed error, a stop on its own loss, metric or clock',
      'decide together: all_reduce the value the skip or stop tests (or broadcast rank 0\'s '
      'decision) before acting on it, re-raise errors, and never return None from collate_fn')
def ddp004(info: ModuleInfo) -> Iterator[Hit]:
    """A step one rank skips pairs every later all-reduce with the wrong step and ends in a
    hang. Only where the module runs with other ranks: it uses torch.distributed, or a file
    on the command line that forms the group imports it (a single-process script may skip
    what it likes)."""
    grouped = info.distributed or (info.file_set is not None
                                   and info.file_set.in_group(info))  # type: ignore[attr-defined]
    # a loop whose step is a distributed module's runs with other ranks, wherever it is
    yield from _failing_steps(info, grouped)
    if not grouped:
        return
    for fns in info.funcs.values() if info.catching else ():
        for fn in fns:
            yield from _swallowed(swallowed_run(info, fn, partial(_syncs_or_trains, info, fn)))
    if info.catching:
        yield from _swallowed(swallowed_main(info, partial(_syncs_or_trains, info, None)))
    for stop, message in own_metric_stops(info, _BACKWARD):
        yield stop, "DDP004", message
    for stop, test in clock_exits(info, _SYNCS):
        yield stop, "DDP004", (
            f"this loop stops on the rank's own clock (`{test}`): each rank reads its clock at "
            "its own moment and crosses the limit at its own step, so the first to leave is "
            "missing from the next step's all-reduce or collective, where the others wait for "
            "it; decide on one value (all_reduce the elapsed time with MAX, or broadcast rank "
            "0's decision)")
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
        skips = [s for s in _tested(info, node.body) if any(
            isinstance(b, ast.Continue | ast.Break) or isinstance(b, ast.Expr)
            and clean_exit(info, b.value) for b in s.body)]
        # the walk for a `try` only in a function that has one
        tries = [t for t in _own_statements(node) if isinstance(t, ast.Try)] if (
            id(lrec.func) if lrec.func is not None else 0) in info.catching else []
        batches = _batch_loop(info, node.iter, lrec.func)
        if not (skips and batches or tries and (batches or _backward_in(info, tries)
                                                 or _draws_batch(tries))):
            continue
        if not _steps_together(info, node):
            if skips and batches and lrec.func is not None and grouped:
                for s, message in evaluation_exits(info, node, lrec.func, skips, _SYNCS):
                    yield s, "DDP004", message
            continue
        for drawn, handler in ((_draws_batch([t]), h) for t in tries
                               for h in _swallowing(info, node, t)):
            ex = exits_cleanly(info, handler)
            if not (batches or drawn) and ex is None:
                continue  # a loop over anything else: only a status-0 exit is certain
            if ex is not None:
                yield handler, "DDP004", (
                    f"an error caught here (an out-of-memory, a bad sample) ends this rank alone "
                    f"with `{ast.unparse(ex)}`: a status-0 exit is no failure to torchrun or "
                    "mp.spawn, so nothing ends the other ranks, which wait in the step's "
                    "gradient all-reduce or collective for it (assumed: the error is not met "
                    "on every rank at once); re-raise, or exit with a non-zero status")
                continue
            yield handler, "DDP004", (
                "an error caught here (an out-of-memory in the forward, a bad sample) is "
                "swallowed on this rank alone, which then skips the step's gradient all-reduce "
                "or collective while the others wait in it: the ranks leave the common "
                "sequence and DDP hangs; re-raise, or all_reduce a 'skip' flag so that every "
                "rank skips alike")
        names = _targets(node)
        for s in skips:
            if not any(isinstance(b, ast.Continue | ast.Break) for b in s.body):
                pass  # a status-0 exit: only the non-finite loss form below reads it
            elif s in node.body and _empty_test(s.test, _from_the_batch(node, s, names)):
                yield s, "DDP004", ("loop skips an empty/None batch with continue/break: ranks "
                                    "do different numbers of steps and DDP's all-reduce hangs")
                continue
            loss = local_nonfinite(info, node, s)
            if loss is not None:
                end = next((b.value for b in s.body if isinstance(b, ast.Expr)
                            and clean_exit(info, b.value)), None)
                how = f"ends with `{ast.unparse(end)}` (status 0: no launcher ends the others)" \
                    if end is not None else "leaves the loop" if any(
                        isinstance(b, ast.Break) for b in s.body) else "skips the step"
                yield s, "DDP004", (
                    f"a rank whose own `{loss}` is not finite {how} while the others go on: "
                    "the loss is this rank's alone (no collective that every rank reads reached "
                    "it; a reduce leaves the sum on one rank), so the ranks do "
                    "different numbers of steps and DDP's all-reduce hangs; all_reduce the "
                    "flag first so that every rank decides alike")


def _failing_steps(info: ModuleInfo, grouped: bool) -> Iterator[Hit]:
    """A step function that returns on this rank's own caught error before its sync, called
    from a training loop (here or in another file of the project); and the loop's tests of
    what it returned."""
    for fns in info.funcs.values() if grouped and info.catching else ():
        for fn in fns:
            hit = failing_return(info, fn) if id(fn) in info.catching else None
            callers = training_calls(info, fn, _batch_loop) if hit else []
            if hit and callers:
                m, rec = callers[0]
                yield hit[0], "DDP004", (
                    f"an error caught here (an out-of-memory, a bad sample) ends {fn.name}() "
                    f"on this rank alone, before the step's sync at line {hit[1]} that the "
                    f"other ranks reach (the loop at {_where(info, m, rec.node.lineno)} calls "
                    "it every step): the ranks leave the common sequence and DDP hangs; "
                    "re-raise, or all_reduce a 'skip' flag so that every rank skips alike")
    for lrec in info.loops:
        if isinstance(lrec.node, ast.For | ast.AsyncFor) and \
                _batch_loop(info, lrec.node.iter):
            if grouped and has_step_calls(info):
                yield from _empty_step_returns(info, lrec.node, lrec.func)
            for s, name, (m, fn) in rank_local_tests(info, lrec.node):
                ret = failing_return(m, fn)
                if not (grouped or m.distributed):
                    continue
                yield s, "DDP004", (
                    f"`{name}` is this rank's own: it follows what {fn.name}() returned, and "
                    f"{fn.name}() returns early on an error caught on one rank (at "
                    f"{_where(info, m, ret[0].lineno if ret else fn.lineno)}), so this test "
                    "leaves or skips the step on that rank alone and the ranks do different "
                    "steps; all_reduce the outcome first so that every rank decides alike")


def _tested(info: ModuleInfo, body: list[ast.stmt]) -> list[ast.If]:
    """The `if`s of a loop body, and those inside an `if` on the step's progress (`if i %
    log_every == 0: if torch.isnan(loss): exit()`, corpus42b's bengali-speech-recognition):
    every rank passes that test at the same step, so what it holds is the step's own. (Only
    the non-finite loss reading takes the inner ones: an empty-batch skip is the loop's.)"""
    out = [s for s in body if type(s) is ast.If]
    for s in out[:]:
        if s.orelse:
            continue
        inner = [t for t in s.body if type(t) is ast.If and any(
            type(b) in (ast.Continue, ast.Break, ast.Expr) for b in t.body)]
        if inner and _every_k(info, s.test):
            out.extend(inner)
    return out


def _every_k(info: ModuleInfo, test: ast.expr) -> bool:
    """`i % k == 0` (or `step % every == every - 1`): a test on the step count alone."""
    return type(test) is ast.Compare and len(test.ops) == 1 and type(test.ops[0]) is ast.Eq \
        and type(test.left) is ast.BinOp and type(test.left.op) is ast.Mod \
        and info.rank_level(test) == NONE


def _empty_step_returns(info: ModuleInfo, loop: ast.For | ast.AsyncFor,
                        func: Func | None) -> Iterator[Hit]:
    """The loop hands its batch to a step function that returns early when a value drawn
    from it is empty, before the step's sync (corpus41b's grpo2)."""
    for (m, fn), test, sync, rec in batch_step_returns(info, loop, func, partial(_targets, loop),
                                                      _empty_test):
        # In another file, the call here is the place this file can name.
        here = "here" if m is info else f"at {_where(info, m, test.lineno)}"
        yield test if m is info else rec.node, "DDP004", (
            f"{fn.name}() returns early {here} when `{ast.unparse(test.test)}`, a value drawn "
            f"from this rank's own batch, before the step's sync at {_where(info, m, sync)} "
            f"that the other ranks reach (the loop at line {rec.node.lineno} calls it every "
            "step): a "
            "rank whose batch gives an empty value skips the step alone, the ranks do "
            "different numbers of steps and DDP's all-reduce hangs; all_reduce a 'skip' flag "
            "so that every rank skips alike")


def _targets(node: ast.For | ast.AsyncFor) -> set[str]:
    """The loop's batch names (`for i, batch in enumerate(...)`: not `i`)."""
    target = node.target
    if isinstance(node.iter, ast.Call) and isinstance(node.iter.func, ast.Name) and \
            node.iter.func.id == "enumerate" and isinstance(target, ast.Tuple) and \
            len(target.elts) == 2:
        target = target.elts[1]
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _where(info: ModuleInfo, m: ModuleInfo, line: int) -> str:
    return f"line {line}" if m is info else f"{os.path.basename(m.path)}:{line}"


def _from_the_batch(loop: Loop, skip: ast.If, names: set[str]) -> set[str]:
    """The loop's batch names and the names computed from them in the loop before the skip
    (`images, targets = batch`, `targets = batch["labels"]`): an empty target list built from
    this rank's batch is this rank's alone."""
    out = set(names)
    for st in loop.body:
        if st.lineno >= skip.lineno:
            break
        if isinstance(st, ast.Assign) and any(
                isinstance(n, ast.Name) and n.id in out for n in ast.walk(st.value)):
            out |= {n.id for t in st.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def _own_statements(loop: Loop) -> Iterator[ast.AST]:
    """The loop's statements, not those of an inner loop or of a function it defines (a
    `continue` there leaves that inner loop, not this one)."""
    todo: list[ast.AST] = list(loop.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.For | ast.While | ast.AsyncFor | ast.FunctionDef
                      | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        todo.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt
                                                                        | ast.excepthandler))


def _swallowing(info: ModuleInfo, loop: Loop, node: ast.Try) -> Iterator[ast.ExceptHandler]:
    """The handlers of a `try` in a training loop that carry on after an error of this rank:
    no `raise` or exit at the handler's top level, and either the guarded block holds the
    step's sync (a backward, an optimizer step, a collective) or the handler leaves the step
    (`continue`/`break`). A handler that only sets a flag around a block without the sync
    stays silent: a collective later in the loop can share it (every rank then decides
    alike); past a skipped sync no agreement helps, the others already wait in it."""
    collectives = {id(r.node) for r in info.calls if loop in r.loops and is_collective(r)}

    def syncs(n: ast.AST) -> bool:
        if not isinstance(n, ast.Call):
            return False
        if info.callee_last(n) in ("backward", "step") or id(n) in collectives:
            return True
        rec = info.call_rec(n)  # a project helper that all-reduces, at any depth
        return rec is not None and reaches_collective(info, rec)

    guarded_sync = any(syncs(n) for st in node.body for n in ast.walk(st))
    for h in node.handlers:
        if not caught_here(h) or reraises_first(info, h):
            continue
        leaves = any(isinstance(n, ast.Continue | ast.Break) for n in ast.walk(h)) \
            or exits_cleanly(info, h) is not None
        if guarded_sync or leaves:
            yield h


def _backward_in(info: ModuleInfo, tries: list[ast.Try]) -> bool:
    """A guarded block that calls `.backward()` itself: the loop is a training loop whatever
    it iterates over (`for i, batch in t:` over a project's own batch generator), for a
    handler that ends the rank with status 0. A swallowed error there stays unreported: a
    loop over loss terms (`for loss_i in losses: try: loss_i.backward()`) in a program that
    all-reduces gradients by hand afterwards is no step the peers wait in."""
    return any(isinstance(n, ast.Call) and info.callee_last(n) == "backward"
               for t in tries for st in t.body for n in ast.walk(st))


def _draws_batch(tries: list[ast.Try]) -> bool:
    """A guarded block that draws the step's batch itself (`data = next(loader_iter)` in a
    loop over step numbers, Depth3D's runner): a handler that skips a bad sample there skips
    the rank's step."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "next"
               for t in tries for st in t.body for n in ast.walk(st))


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
    # or through the project's code in other files, at any depth (a `trainer.step(batch)`)
    return info.file_set is not None and getattr(info.file_set, "multi", False) and any(
        reaches_collective(info, r, _SYNCS) for r in info.calls if loop in r.loops)


_SYNCS = frozenset(("backward", "step"))
_BACKWARD = frozenset(("backward",))   # not `step`: a scheduler's step(val_loss) syncs nothing


def _batch_loop(info: ModuleInfo, it: ast.expr, func: Func | None = None) -> bool:
    """A loop over a DataLoader (or something named like one), not `kwargs.items()`; given
    the loop's function, also over a name that function binds to one of those before the loop
    (`pbar = tqdm(loader) if progress else loader`; a `pbar` of another function is not it)."""
    while isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.args \
            and it.func.id in ("enumerate", "tqdm", "iter", "zip"):
        it = it.args[0]
    if any(isinstance(v, ast.Call) and info.callee_last(v) == "DataLoader"
           for v in info.values_of(it)):
        return True
    if isinstance(it, ast.Call) and any(  # a wrapper over a loader: `self._stable(loader, s)`
            "loader" in (dotted(a) or "").rsplit(".", 1)[-1].lower() for a in it.args):
        return True
    name = (dotted(it) or "").rsplit(".", 1)[-1].lower()
    if "loader" in name or name in ("batches", "data_iter", "train_iter", "dl") \
            or name.endswith("_dl"):
        return True
    if func is None or not isinstance(it, ast.Name):
        return False
    bound = [v for line, v in info.assigns.get(it.id, []) if func.lineno <= line < it.lineno]
    return any(_batch_loop(info, b) for v in bound
               for b in ((v.body, v.orelse) if isinstance(v, ast.IfExp) else (v,)))


# Shown in docs/lint.md; tests/lint/test_docs.py checks that it is reported.
EXAMPLE = """\
import torch.distributed as dist


def train(model, loader, optimizer):
    for images, targets in loader:
        if any(len(t) < 1 for t in targets):
            continue  # this rank does one step fewer
        loss = model(images, targets)
        loss.backward()
        optimizer.step()
"""

RULE = ddp004
