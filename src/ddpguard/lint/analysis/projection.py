"""The collective schedule of a function for one rank class.

A *projection* walks the tree schedule.py built, for one rank class (ranks.py): it takes the
arm the class's rank tests choose (both arms, as an alternative, where a test does not depend
on the rank or on the literals the caller passed), inlines callees' projections (memoised per
class and per literal arguments), and yields a sequence of items. Two classes whose sequences
differ reach different collectives: divergence.py compares them.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass, field

from .context import Func, ModuleInfo, dotted
from .ranks import FALSE, TRUE, UNKNOWN, RankClass, _const, evaluate_test
from .schedule import MAX_DEPTH, builder
from .schedule_nodes import CallerParam, CallN, Ev, IfN, LoopN

# -- projected items ------------------------------------------------------------------------
Cond = tuple[ast.expr, int] | None

@dataclass(slots=True, eq=False)
class Item:
    key: tuple[object, ...]
    kind: str                      # ev alt loop call
    ev: Ev | None = None
    arms: tuple[tuple[Item, ...], ...] = ()
    site: int = 0
    name: str = ""
    cond: Cond = None              # the rank test (and its value) that chose this item's arm
    via: tuple[int, ...] = ()      # call sites from the compared function down to the event
    args: tuple[tuple[str, object], ...] = ()   # a call's literal arguments (its callee's tests)
    no_grad: bool = False          # a call made under `torch.no_grad()`
    split: bool = False            # an alt whose test may differ between ranks (or an assert)
    fallback: bool = False         # an alt on a search's fallback (runtime_tests)
    received: bool = False         # an alt on what a collective delivered (runtime_tests)
    test: ast.expr | None = None   # an alt's test (the message names it as an assumption);
    #                                a for loop's iterable


Seq = tuple[Item, ...]
# a write, the call sites down to it, whether it is one file per rank, and the file of each
# call site
Write = tuple[Ev, tuple[int, ...], bool, tuple[str, ...]]


@dataclass
class Projection:
    seq: Seq
    exit: str | None                               # definite exit: return/raise/exit/...
    # each write reached, the call sites down to it, and whether it writes one file per rank
    # (its own path names the rank, or a caller passed a per-rank path for it)
    writes: list[Write] = field(default_factory=list)


def _ev_key(ev: Ev) -> tuple[object, ...]:
    if ev.kind == "coll":
        return ("c", ev.op, ev.text)
    if ev.kind == "fwd":
        return ("f",)
    return ("x", ev.kind, ev.op)


Consts = tuple[tuple[str, object], ...]


def project(info: ModuleInfo, func: Func | None, cls: RankClass,
            stack: tuple[int, ...] = (), consts: Consts = ()) -> Projection:
    """`consts`: parameters the caller passed as literals (sorted pairs); the callee's tests
    that read them are decided (`if local_rank == 0 and not evaluate: barrier()` under
    `evaluate=True`)."""
    key = ("proj", id(func) if func is not None else 0, cls, consts)
    hit = info._memo.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    writes: list[Write] = []
    seq, exit_ = _block(info, builder(info).tree(func), cls, stack + (id(func),), writes, None,
                        dict(consts))
    proj = Projection(tuple(seq), exit_, writes)
    info._memo[key] = proj
    return proj


def _block(info: ModuleInfo, nodes: list[object], cls: RankClass, stack: tuple[int, ...],
           writes: list[Write], cond: Cond,
           consts: dict[str, object]) -> tuple[list[Item], str | None]:
    """The class's items for `nodes`, and the exit that ends them (if one surely does).
    A write under a rank test this class cannot decide (`if not single and local_rank != 0:
    return`, `if rank % 8 == 0:`), or after such a test's exit, is not proven to run on this
    class: it is marked as not shared (DDP007 reports only writes every rank surely makes)."""
    unproven: list[int] = []
    out, ex = _items(info, nodes, cls, stack, writes, cond, consts, unproven)
    if unproven:
        for i in range(unproven[0], len(writes)):
            ev, via, _, paths = writes[i]
            writes[i] = (ev, via, True, paths)
    return out, ex


def _items(info: ModuleInfo, nodes: list[object], cls: RankClass, stack: tuple[int, ...],
           writes: list[Write], cond: Cond, consts: dict[str, object],
           unproven: list[int]) -> tuple[list[Item], str | None]:
    out: list[Item] = []
    for n in nodes:
        t = type(n)
        if t is Ev:
            assert isinstance(n, Ev)
            if n.kind == "write":
                writes.append((n, (), n.per_rank, ()))
            elif n.kind == "mayexit":
                ev = Item(("x", "exit", n.op), "ev", n, cond=cond)
                out.append(Item(("a", (ev.key,), ()), "alt", arms=((ev,), ()), site=n.line,
                                cond=cond, split=True))
            else:
                out.append(Item(_ev_key(n), "ev", n, cond=cond))
                if n.kind == "exit":
                    return out, n.op
        elif t is IfN:
            assert isinstance(n, IfN)
            split = n.split
            if consts and split and _decided_by_consts(n.test, consts):
                v = _with_consts(info, n.test, cls, consts)
                # decided by the literals alone: the same on every class
                split = v == UNKNOWN or not all(
                    n2.id in consts for n2 in ast.walk(n.test) if isinstance(n2, ast.Name))
            else:
                v = evaluate_test(info, n.test, cls) if split else n.fixed
                if consts and (v == UNKNOWN or _decided_by_consts(n.test, consts)):
                    # `distributed=False` passed (or its default): the literal decides,
                    # whatever the name says about the program
                    w = _with_consts(info, n.test, cls, consts)
                    v = w if w != UNKNOWN else v
            if v != UNKNOWN and not split:
                seq, ex = _block(info, n.body if v == TRUE else n.orelse, cls, stack, writes,
                                 cond, consts)
                out.extend(seq)
                if ex:
                    return out, ex
                continue
            if v != UNKNOWN:
                why = (n.test, v)
                seq, ex = _block(info, n.body if v == TRUE else n.orelse, cls, stack, writes,
                                 why, consts)
                out.extend(seq)
                if ex:
                    return out, ex
                continue
            # A test of an attribute of `self` (`if self.cfg.pipe:`) has one value on a path:
            # each arm knows it, and so do the methods of `self` it calls.
            fact = _fact(n.test) if not split else None
            if split and not unproven:
                unproven.append(len(writes))
            b, bx = _block(info, n.body, cls, stack, writes, cond,
                           {**consts, fact[0]: fact[1]} if fact else consts)
            o, ox = _block(info, n.orelse, cls, stack, writes, cond,
                           {**consts, fact[0]: not fact[1]} if fact else consts)
            kb, ko = tuple(i.key for i in b), tuple(i.key for i in o)
            if kb == ko:
                out.extend(b)
            else:
                out.append(Item(("a", kb, ko), "alt", arms=(tuple(b), tuple(o)), site=n.line,
                                cond=cond, split=split, fallback=n.fallback,
                                received=n.received, test=n.test))
            if bx and ox:
                return out, bx
        elif t is LoopN:
            assert isinstance(n, LoopN)
            body, _ = _block(info, n.body, cls, stack, writes, cond, consts)
            if body:
                out.append(Item(("l", tuple(i.key for i in body)), "loop", arms=(tuple(body),),
                                site=n.line, cond=cond, test=n.iter))
        elif t is CallN:
            assert isinstance(n, CallN)
            ex = _call(info, n, cls, stack, writes, cond, out, consts)
            if ex:
                return out, ex
    return out, None


def _call(info: ModuleInfo, n: CallN, cls: RankClass, stack: tuple[int, ...],
          writes: list[Write], cond: Cond, out: list[Item],
          consts: dict[str, object]) -> str | None:
    minfo, fn = n.target
    if id(fn) in stack or len(stack) > MAX_DEPTH:
        return None
    passed: list[tuple[str, object]] = []
    for name, val in n.consts.items():
        if isinstance(val, CallerParam):  # known only if the caller's caller passed it
            if val.name not in consts:
                continue
            val = (not consts[val.name]) if val.negate else consts[val.name]
        passed.append((name, val))
    if n.via_self:
        passed.extend((k, v) for k, v in consts.items() if k.startswith("self."))
    callee = project(minfo, fn, cls, stack, tuple(sorted(passed, key=lambda p: p[0])))
    writes.extend((ev, (n.site, *via), per_rank or bool(ev.names & n.per_rank),
                   (info.path, *paths)) for ev, via, per_rank, paths in callee.writes)
    seq = _rebind(callee.seq, n)
    pre: Seq = seq
    post: Seq = ()
    if n.ctx_body is not None:
        cut = next((i for i, it in enumerate(seq) if it.ev is not None
                    and it.ev.kind == "yield"), len(seq))
        pre, post = seq[:cut], seq[cut + 1:]
    # Kept even when empty: a call both classes make must align, whatever the callee does.
    args = tuple(sorted(passed, key=lambda p: p[0]))
    out.append(Item(("i", n.site, fn.name, tuple(i.key for i in pre)), "call",
                    arms=(pre,), site=n.site, name=fn.name, cond=cond, args=args,
                    no_grad=n.no_grad))
    if n.ctx_body is not None:
        body, ex = _block(info, n.ctx_body, cls, stack, writes, cond, consts)
        out.extend(body)
        if ex:
            return ex
        if post:
            out.append(Item(("i", n.site, fn.name + ".exit", tuple(i.key for i in post)),
                            "call", arms=(post,), site=n.site, name=fn.name, cond=cond,
                            args=args, no_grad=n.no_grad))
    return callee.exit if callee.exit in ("raise", "exit") else None


def _fact(test: ast.expr) -> tuple[str, bool] | None:
    """`self.x.y` (true in the body) or `not self.x.y` (false in the body)."""
    positive = True
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, positive = test.operand, not positive
    d = dotted(test) if isinstance(test, ast.Attribute) else None
    return (d, positive) if d is not None and d.startswith("self.") else None


def _with_consts(info: ModuleInfo, node: ast.expr, cls: RankClass,
                 consts: dict[str, object]) -> int:
    """A test decided by the literals the caller passed, where the rank alone leaves it open:
    `local_rank == 0 and not evaluate` with evaluate=True is false on every rank."""
    if isinstance(node, ast.Name) and node.id in consts:
        return TRUE if consts[node.id] else FALSE
    if isinstance(node, ast.Attribute) and (d := dotted(node)) is not None and d in consts:
        return TRUE if consts[d] else FALSE
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        v = _with_consts(info, node.operand, cls, consts)
        return v if v == UNKNOWN else 1 - v
    if isinstance(node, ast.BoolOp):
        vals = [_with_consts(info, v, cls, consts) for v in node.values]
        stop = FALSE if isinstance(node.op, ast.And) else TRUE
        if stop in vals:
            return stop
        return UNKNOWN if UNKNOWN in vals else 1 - stop
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.left, ast.Name) \
            and node.left.id in consts:
        op, left = node.ops[0], consts[node.left.id]
        right = node.comparators[0]
        if isinstance(right, ast.Constant):
            r = right.value
            if isinstance(op, ast.Is | ast.IsNot):
                return TRUE if (left is r) == isinstance(op, ast.Is) else FALSE
            if isinstance(op, ast.Eq | ast.NotEq):
                return TRUE if (left == r) == isinstance(op, ast.Eq) else FALSE
            fn = _ORDER.get(type(op))
            if fn is not None and isinstance(left, int | float) and isinstance(r, int | float):
                return TRUE if fn(left, r) else FALSE
            return UNKNOWN
        # `rank not in [-1, 0]` with the literal rank=-1 a caller passed (YOLOv6's validation
        # loader skips both barriers of its leader-first context manager)
        items = _const(right)
        if isinstance(op, ast.In | ast.NotIn) and isinstance(items, tuple):
            return TRUE if (left in items) == isinstance(op, ast.In) else FALSE
        return UNKNOWN
    return evaluate_test(info, node, cls)


_ORDER = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}


def _decided_by_consts(node: ast.expr, consts: dict[str, object]) -> bool:
    """The test reads a parameter the caller passed as a literal: the literal decides it,
    whatever the parameter's name says about the rank."""
    return any(isinstance(n, ast.Name) and n.id in consts for n in ast.walk(node))


def _rebind(seq: Seq, n: CallN) -> Seq:
    """A callee's calls of its parameters: a forward when the caller passed the DDP model."""
    out: list[Item] = []
    for it in seq:
        ev = it.ev
        if ev is not None and ev.kind == "pcall":
            b = n.bind.get(ev.op)
            if b is None:
                continue
            new = Ev("fwd", "forward", n.site, b[1], no_grad=ev.no_grad or n.no_grad) \
                if b[0] == "ddp" else Ev("pcall", b[1], n.site, no_grad=ev.no_grad or n.no_grad)
            out.append(Item(_ev_key(new), "ev", new, cond=it.cond))
        elif it.kind == "ev" and ev is not None and ev.kind == "yield" and n.ctx_body is None:
            continue
        elif it.arms and _has_pcall(it):
            arms = tuple(_rebind(a, n) for a in it.arms)
            keys = tuple(tuple(i.key for i in a) for a in arms)
            key: tuple[object, ...] = ("a", *keys) if it.kind == "alt" else \
                ("l", keys[0]) if it.kind == "loop" else ("i", it.site, it.name, keys[0])
            if any(arms):
                out.append(Item(key, it.kind, None, arms, it.site, it.name, it.cond, it.via,
                                it.args, it.no_grad, it.split, test=it.test))
        else:
            out.append(it)
    return tuple(out)


def bind_root(seq: Seq, params: set[str]) -> Seq:
    """A function read on its own (the root of a comparison): its calls of the parameters
    every caller passes the DDP wrapper for (crossfile._function_wrappers) are forwards of
    that wrapper, at their own lines. Inlined into a caller, the caller's binding does this."""
    out: list[Item] = []
    for it in seq:
        ev = it.ev
        if ev is not None and ev.kind == "pcall" and ev.op in params:
            new = Ev("fwd", "forward", ev.line, ev.op, no_grad=ev.no_grad)
            out.append(Item(_ev_key(new), "ev", new, cond=it.cond))
        elif it.arms and _has_pcall(it):
            arms = tuple(bind_root(a, params) for a in it.arms)
            keys = tuple(tuple(i.key for i in a) for a in arms)
            key: tuple[object, ...] = ("a", *keys) if it.kind == "alt" else \
                ("l", keys[0]) if it.kind == "loop" else ("i", it.site, it.name, keys[0])
            out.append(Item(key, it.kind, None, arms, it.site, it.name, it.cond, it.via,
                            it.args, it.no_grad, it.split, test=it.test))
        else:
            out.append(it)
    return tuple(out)


def _has_pcall(it: Item) -> bool:
    return any(i.ev is not None and i.ev.kind == "pcall" or (i.arms and _has_pcall(i))
               for a in it.arms for i in a)


__all__ = ["Item", "Projection", "bind_root", "project"]
