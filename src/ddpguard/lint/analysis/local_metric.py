"""An early stop decided on the rank's own validation result (corpus35f B123's shape).

    for epoch in range(epochs):
        train_epoch(model, ...)              # DDP's backward: an all-reduce per step
        val_loss = validate(model, val_loader)   # this rank's shard, no collective
        if val_loss > best: bad += 1 else: bad = 0
        if bad > patience: break             # each rank decides on its own loss

Each rank evaluates its own shard of the validation data (a DistributedSampler), so the
losses differ and so can the decision: the ranks that stop leave while the others start the
next epoch's training and wait in its all-reduce. Reported only where the value is certainly
the rank's own: it comes from a project function that evaluates (a loop under `no_grad`,
`inference_mode` or after `.eval()`) and reaches no collective at any depth, over data the
program shards (its loader, where this file builds it, or every validation loader the program
builds, uses a DistributedSampler); what the test reads follows from that value (assigned
from it, or assigned under a test of it: `bad += 1`), and no collective in the loop shares
it. Not under a rank test (DDP019's).
"""

from __future__ import annotations

import ast
import builtins
import os
from collections.abc import Iterator

from .callgraph import calls_by_func
from .collective_reach import _callees, reaches_collective
from .context import CallRec, Func, Loop, ModuleInfo, dotted, is_collective
from .enclosing import single_process_arm
from .provenance import NONE, test_level
from .sharded_loaders import built_loaders, dist_loader, loop_source, sharded

_OWN = (ast.For, ast.While, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef,
        ast.Lambda, ast.ClassDef)
_SHARES = ("reduce", "gather", "broadcast", "sync")


def own_metric_stops(info: ModuleInfo, syncs: frozenset[str]) -> Iterator[tuple[ast.If, str]]:
    """The `if` of each early stop in a loop that syncs (reaches a collective, or one of
    `syncs`: `backward`), whose test follows the rank's own validation result; and each `if`
    on such a value whose one arm reaches a collective the other does not (`if avg_loss <
    best: save_checkpoint(...)`, a barrier inside: corpus35v B108's shape)."""
    by_line: dict[int, CallRec] | None = None
    for lrec in info.loops:
        loop = lrec.node
        if lrec.guard:
            continue
        exits: list[ast.If] = []
        arms: list[ast.If] = []
        _tested_ifs(info, loop.body, exits, arms)
        if not exits and not arms:
            continue
        if by_line is None:
            # the call each statement holds (the last one where it holds several)
            by_line = {id(r.stmt): r for r in info.calls if r.stmt is not None}
        seeds = _seeds(info, loop, by_line)
        sums = _sum_seeds(info, loop)
        if not seeds and not sums:
            continue
        mods = frozenset(info.aliases)   # `np.mean(val_loss)` feeds no object of the loop
        tainted = _spread(mods, loop, set(seeds) | set(sums))
        loop_calls = [r for r in info.calls if loop in r.loops]
        # a training function's call is itself the step the others wait in (its backward);
        # that it shares nothing of the sum it returns was read in it (_trained_sum)
        trains = {id(c) for _, c, _, _, what in seeds.values() if what == TRAINS}
        if any(_shares(info, r, tainted) for r in loop_calls if id(r.node) not in trains):
            continue
        seed_calls = {id(c) for _, c, _, _, what in seeds.values() if what == EVALUATES}
        exit_lines = {(s.lineno, s.end_lineno or s.lineno) for s in exits}
        sync = next((r for r in loop_calls if id(r.node) not in seed_calls
                     and not any(lo <= r.node.lineno <= hi for lo, hi in exit_lines)
                     and reaches_collective(info, r, syncs)), None)
        for s in exits:
            if sync is None:
                break
            origin = _origin(mods, loop, s, seeds, sums, tainted)
            if origin is not None:
                yield s, (
                    f"this stop follows {origin[0]}: each rank {origin[1]} and no collective "
                    f"shares the result, so one rank can leave the loop while the others go on "
                    f"to `{ast.unparse(sync.node.func)}` at line {sync.node.lineno}, whose "
                    f"all-reduce then waits for it forever{origin[2]}; all_reduce the "
                    f"{origin[3]} (or broadcast the decision) before the test")
        for s in arms:
            hit = _one_arm_collective(info, s, loop_calls)
            if hit is None:
                continue
            armed, inside = hit
            # the ranks that skip the arm wait elsewhere: the loop's next step
            other = next((r for r in loop_calls if id(r.node) not in seed_calls
                          and id(r.node) not in inside and reaches_collective(info, r, syncs)),
                         None)
            origin = _origin(mods, loop, s, seeds, sums, tainted)
            if other is None or origin is None:
                continue
            yield s, (
                f"this test follows {origin[0]}: each rank {origin[1]} and no collective "
                f"shares the result, so the ranks can decide it differently; only those whose "
                f"own value passes it call `{ast.unparse(armed.node.func)}` at line "
                f"{armed.node.lineno}, which waits in a collective the others never join "
                f"(they go on to `{ast.unparse(other.node.func)}` at line "
                f"{other.node.lineno}){origin[2]}; all_reduce the {origin[3]} (or broadcast "
                "the decision) before the test")


def _origin(mods: frozenset[str], loop: Loop, s: ast.If,
            seeds: dict[str, tuple[str, ast.Call, str, str, str]],
            sums: dict[str, tuple[str, ast.stmt | ast.expr, ast.For, str]], tainted: set[str]
            ) -> tuple[str, str, str, str] | None:
    """Where the value `s` tests comes from, as (`name`, which follows ..., what each rank
    does, what was assumed, what to all_reduce); None where the test reads no seed."""
    read = _reads(s.test) & tainted
    if not read:
        return None
    if not (_reads(s.test) & _spread(mods, loop, set(seeds))) and sums:
        # the running sum: followed only through the arms this test can share an iteration
        # with (a stop in the `if monitor_bleu:` arm does not follow a sum tested in its
        # `else` arm)
        own = _spread(mods, loop, set(sums), _exclusive(loop, s))
        read = _reads(s.test) & own
        if not read:
            return None
        name = min(read, key=lambda n: (n not in sums, n))
        seed = next(k for k in sorted(sums) if name in _spread(mods, loop, {k},
                                                              _exclusive(loop, s)))
        src, st, inner, assumed = sums[seed]
        via = f"`{seed}`" if name == seed else f"`{name}`, which follows `{seed}`"
        how = "kept step by step" if isinstance(st, ast.Call) else "summed"
        return (f"{via}, this rank's own training loss {how} over the loop at line "
                f"{inner.lineno} (`{src}`, line {st.lineno})",
                "trains on its own shard of the data", assumed, "sum")
    # the seed itself where the test reads it (`val_loss < best`, not `best`)
    name = min(read, key=lambda n: (n not in seeds, n))
    seed = next(k for k in sorted(seeds) if name in _spread(mods, loop, {k}))
    src, call, fn, assumed, what = seeds[seed]
    via = f"`{seed}`" if name == seed else f"`{name}`, which follows `{seed}`"
    return f"{via}, which comes from {fn}() at line {call.lineno} (`{src}`)", what, assumed, \
        "metric"


_CALLING = frozenset((ast.Expr, ast.Assign))


def _compares_values(test: ast.expr) -> bool:
    """A test that can follow a value (`avg_loss < best_loss`, `is_best`), not a periodic or
    constant one (`step % 100 == 0`, `epoch > 5`): no comparison with a literal."""
    if isinstance(test, ast.Name | ast.Attribute):
        return True
    if isinstance(test, ast.UnaryOp):
        return _compares_values(test.operand)
    if isinstance(test, ast.BoolOp):
        return any(_compares_values(v) for v in test.values)
    if isinstance(test, ast.Compare):
        sides = (test.left, *test.comparators)
        return not any(isinstance(x, ast.Constant) or isinstance(x, ast.BinOp)
                       and isinstance(x.op, ast.Mod) for x in sides)
    return False


def _one_arm_collective(info: ModuleInfo, s: ast.If, loop_calls: list[CallRec]
                        ) -> tuple[CallRec, set[int]] | None:
    """The call of `s`'s one arm that reaches a collective (a barrier counts: it pairs with
    whatever the others call next), where the other arm reaches none; with the nodes of `s`."""
    arms = [{id(n) for st in part for n in ast.walk(st)} for part in (s.body, s.orelse)]
    reach = [[r for r in loop_calls if id(r.node) in arm and reaches_collective(info, r)]
             for arm in arms]
    if bool(reach[0]) == bool(reach[1]):
        return None
    return (reach[0] or reach[1])[0], arms[0] | arms[1]


def _tested_ifs(info: ModuleInfo, body: list[ast.stmt], exits: list[ast.If],
                arms: list[ast.If]) -> None:
    """The `if`s of the loop's own statements, not under a rank test (DDP019's), in one walk:
    into `exits` the innermost whose arm leaves the loop (`break`, `return`); into `arms`
    those that leave nothing, test a value (`_compares_values`) and make a call in their own
    statements (`save_checkpoint(...)`, `x = f(...)`)."""
    for st in body:
        if isinstance(st, ast.If):
            if test_level(info, st.test) != NONE:
                continue
            known = len(exits)
            _tested_ifs(info, st.body, exits, arms)
            _tested_ifs(info, st.orelse, exits, arms)
            leaves = any(isinstance(b, ast.Break | ast.Return) for b in st.body)
            if leaves and len(exits) == known:
                exits.append(st)
            elif not leaves and _compares_values(st.test) and any(
                    type(b) in _CALLING and type(b.value) is ast.Call  # type: ignore[attr-defined]
                    for b in st.body):
                arms.append(st)
        elif isinstance(st, ast.With | ast.Try):
            _tested_ifs(info, st.body, exits, arms)


def _seeds(info: ModuleInfo, loop: Loop, by_stmt: dict[int, CallRec]
           ) -> dict[str, tuple[str, ast.Call, str, str, str]]:
    """Names the loop assigns from an evaluation of the rank's own shard, or from a training
    function's sum of its own loss: name -> (the assigned text, the call, the function's
    name, what was assumed of its data, what the function does)."""
    out: dict[str, tuple[str, ast.Call, str, str, str]] = {}
    for st in _statements(loop.body):
        if not isinstance(st, ast.Assign) or not isinstance(st.value, ast.Call):
            continue
        rec = by_stmt.get(id(st))
        if rec is None or rec.node is not st.value:
            continue
        fns = _callees(info, rec)
        if len(fns) != 1:
            continue   # (one that reaches a collective shares what it returns: _shares)
        m, fn = fns[0]
        evaluates = _evaluates(m, fn)
        assumed = sharded(m, fn) if evaluates else _trained_sum(m, fn)
        if assumed is None:
            continue
        what = EVALUATES if evaluates else TRAINS
        for t in st.targets:
            for n in ast.walk(t):
                d = dotted(n) if isinstance(n, ast.Name | ast.Attribute) else None
                if d is not None and isinstance(getattr(n, "ctx", None), ast.Store):
                    out[d] = (ast.unparse(st), st.value, fn.name, assumed, what)
    return out


EVALUATES = "evaluates its own shard of the validation data"
TRAINS = "averages its own training loss over its own shard of the data"


def _trained_sum(m: ModuleInfo, fn: Func) -> str | None:
    """`fn` trains over this rank's shard (a loop that calls `.backward()`) and returns what
    it summed of its own loss (`total_loss += loss.item()`, then `return {"average_loss":
    total_loss / total_steps}`; ECG-Bench's `train()`, fed to the checkpoint manager's early
    stop): what was assumed of its data, None where it returns no such sum."""
    for inner in _statements(fn.body):
        if not isinstance(inner, ast.For):
            continue
        for st, target, assumed in _loop_sums(m, inner):
            names = {target}
            for _ in range(3):
                for a in _statements(fn.body):
                    if isinstance(a, ast.Assign | ast.AugAssign) and a is not st \
                            and _reads(a.value) & names:
                        names |= _targets(a)
            if any(_shares(m, r, names) for r in calls_by_func(m).get(id(fn), ())
                   if inner not in r.loops):
                continue   # `dist.all_reduce(avg)` before the return
            if any(isinstance(r, ast.Return) and r.value is not None and _reads(r.value) & names
                   for r in _statements(fn.body)):
                return assumed
    return None


def _sum_seeds(info: ModuleInfo, loop: Loop
               ) -> dict[str, tuple[str, ast.stmt | ast.expr, ast.For, str]]:
    """Names an inner training loop of `loop` sums this rank's own loss into (`total_loss +=
    loss.item()` in a loop that calls `.backward()`, corpus35f T77's shape): name -> (the
    statement's text, the statement, the inner loop, what was assumed of its data). Not a sum
    of a value a collective or a reducing helper shared in that loop (`reduce_mean(loss)`),
    nor where the loop's loader, built in this file, has no DistributedSampler."""
    out: dict[str, tuple[str, ast.stmt | ast.expr, ast.For, str]] = {}
    for inner in _statements(loop.body):
        if isinstance(inner, ast.For):
            for st, target, assumed in _loop_sums(info, inner):
                out[target] = (ast.unparse(st), st, inner, assumed)
    return out


def _loop_sums(info: ModuleInfo, inner: ast.For
               ) -> list[tuple[ast.stmt | ast.expr, str, str]]:
    """The sums of this rank's own loss in a training loop (one that calls `.backward()`) over
    its shard (`total += loss.item()`, or each step's loss kept in a list, `epoch_losses.append(
    loss.item())`, averaged later), each with the name it goes into and what was assumed of
    the data; not one a collective or a reducing helper in the loop is given."""
    nodes = [n for st in inner.body for n in _own_nodes(st)]
    if not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == "backward" for n in nodes):
        return []
    kept = {id(n): t for n in nodes if (t := _summed(n)) is not None}
    sums = [n for n in nodes if id(n) in kept and isinstance(n, ast.stmt | ast.expr)]
    losses = {id(st): {n.id for n in ast.walk(kept[id(st)][1]) if isinstance(n, ast.Name)
                       and "loss" in n.id.lower()} for st in sums}
    sums = [st for st in sums if losses[id(st)] and kept[id(st)][0] is not None
            and kept[id(st)][0] not in losses[id(st)]]
    if not sums:
        return []
    assumed = _trains_on_shard(info, inner)
    if assumed is None:
        return []
    # a helper whose value is only tested shares a decision, not the loss it was given
    # (ECG-Bench's `if train_dev_break(dev, batch, loss.item()): break` broadcasts its flag)
    calls = [r for r in info.calls if inner in r.loops
             and not (isinstance(r.stmt, ast.If | ast.While) and not is_collective(r)
                      and any(n is r.node for n in ast.walk(r.stmt.test)))]
    return [(st, kept[id(st)][0] or "", assumed) for st in sums
            if not any(_shares(info, r, _inner_chain(nodes, losses[id(st)])) for r in calls)]


def _summed(n: ast.AST) -> tuple[str | None, ast.expr] | None:
    """(where it goes, what is added) for `total += x` and `kept.append(x)`."""
    if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add):
        return dotted(n.target), n.value
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
            and n.func.attr == "append" and len(n.args) == 1 and not n.keywords:
        return dotted(n.func.value), n.args[0]
    return None


def _own_nodes(st: ast.stmt) -> Iterator[ast.AST]:
    """Every node of `st`, not inside a nested function or class (another scope)."""
    todo: list[ast.AST] = [st]
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            todo.extend(ast.iter_child_nodes(n))


def _inner_chain(nodes: list[ast.AST], names: set[str]) -> set[str]:
    """`names` and what the inner loop computed them from (`loss = crit(out, y)` reads
    `out`): a collective given any of them shares the sum."""
    chain = set(names)
    assigns = [n for n in nodes if isinstance(n, ast.Assign | ast.AugAssign)]
    for _ in range(4):
        before = len(chain)
        for st in assigns:
            if _targets(st) & chain:
                chain |= _reads(st.value)
        if len(chain) == before:
            break
    return chain


def _trains_on_shard(info: ModuleInfo, inner: ast.For) -> str | None:
    """The data the training loop reads is this rank's shard: "" where its loader, built in
    this file, has a DistributedSampler; None where it has none; where the loader comes from
    elsewhere, what was assumed: the program's DistributedSampler (None where it builds
    none)."""
    # the loader a single-process run builds instead is not what the ranks read
    built = [v for v in built_loaders(info, loop_source(inner.iter))
             if not single_process_arm(info, v)]
    if built:
        return "" if all(dist_loader(info, v) for v in built) else None
    infos: list[ModuleInfo] = getattr(info.file_set, "infos", None) or [info]
    key = ("program_dist_sampler", 0)
    hit = infos[0]._memo.get(key)
    if hit is None:
        hit = infos[0]._memo[key] = next(
            (f"{os.path.basename(i.path)}:{r.node.lineno}" for i in infos for r in i.calls
             if r.last.endswith("DistributedSampler") and i.is_dist_sampler(r.node)), "")
    return (f" (assumed: the loop at line {inner.lineno} reads the program's "
            f"DistributedSampler-sharded data, {hit})") if hit else None


def _exclusive(loop: Loop, exit_if: ast.If) -> set[int]:
    """The statements of `loop` that cannot run in the iteration that reaches `exit_if`:
    the other arm of every `if` on the way to it."""
    out: set[int] = set()

    def walk(body: list[ast.stmt]) -> bool:
        for st in body:
            if st is exit_if:
                return True
            if isinstance(st, ast.If):
                if walk(st.body):
                    out.update(id(x) for x in st.orelse)
                    return True
                if walk(st.orelse):
                    out.update(id(x) for x in st.body)
                    return True
            elif isinstance(st, ast.With | ast.Try) and walk(st.body):
                return True
        return False

    walk(loop.body)
    return out


def _evaluates(m: ModuleInfo, fn: Func) -> bool:
    """`fn` runs a loop under `no_grad`/`inference_mode` (or after `.eval()`) and returns a
    value."""
    calls = calls_by_func(m).get(id(fn), ())
    evaluating = any(r.last in ("no_grad", "inference_mode", "eval") for r in calls) or any(
        (dotted(d.func if isinstance(d, ast.Call) else d) or "").endswith(
            ("no_grad", "inference_mode")) for d in fn.decorator_list)
    looping = any(isinstance(n, ast.For) for n in ast.walk(fn))
    returns = any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(fn))
    return evaluating and looping and returns


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The loop's own statements, nested arms included, not inner loops or functions."""
    todo = list(body)
    while todo:
        st = todo.pop(0)
        yield st
        if isinstance(st, _OWN):
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            todo.extend(getattr(st, field, []) or [])


def _reads(node: ast.AST) -> set[str]:
    return {d for n in ast.walk(node) if isinstance(n, ast.Name | ast.Attribute)
            and isinstance(n.ctx, ast.Load) and (d := dotted(n)) is not None}


def _targets(st: ast.stmt) -> set[str]:
    ts = st.targets if isinstance(st, ast.Assign) else [st.target] \
        if isinstance(st, ast.AugAssign | ast.AnnAssign) else []
    return {d for t in ts for n in ast.walk(t) if isinstance(n, ast.Name | ast.Attribute)
            and isinstance(n.ctx, ast.Store) and (d := dotted(n)) is not None}


def _spread(mods: frozenset[str], loop: Loop, tainted: set[str],
            skip: set[int] | None = None) -> set[str]:
    """What follows the seeds in the loop: names assigned from them, or under a test of them
    (`if val_loss > best: bad += 1`), to a fixed point (a counter kept across iterations);
    not through the statements in `skip`."""
    for _ in range(5):
        before = len(tainted)
        _spread_body(mods, loop.body, tainted, False, skip or set())
        if len(tainted) == before:
            break
    return tainted


def _spread_body(mods: frozenset[str], body: list[ast.stmt], tainted: set[str], ruled: bool,
                 skip: set[int]) -> None:
    for st in body:
        if isinstance(st, _OWN) or id(st) in skip:
            continue
        if isinstance(st, ast.Assign | ast.AugAssign | ast.AnnAssign):
            value = st.value
            if ruled or (value is not None and _reads(value) & tainted):
                tainted |= _targets(st)
            if value is not None:
                tainted |= _fed(value, tainted, mods)
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
            tainted |= _fed(st.value, tainted, mods)
        elif isinstance(st, ast.If):
            tainted |= _fed(st.test, tainted, mods)
            inner = ruled or bool(_reads(st.test) & tainted)
            _spread_body(mods, st.body, tainted, inner, skip)
            _spread_body(mods, st.orelse, tainted, inner, skip)
        elif isinstance(st, ast.With | ast.Try):
            _spread_body(mods, st.body, tainted, ruled, skip)


_NOT_OWNERS = frozenset(("self", *dir(builtins)))   # `max(best, val_acc)` keeps no state


def _fed(node: ast.expr, tainted: set[str], mods: frozenset[str]) -> set[str]:
    """The objects a call in `node` feeds a followed value (`stopper(val_loss)`,
    `monitor.update(val_loss)`, `if manager.save_epoch(loss):`): each holds this rank's state
    (`if stopper.early_stop: break`, `if manager.stop_early(): break`)."""
    out: set[str] = set()
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        owner = call.func.value if isinstance(call.func, ast.Attribute) else call.func
        given = [*call.args, *(k.value for k in call.keywords)]
        if isinstance(owner, ast.Name) and owner.id not in _NOT_OWNERS \
                and owner.id not in mods and any(_reads(a) & tainted for a in given):
            out.add(owner.id)
    return out


def _shares(info: ModuleInfo, rec: CallRec, tainted: set[str]) -> bool:
    """A call in the loop that shares a followed value: a collective, a helper named for
    one (`reduce_mean(val_loss)`), or a call that reaches one, given or assigning it."""
    args = [*rec.node.args, *(k.value for k in rec.node.keywords)]
    given = any(_reads(a) & tainted for a in args) or (
        rec.stmt is not None and _targets(rec.stmt) & tainted and
        isinstance(rec.stmt, ast.Assign) and rec.stmt.value is rec.node)
    if not given:
        return False
    return any(w in rec.last.lower() for w in _SHARES) or _reaches_sharing(info, rec, 0)


# Collectives that leave the result on one rank (or share nothing): the others keep their own
# value (`dist.reduce(loss, dst=0)` then `loss.item() / world_size` on every rank).
_ONE_RANK = {"reduce", "gather", "barrier", "monitored_barrier"}


def _reaches_sharing(info: ModuleInfo, rec: CallRec, depth: int) -> bool:
    """`rec` reaches a collective that hands every rank the same result (not a reduce or a
    gather to one rank, not a barrier)."""
    if is_collective(rec):
        return rec.last not in _ONE_RANK
    if depth > 4 or not reaches_collective(info, rec):
        return False
    for m, fn in _callees(info, rec):
        key = ("reaches_sharing", id(fn))
        hit = m._memo.get(key)
        if hit is None:
            m._memo[key] = False   # a recursive call finds nothing by itself
            hit = m._memo[key] = any(_reaches_sharing(m, r, depth + 1)
                                     for r in calls_by_func(m).get(id(fn), ()))
        if hit:
            return True
    return False
