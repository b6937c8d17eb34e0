"""From the guard's decision and every rank's last heartbeat and stacks to a diagnosis whose
cause is only as specific as the evidence. Pure.

A rank record is a `records.RankRecord`: rank, state ('running' | 'exited' | 'crashed' |
'dead' | 'missing'), hb (heartbeat: epoch, steps, pending ledger entries, doing, where, quiet,
life, ...), error, stacks ({thread name: frames}; the main thread first).
"""

from __future__ import annotations

import re

from .align import explain
from .conditional import conditional, guarded_call, loop_conditional, or_conditional
from .findings import Finding
from .ledger import describe_entry, first_pending
from .loops import framework_skip
from .metric_sync import stop_on_some_ranks, synced_log_on_some_ranks
from .parting import extra_before_death, second_thread
from .passes import (
    left_before_a_shared_forward,
    left_outer_loop,
    left_then_died,
    skipped_then_died,
)
from .records import Diagnosis, Position, RankRecord
from .stacks import (
    Frame,
    activity,
    blocked_call,
    fmt_frame,
    innermost,
    is_library_file,
    user_frame,
    waits_for_child,
)
from .uneven import left_a_longer_pass, uneven_in_records
from .unwinding import unwinding_error

__all__ = ["diagnose", "rank_position", "CAUSES"]

CAUSES: dict[str, tuple[str, str]] = {
    "uneven_batches": (
        "ranks have different numbers of batches or steps",
        "Give every rank the same number of batches: drop_last=True on the sampler and the "
        "loader, no per-rank filtering after sharding, no skipped steps (or ddpguard's "
        "EvenSampler / make_loader, which guarantee equal counts); or, where uneven inputs are "
        "meant, wrap the loop in torch.distributed.algorithms.Join.",
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
    # What the aligned sequences show (align.py).
    "skipped_backward": (
        "a rank skipped the backward of a step the others are in",
        "Every rank must run the backward of every training forward through the DDP wrapper "
        "(its gradient all-reduce is a collective). Decide to skip a batch on all ranks "
        "together (all_reduce the 'bad batch' flag first), or run backward on a zero loss "
        "(loss * 0) instead of `continue`.",
    ),
    "extra_collective": (
        "a collective issued on some ranks only, where the others are in the DDP model's "
        "forward or backward",
        "Issue that collective on every rank at the same point of the loop (or not at all); "
        "the line below is where the rank that waits issued it.",
    ),
    "second_thread": (
        "a collective issued from a second thread, paired with another rank's training "
        "collectives",
        "Issue collectives from the training thread only, or give the other thread a process "
        "group of its own (dist.new_group, created on every rank in the same order) and issue "
        "its collectives on every rank.",
    ),
    "blocked_outside": (
        "a rank is blocked outside torch (a lock, a queue, a pipe) while a peer waits for it "
        "in a collective",
        "The rank waits for something the waiting peer holds or should provide: release "
        "locks before entering a collective (or take them on every rank in the same order), "
        "and never make a rank wait for a peer through a file lock, queue or pipe while that "
        "peer waits in a collective.",
    ),
    "mismatch": (
        "ranks wait in different collectives at the same point of the sequence",
        "Make every rank issue the same collectives in the same order with the same shapes; "
        "the lines below show where each rank issued its own.",
    ),
    "deadlock": (
        "every rank is blocked in a collective that another rank will never join",
        "Compare the lines below: each rank waits for a collective the others are not in.",
    ),
    "desync": (
        "the ranks ran different collectives under the same sequence number (desync)",
        "Find the collective that only some ranks issue (often a DDP forward on some ranks "
        "only, or a collective under `if rank == 0:`) and make every rank issue it.",
    ),
    "left_early": (
        "a rank left its loop or the program early while the others wait for it",
        "Make every rank run the same number of iterations and collectives before leaving; "
        "break out of loops on all ranks together.",
    ),
    "crashed_rank": (
        "a rank crashed or died while the others wait for it",
        "Fix the error shown for that rank; the other ranks only waited for it.",
    ),
    "loader_stall": (
        "a data loader stopped delivering (dead or deadlocked worker, blocking read)",
        "Check the dataset's __getitem__ and worker processes on the named rank (locks, I/O, "
        "a killed worker); DataLoader(timeout=...) makes a stuck worker raise.",
    ),
    "no_life": (
        "a rank shows no sign of life while the others wait for it",
        "Look at the named rank's line: an endless loop, a wait on a lock, file or socket "
        "that never comes, or a blocking read. The other ranks only waited for it.",
    ),
    "stuck_collective": (
        "every rank waits in the same collective and it never completes",
        "The collective itself does not finish: check the network / NCCL (NCCL_DEBUG=INFO) "
        "and the GPUs of the named ranks.",
    ),
    "hard_limit": (
        "a rank waited longer than the stall timeout you set",
        "Raise --stall-timeout / DDPGUARD_STALL_TIMEOUT if the named rank's work is "
        "expected to take that long; otherwise look at its line.",
    ),
    # Ends the crash path explains (crash.py, ends.py).
    "collective_timeout": (
        "a collective ran out the process group's timeout while a peer was still working",
        "Raise the timeout= argument of init_process_group (ddpguard.init(timeout=...) when "
        "ddpguard forms the group) above the longest step any rank takes alone (the "
        "checkpoint or evaluation at the line shown); NCCL's watchdog and gloo both use it. "
        "Or let the other ranks do that work too instead of waiting in a collective.",
    ),
    "timeout_deadlock": (
        "a collective ran out the process group's timeout while every rank was blocked",
        "The ranks wait in collectives the others are not in (the lines below): make every "
        "rank issue the same collectives in the same order. Raising the timeout would only "
        "make the job hang longer.",
    ),
    "loader_worker_killed": (
        "a DataLoader worker was killed",
        "Out of host memory (the OOM killer): fewer workers (num_workers), a smaller "
        "prefetch_factor, a dataset that loads items lazily instead of holding copies in "
        "every worker, or more memory for the job. Otherwise find who sent the signal (the "
        "scheduler, a kill -9).",
    ),
}

# Seconds without life that make a call outside torch "blocked in" rather than "computing".
_STILL = 1.0

_BUFFER_SYNC = frozenset({"_sync_buffers", "_sync_module_buffers", "_default_broadcast_coalesced",
                          "_distributed_broadcast_coalesced", "_sync_params_and_buffers"})


def _error_frame(error: str) -> Frame | None:
    """The frame named by a crash record's text ('ValueError: bad batch at /x/train.py:31')."""
    m = re.search(r" at (\S.*):(\d+)$", error)
    if not m:
        return None
    import linecache

    path, line = m.group(1), int(m.group(2))
    return {"file": path, "line": line, "func": "",
            "code": linecache.getline(path, line).strip()}


def rank_position(rec: RankRecord) -> Position:
    """Where a rank is, from the ledger when it waits in a collective, else from its stack."""
    hb = rec.get("hb") or {}
    stacks = rec.get("stacks") or {}
    main: list[Frame] = next(iter(stacks.values()), []) if stacks else []
    kind, text = activity(main) if main else (hb.get("kind", "unknown"),
                                                hb.get("doing") or "no stack (process gone?)")
    uf = user_frame(main) if main else None
    if uf is None and rec.get("state") == "crashed":
        # A rank whose stacks never arrived (it exited right after its error) still said
        # where its error was raised: that is where it stands, not its last heartbeat's place.
        uf = _error_frame(rec.get("error") or "")
    where = fmt_frame(uf) if uf else hb.get("where", "?")
    first = first_pending(hb.get("pending") or [])
    issued = (rec.get("issued") or {}).get(f"{first[0]}/{first[1]}") if first else None
    if issued:
        # It waits somewhere else (Work.wait, a poll, a synchronise) for a collective issued
        # here: the issuing line is the one the user must look at.
        m = re.match(r"(.+):(\d+) in (.+)$", issued)
        if m:
            uf = {"file": m.group(1), "line": int(m.group(2)), "func": m.group(3),
                  "code": (rec.get("issued_code") or {}).get(issued, "")}
            where = f"{fmt_frame(uf)} (waits for it at {where})"
    # A training thread that sits in one call outside torch showing no life for a settle
    # interval waits in it (a lock, a queue, a read): a call burning CPU counts as life.
    blocked_in = (blocked_call(main) if main and first is None and kind == "running"
                  and float(hb.get("quiet", 0.0)) >= _STILL and not hb.get("spinning")
                  else None)
    if rec.get("state") == "dead" and not rec.get("stacks") and hb.get("steps") is not None:
        # Killed with no dump (SIGKILL): where it stood is its last heartbeat's place, which
        # it may have left since; say so rather than "died at" a line it had left.
        doing = "died with no stack; last seen"
    elif rec.get("state") not in (None, "running"):
        doing = {"exited": "exited", "crashed": "crashed", "dead": "died",
                 "missing": "never answered"}.get(rec["state"], rec["state"])
    elif first is not None:
        doing = f"waiting in {describe_entry(first)}"
    elif hb.get("blocked"):
        doing = f"waiting {text}"
    elif blocked_in:
        doing = f"blocked in {blocked_in} (no CPU for {float(hb.get('quiet', 0.0)):.0f} s)"
    elif hb.get("spinning") and kind == "running":
        doing = (f"spinning in a loop, burning CPU with no sign of progress for "
                 f"{float(hb.get('quiet', 0.0)):.0f} s")
    else:
        doing = f"computing ({text})" if kind == "running" else text
    # DDP's buffer broadcast (what a forward on some ranks only hangs in), as opposed to its
    # one-time bucket rebuild at the start of a training forward.
    buffer_sync = any(f["func"] in _BUFFER_SYNC and "torch/nn/parallel/distributed.py"
                      in f["file"].replace("\\", "/") for f in main)
    # Every user frame, outermost first: a wait inside a helper (`finish(work)`) was called
    # from the line that matters (`if rank == 0: finish(dist.barrier(async_op=True))`).
    callers = [(f["file"], f["line"]) for f in main if not is_library_file(f["file"])]
    return {"kind": kind, "doing": doing, "user": where, "buffer_sync": buffer_sync,
            "user_line": (uf["file"], uf["line"]) if uf else None, "callers": callers,
            "innermost": fmt_frame(innermost(main)) if main else "?",
            "pending": describe_entry(first) if first else None, "blocked_in": blocked_in,
            "child_wait": bool(blocked_in) and waits_for_child(main)}


def _blocked_outside(records: list[RankRecord], pos: dict[int, Position],
                     culprits: list[int]) -> Finding | None:
    """A rank others wait for sits in a call outside torch with no life (a lock, a queue, a
    pipe) while a peer waits in a collective."""
    waiting = [r["rank"] for r in records if pos[r["rank"]]["pending"]]
    for c in culprits:
        p = pos.get(c)
        # Waiting for a child process that shows no life is the child's stall: no_life.
        if p is not None and p.get("blocked_in") and not p.get("child_wait") and waiting:
            w = waiting[0]
            return Finding("blocked_outside", (
                f"rank {c} is {p['doing']} at {p['user']}, a call outside torch that uses no "
                f"CPU, while rank {w} waits for it in {pos[w]['pending']} at {pos[w]['user']}"
            ), (c,))
    return None


def _refine(cause: str, records: list[RankRecord], pos: dict[int, Position],
            culprits: list[int], sources: dict[str, list[str]]) -> tuple[str, Finding | None]:
    """A more specific cause, only where the evidence shows it: first what the ranks'
    aligned collective sequences show (align.py), then the lines' own evidence."""
    # Heartbeats that carry the loop counters can be aligned; older reports fall back to the
    # evidence of the stacks alone.
    aligned = any("backwards" in (r.get("hb") or {}) for r in records)
    if cause not in ("crashed_rank", "collective_timeout", "loader_worker_killed"):
        found = (synced_log_on_some_ranks(records, sources)  # Lightning's sync: its self.log
                 or stop_on_some_ranks(records)  # Lightning's should_stop set by one rank
                 or unwinding_error(records))  # an error unwinding through a cleanup's collective
        if found:
            return found.cause, found
    if cause in ("no_life", "hard_limit"):
        found = _blocked_outside(records, pos, culprits)
        if found:
            return found.cause, found
    if cause == "peer_gone":
        # The rank that ran out of batches and left may decide first (it saw its peer wait
        # in a collective it never issued): the loaders' proof still names the cause.
        uneven = uneven_in_records(records) or left_a_longer_pass(records, sources)
        if uneven is not None:
            return "uneven_batches", Finding("uneven_batches", uneven.reason, uneven.finished)
        states = {r["state"] for r in records if r["rank"] in culprits}
        for r in records:
            line = (framework_skip(str(r.get("error") or (r.get("hb") or {}).get("error") or ""),
                                   sources) if r["rank"] in culprits else None)
            if line is not None:
                # The framework stopped the rank that skipped (plain DDP would have hung):
                # the skip is the bug, the crash only its framework's way of saying so.
                return "skipped_backward", Finding("skipped_backward", (
                    f"rank {r['rank']} skipped the backward of a step: its training_step "
                    "returned None there, and Lightning ended it (a step skipped on some "
                    "ranks only is not allowed under DDP)"
                    + (f"; the step returns None at {line}" if line else "")), (r["rank"],))
        # A peer that left or died is the strongest evidence: it outranks guesses from what
        # the waiting ranks were doing; the alignment may still say why it left.
        if aligned and states <= {"exited"}:
            found = explain(records, pos, sources)
            if found and found.cause in ("skipped_backward", "forward_on_some_ranks",
                                         "left_early"):
                found = left_before_a_shared_forward(found, records, sources)
                return found.cause, found
        if states <= {"exited"}:
            # From the lines alone (no loader or DDP counters needed): the loop the rank
            # that exited had left while its peer waits inside it.
            found = left_outer_loop(records, pos, sources)
            if found:
                return found.cause, found
        if aligned and states & {"dead", "crashed"}:
            found = extra_before_death(records, pos)
            if found:
                return or_conditional(found, records, pos, sources)
        if not aligned:
            # A waiting rank in DDP's buffer broadcast with the module in eval mode is
            # evaluating through the wrapper on its own; the peer that left had finished.
            for r in records:
                p = pos[r["rank"]]
                if (r["state"] == "running" and p["buffer_sync"]
                        and r.get("ddp_training") is False):
                    return "forward_on_some_ranks", None
        return ("left_early" if states <= {"exited"} else "crashed_rank"), None
    if cause == "desync":
        found = second_thread(records)
        return (found.cause, found) if found else (cause, None)
    if cause == "mismatch" and any(r["state"] in ("dead", "crashed") for r in records):
        # A rank that ran out of batches went on past its loop and was aborted there by the
        # transport: its shorter loader, not the pair that differed, is the cause.
        uneven = left_a_longer_pass(records, sources)
        if uneven is not None:
            return "uneven_batches", Finding("uneven_batches", uneven.reason, uneven.finished)
        found = left_then_died(records, pos, sources) or (
            None if aligned else skipped_then_died(records, pos, sources))
        if found:
            return found.cause, found
    if cause in ("mismatch", "deadlock", "no_life", "hard_limit"):
        if aligned and cause in ("mismatch", "deadlock"):
            found = explain(records, pos, sources)
            if found is not None and found.cause == "forward_on_some_ranks":
                found = loop_conditional(found, records, pos, sources) or found
            if found is not None:
                return or_conditional(found, records, pos, sources)
        if not aligned:
            for r in records:
                p = pos[r["rank"]]
                pend = p.get("pending") or ""
                if pend.startswith("broadcast") and p["kind"] == "ddp_forward" \
                        and p["buffer_sync"]:
                    return "forward_on_some_ranks", None
        where = conditional(records, pos, sources)
        if where:
            return "conditional_collective", guarded_call(where, records, pos, sources)
    if cause == "no_life" and any(pos[r]["kind"] == "dataloader" for r in culprits if r in pos):
        return "loader_stall", None
    return cause, None


def diagnose(records: list[RankRecord], sources: dict[str, list[str]] | None = None,
             cause: str = "deadlock", reason: str = "",
             culprits: list[int] | None = None) -> Diagnosis:
    """{cause, title, explanation, fix, culprits, positions} for the guard's decision."""
    sources = sources or {}
    culprits = list(culprits or [])
    pos = {r["rank"]: rank_position(r) for r in records}
    if cause == "peer_gone" and "called from a second thread" in reason:
        # The peer was aborted inside a collective its second thread issued: that thread's
        # collective, paired with another rank's training collective, is the cause.
        cause = "second_thread"
    elif cause == "peer_gone" and "a collective the other ranks did not match" in reason:
        # The peer was aborted by the transport inside a collective (gloo's size check):
        # the mismatch is the cause, its death only the consequence.
        cause = "mismatch"
    final, found = _refine(cause, records, pos, culprits, sources)
    explanation = f"{reason}." if reason and not reason.endswith(".") else reason
    if found is not None:
        # What the alignment shows comes first; the guard's own decision follows.
        explanation = f"{found.text[0].upper()}{found.text[1:]}. {explanation}"
        culprits = list(found.culprits)
    title, fix = CAUSES.get(final, CAUSES["deadlock"])
    return {"cause": final, "title": title, "explanation": explanation.strip(), "fix": fix,
            "culprits": culprits, "positions": {str(k): v for k, v in pos.items()}}
