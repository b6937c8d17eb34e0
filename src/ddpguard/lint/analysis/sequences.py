"""Reading one rank class's projected sequence (projection.py): the collectives and forwards in
it, its first early exit, its items named for a message. divergence.py aligns two of them."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

from .projection import Item, Seq
from .ranks import TRUE, RankClass

_OPS = ("coll", "fwd")


_EXITS = ("exit", "mayexit")


def _ev_line(it: Item) -> int:
    return it.ev.line if it.ev is not None else -1


def ops(seq: Seq) -> tuple[object, ...]:
    """What a class does that the other ranks wait on, in order: collectives and forwards,
    with the calls they sit behind inlined and everything else (exits, writes) left out. A
    branch or loop stays only where its arms differ in that respect."""
    out: list[object] = []
    for it in seq:
        if it.ev is not None:
            if it.ev.kind in _OPS:
                out.append(it.key)
        elif it.kind == "call":
            out.extend(ops(it.arms[0]) if it.arms else ())
        elif it.kind == "loop":
            body = ops(it.arms[0])
            if body:
                out.append(("l", body))
        else:
            arms = tuple(ops(a) for a in it.arms)
            if any(arms):
                if all(a == arms[0] for a in arms):
                    out.extend(arms[0])
                else:
                    out.append(("a", arms))
    return tuple(out)


def _no_yield(seq: Seq) -> Seq:
    return tuple(i for i in seq if i.ev is None or i.ev.kind != "yield")


def _first(seq: Seq, kinds: tuple[str, ...], via: tuple[int, ...] = ()
           ) -> tuple[Item, tuple[int, ...]] | None:
    """The first event of `kinds` (collectives, forwards) in `seq`, and the call sites it
    sits behind."""
    for it in seq:
        if it.ev is not None:
            if it.ev.kind in kinds:
                return it, via
            continue
        for arm in it.arms:
            hit = _first(arm, kinds, via + ((it.site,) if it.kind == "call" else ()))
            if hit is not None:
                return hit
    return None


def _op_events(seq: Seq, via: tuple[int, ...] = ()
               ) -> list[tuple[object, tuple[Item, tuple[int, ...]]]]:
    """What the other ranks wait on, in order, with calls opened up (a branch or loop that
    holds some stays one entry): (key, (first event, call sites))."""
    out: list[tuple[object, tuple[Item, tuple[int, ...]]]] = []
    for it in seq:
        if it.ev is not None:
            if it.ev.kind in _OPS:
                out.append((it.key, (it, via)))
        elif it.kind == "call":
            out.extend(_op_events(it.arms[0] if it.arms else (), via + (it.site,)))
        else:
            key = ops((it,))
            first = _first((it,), _OPS, via)
            if key and first is not None:
                out.append((key, first))
    return out


def _colls(seq: Seq, via: tuple[int, ...] = (),
           fwd: bool = False) -> list[tuple[Item, tuple[int, ...]]]:
    """Every collective of `seq` in order, through calls, branches and loops (a few); with
    `fwd`, the DDP forwards with gradients too (the backward after one all-reduces, so a rank
    that never comes leaves the others in it; a forward under no_grad syncs nothing)."""
    out: list[tuple[Item, tuple[int, ...]]] = []
    for it in seq:
        if it.ev is not None:
            if it.ev.kind == "coll" or (fwd and it.ev.kind == "fwd" and not it.ev.no_grad):
                out.append((it, via))
        else:
            for arm in it.arms:
                out.extend(_colls(arm, via + ((it.site,) if it.kind == "call" else ()), fwd))
        if len(out) >= 8:
            break
    return out


def _early_exit(seq: Seq, in_loop: bool = False,
                past_no_grad: bool = False) -> tuple[Item, tuple[int, ...]] | None:
    """The first exit of `seq` itself (not of a callee, not a loop's `continue`) that comes
    before anything the other ranks wait on; None once such a collective or forward comes.
    `past_no_grad`: forwards under no_grad do not stop the search (the caller found that they
    pair with the other ranks' next forward)."""
    for it in seq:
        if it.ev is not None:
            if it.ev.kind in _OPS and not (past_no_grad and it.ev.kind == "fwd"
                                           and it.ev.no_grad):
                return None
            if it.ev.kind in _EXITS and not (in_loop and it.ev.op in ("continue", "break")):
                return it, ()
            continue
        if it.kind != "call":
            for arm in it.arms:
                hit = _early_exit(arm, in_loop or it.kind == "loop", past_no_grad)
                if hit is not None:
                    return hit
        if _colls((it,), fwd=True) if past_no_grad else ops((it,)):
            return None
    return None


def _who(cls: RankClass, it: Item) -> str:
    if it.cond is None:
        return cls.name
    test, value = it.cond
    return f"{cls.name} (`{ast.unparse(test)}` is {'true' if value == TRUE else 'false'})"


def _v(cls: RankClass, verb: str) -> str:
    """`rank 0 reaches`, `ranks > 0 reach`."""
    if cls.name.startswith("ranks") or cls.name.startswith("local rank 0 of"):
        return verb
    return {"reach": "reaches", "go": "goes", "leave": "leaves", "skip": "skips",
            "can": "can"}.get(verb, verb + "s")


def _what(it: Item, via: tuple[int, ...], here: str = "") -> str:
    ev = it.ev
    assert ev is not None
    name = f"{ev.op}()" if ev.kind == "coll" else f"a forward of the DDP model `{ev.text}`"
    where = f"line {ev.line}"
    if via and ev.path and here and ev.path != here:
        where = f"{os.path.basename(ev.path)}:{ev.line}"
    if via and via[0] != ev.line:
        where += f" (through the call at line {via[0]})"
    return f"{name} at {where}"


def _line(it: Item, via: tuple[int, ...]) -> int:
    ev = it.ev
    assert ev is not None
    if ev.kind == "fwd" or not via:
        return ev.line
    return via[0]


def _no_grad(seq: Seq, target: Item) -> bool:
    """`target` (a forward) runs under `torch.no_grad()`: its own line, or a call on the way
    down to it, sits in such a block or a function so decorated."""
    for it in seq:
        if it is target:
            return bool(it.ev is not None and it.ev.no_grad)
        for arm in it.arms:
            if any(x is target for x in _walk(arm)):
                return it.no_grad or _no_grad(arm, target)
    return False


def _walk(seq: Seq) -> Iterator[Item]:
    for it in seq:
        yield it
        for arm in it.arms:
            yield from _walk(arm)


def _show(it: Item) -> str:
    if it.ev is not None:
        return f"{it.ev.op}@{it.ev.line}"
    inner = " | ".join(", ".join(_show(i) for i in arm) for arm in it.arms)
    return f"{it.kind}[{inner}]"
