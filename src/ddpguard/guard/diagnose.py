"""From every rank's heartbeat and stacks to the most likely cause of a hang. Pure.

A rank record is a dict: rank, state ('running' | 'exited' | 'crashed' | 'dead' | 'missing'),
hb (heartbeat: epoch, steps, steps_epoch, loaders, ...), error (text, for crashed ranks),
stacks ({thread name: frames}; the main thread first).
"""

from __future__ import annotations

import re
from typing import Any

from .stacks import activity, fmt_frame, innermost, user_frame

__all__ = ["diagnose", "rank_position", "CAUSES"]

CAUSES: dict[str, tuple[str, str]] = {
    "uneven_batches": (
        "ranks have different numbers of batches or steps",
        "Give every rank the same number of batches: drop_last=True on the sampler and the "
        "loader, no per-rank filtering after sharding, no skipped steps (or ddpguard's "
        "EvenSampler / make_loader, which guarantee equal counts).",
    ),
    "left_early": (
        "a rank left the epoch early while the others still wait in a collective",
        "The rank that left ran out of batches or broke out of the loop; make every rank run "
        "the same number of iterations (break on all ranks together).",
    ),
    "forward_on_some_ranks": (
        "the DDP model ran forward on some ranks only (its buffers are broadcast in forward)",
        "Evaluate on every rank, or evaluate rank-0-only through model.module (the unwrapped "
        "model), or construct DDP with broadcast_buffers=False.",
    ),
    "conditional_collective": (
        "a collective inside a rank-conditional branch: some ranks call it, others never will",
        "Call every collective (barrier, all_reduce, ...) on all ranks; move it out of the "
        "`if rank == 0:` block.",
    ),
    "loader_stall": (
        "a data loader stalled (slow or dead worker, blocking read) on some ranks",
        "Check the dataset's __getitem__ / worker processes on the named rank (I/O, locks, "
        "a killed worker); set DataLoader(timeout=...) so a dead worker raises.",
    ),
    "crashed_rank": (
        "a rank crashed or exited while the others wait for it",
        "Fix the error shown for that rank; the other ranks only waited for it.",
    ),
    "unknown": (
        "no known pattern matched",
        "Compare the per-rank stacks below: the rank that is not in a collective, or is in a "
        "different one, is usually the one at fault.",
    ),
}

_COND = re.compile(r"\bif\b.*\b(rank|is_main|is_local_main|local_rank|get_rank)\b")


def rank_position(rec: dict[str, Any]) -> dict[str, Any]:
    """Where a rank is: user file:line, innermost frame, and what it is doing."""
    stacks = rec.get("stacks") or {}
    main: list[dict[str, Any]] = next(iter(stacks.values()), []) if stacks else []
    kind, text = activity(main) if main else ("unknown", "no stack (process gone?)")
    uf = user_frame(main) if main else None
    return {"kind": kind, "doing": text, "user": fmt_frame(uf) if uf else "?",
            "user_line": (uf["file"], uf["line"]) if uf else None,
            "innermost": fmt_frame(innermost(main)) if main else "?"}


def _counts(recs: list[dict[str, Any]]) -> str:
    parts = []
    for r in recs:
        hb = r.get("hb") or {}
        parts.append(f"rank {r['rank']}: epoch {hb.get('epoch', '?')}, "
                     f"{hb.get('steps_epoch', '?')} steps this epoch, {hb.get('steps', '?')} total")
    return "; ".join(parts)


def _in_conditional(source: list[str] | None, line: int) -> bool:
    """Is `line` (1-based) nested under an `if ... rank ...:` in `source`?"""
    if not source or not 0 < line <= len(source):
        return False
    target = source[line - 1]
    indent = len(target) - len(target.lstrip())
    for prev in reversed(source[: line - 1]):
        stripped = prev.strip()
        if not stripped or stripped.startswith("#"):
            continue
        ind = len(prev) - len(prev.lstrip())
        if ind < indent:
            if _COND.search(stripped):
                return True
            indent = ind
            if ind == 0:
                break
    return bool(_COND.search(target))


def _uneven_epoch(alive: list[dict[str, Any]], pos: dict[int, dict[str, Any]]
                  ) -> tuple[str, list[int]] | None:
    for a in alive:
        ha = a.get("hb") or {}
        for lag in alive:
            hl = lag.get("hb") or {}
            e = hl.get("epoch", 0)
            if ha.get("epoch", 0) <= e:
                continue
            done = ha.get("steps_per_epoch") or []
            i = e - ha.get("epoch_offset", 0)
            if not 0 <= i < len(done):
                continue
            length = hl.get("epoch_len")
            in_loop = length is None or hl.get("epoch_batches", 0) < length
            if in_loop and hl.get("steps_epoch", 0) >= done[i]:
                return (f"rank {a['rank']} finished epoch {e} after {done[i]} optimizer steps and "
                        f"moved on (now {pos[a['rank']]['doing']} at {pos[a['rank']]['user']}); "
                        f"rank {lag['rank']} is still in epoch {e} after "
                        f"{hl.get('steps_epoch')} steps, {pos[lag['rank']]['doing']} at "
                        f"{pos[lag['rank']]['user']}. The ranks drew different numbers of "
                        "batches or skipped different steps (e.g. a collate that drops samples "
                        "and a `continue` on empty batches).", [a["rank"], lag["rank"]])
    return None


def diagnose(records: list[dict[str, Any]],
             sources: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Return {cause, title, explanation, fix, culprits, positions} for the given ranks."""
    sources = sources or {}
    pos = {r["rank"]: rank_position(r) for r in records}
    gone = [r for r in records if r["state"] in ("crashed", "dead", "exited", "missing")]
    alive = [r for r in records if r not in gone]
    blocked = [r for r in alive if pos[r["rank"]]["kind"].startswith("collective:")
               or pos[r["rank"]]["kind"] in ("backward", "ddp_forward")]

    def out(cause: str, explanation: str, culprits: list[int]) -> dict[str, Any]:
        title, fix = CAUSES[cause]
        return {"cause": cause, "title": title, "explanation": explanation, "fix": fix,
                "culprits": culprits,
                "positions": {str(k): v for k, v in pos.items()}}

    hbs = {r["rank"]: (r.get("hb") or {}) for r in records}
    steps_epoch = {k: (hb.get("epoch", 0), hb.get("steps_epoch", 0)) for k, hb in hbs.items()}

    # 1. A loader length mismatch found by the agreement check.
    mism = [r for r in records if (r.get("hb") or {}).get("mismatch")]
    if mism:
        return out("uneven_batches", mism[0]["hb"]["mismatch"], [])

    # 2. A rank is gone.
    crashed = [r for r in gone if r["state"] in ("crashed", "dead", "missing")]
    if crashed:
        what = []
        for r in crashed:
            desc = {"crashed": "crashed", "dead": "died (its process is gone)",
                    "missing": "never answered (process gone or store unreachable)"}[r["state"]]
            err = f": {r['error']}" if r.get("error") else ""
            what.append(f"rank {r['rank']} {desc}{err}")
        waiting = ", ".join(f"rank {r['rank']} waits {pos[r['rank']]['doing']} at "
                            f"{pos[r['rank']]['user']}" for r in alive)
        return out("crashed_rank", "; ".join(what) + (f". Meanwhile {waiting}." if waiting
                                                      else "."), [r["rank"] for r in crashed])

    # 3. A rank finished an epoch with fewer steps than another is taking in that epoch.
    uneven = _uneven_epoch(alive, pos)
    if uneven:
        return out("uneven_batches", uneven[0], uneven[1])

    # 4. A data loader that does not deliver.
    stalled = [r for r in alive if pos[r["rank"]]["kind"] == "dataloader"]
    if stalled and len(stalled) < len(alive) or (stalled and not blocked and len(alive) == 1):
        names = ", ".join(f"rank {r['rank']} at {pos[r['rank']]['user']} (innermost "
                          f"{pos[r['rank']]['innermost']})" for r in stalled)
        return out("loader_stall", f"{names} is waiting for its next batch while the other "
                   "ranks wait for it in a collective.", [r["rank"] for r in stalled])

    # 4. Forward of the DDP model on some ranks only.
    fwd = [r for r in alive if pos[r["rank"]]["kind"] == "ddp_forward"]
    lines = {pos[r["rank"]]["user_line"] for r in alive}
    if fwd and (len(fwd) < len(alive) or len(lines) > 1):
        names = ", ".join(f"rank {r['rank']} at {pos[r['rank']]['user']}" for r in fwd)
        others = ", ".join(f"rank {r['rank']} {pos[r['rank']]['doing']} at "
                           f"{pos[r['rank']]['user']}" for r in alive if r not in fwd)
        return out("forward_on_some_ranks", f"{names} runs the DDP model's forward, which "
                   f"broadcasts buffers (e.g. BatchNorm statistics) to all ranks; {others}.",
                   [r["rank"] for r in fwd])

    # 5. One rank in a collective at a line no other rank is at.
    if len(lines) > 1:
        for r in blocked:
            p = pos[r["rank"]]
            if not p["kind"].startswith("collective:") or p["user_line"] is None:
                continue
            here = [o for o in alive if pos[o["rank"]]["user_line"] == p["user_line"]]
            if len(here) == len(alive):
                continue
            file, line = p["user_line"]
            if _in_conditional(sources.get(file), line):
                lonely = p["kind"].split(":", 1)[1]
                others = ", ".join(f"rank {o['rank']} {pos[o['rank']]['doing']} at "
                                   f"{pos[o['rank']]['user']}" for o in alive if o not in here)
                return out("conditional_collective", f"rank(s) {[o['rank'] for o in here]} "
                           f"called {lonely} at {p['user']}, inside a rank-conditional "
                           f"branch; {others}.", [o["rank"] for o in here])

    # 6. Different step counts, or a rank that left the epoch.
    left = [r for r in gone if r["state"] == "exited"]
    left += [r for r in blocked if pos[r["rank"]]["kind"] in (
        "collective:barrier", "collective:destroy_process_group")
        and any(pos[o["rank"]]["kind"] == "backward" for o in alive)]
    if left:
        names = ", ".join(
            f"rank {r['rank']} " + ("exited" if r["state"] == "exited" else
                                    f"is {pos[r['rank']]['doing']} at {pos[r['rank']]['user']}")
            for r in left)
        waiting = ", ".join(f"rank {r['rank']} {pos[r['rank']]['doing']} at "
                            f"{pos[r['rank']]['user']}" for r in alive if r not in left)
        cause = "uneven_batches" if len(set(steps_epoch.values())) > 1 else "left_early"
        return out(cause, f"{names}; {waiting}. Counts: {_counts(records)}.",
                   [r["rank"] for r in left])
    if len(set(steps_epoch.values())) > 1 and len(lines) > 1:
        vals = sorted(steps_epoch.values())
        if vals[-1][0] != vals[0][0] or vals[-1][1] - vals[0][1] > 1:
            return out("uneven_batches", f"Counts: {_counts(records)}.", [])
    return out("unknown", "Per-rank positions: " + "; ".join(
        f"rank {k}: {v['doing']} at {v['user']}" for k, v in pos.items()) + ".", [])
