"""Lightning's synced metrics: `self.log(name, value, sync_dist=True)` all-reduces the value
later, from Lightning's own code (at the end of the step or epoch), on every rank that logged
it. Logged under `if self.trainer.is_global_zero:`, rank 0 alone all-reduces, and no user line
is on its stack while it waits. The line comes from each rank's count of such calls per user
line (hooks.py); the finding is pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .conditional import in_conditional
from .findings import Finding, file_line
from .records import RankRecord

__all__ = ["in_metric_sync", "stop_on_some_ranks", "synced_log_on_some_ranks"]

# Lightning's result collection computes (and syncs) logged metrics here.
_SYNC_FILES = ("logger_connector/result.py",)


def in_metric_sync(frames: Sequence[Mapping[str, object]]) -> bool:
    """Does the stack wait inside Lightning's sync of a logged metric?"""
    return any(str(f.get("file", "")).replace("\\", "/").endswith(_SYNC_FILES)
               for f in frames)


def synced_log_on_some_ranks(records: Sequence[RankRecord],
                             sources: Mapping[str, list[str]]) -> Finding | None:
    """Rank a waits in Lightning's metric sync, and a user line logged with sync_dist on a
    was never called on some peer b: that self.log is the collective b will not join."""
    logs = {int(r["rank"]): (r.get("hb") or {}).get("synced_logs") or {} for r in records}
    for r in records:
        a = int(r["rank"])
        main = next(iter((r.get("stacks") or {}).values()), [])
        if r.get("state") != "running" or not main or not in_metric_sync(main):
            continue
        for line in sorted(logs[a]):
            missing = [b for b in sorted(logs) if b != a and not logs[b].get(line)]
            if not missing:
                continue
            where = file_line(line)
            src = sources.get(where[0]) if where else None
            guarded = bool(where and src and in_conditional(src, where[1]))
            cause = "conditional_collective" if guarded else "extra_collective"
            return Finding(cause, (
                f"rank {a} waits in Lightning's sync of a metric logged with sync_dist=True at "
                f"{line} ({logs[a][line]} call{'s' if logs[a][line] != 1 else ''} there); rank "
                f"{', '.join(map(str, missing))} never logged there"
                + (", under a test of which rank this is" if guarded else "")
                + ": Lightning all-reduces a synced metric on every rank that logged it, so "
                "log it on every rank, or use rank_zero_only=True instead of sync_dist there"),
                (a,), where)
    return None


def stop_on_some_ranks(records: Sequence[RankRecord]) -> Finding | None:
    """Some ranks' code set Lightning's `trainer.should_stop = True` and others' never did:
    Lightning ends the epoch loop of a rank that sets it, alone."""
    asked = {int(r["rank"]): (r.get("hb") or {}).get("stop_requests") or {} for r in records}
    setters = [r for r in sorted(asked) if asked[r]]
    others = [r for r in sorted(asked) if not asked[r]]
    if not setters or not others:
        return None
    r = setters[0]
    line = next(iter(asked[r]))
    return Finding("left_early", (
        f"rank {r} set trainer.should_stop = True at {line} on its own (rank "
        f"{', '.join(map(str, others))} never did): Lightning ends the epoch loop of a rank "
        "that sets it, at once and alone, while the others go on to their next collective; "
        "decide the stop on every rank together (reduce the decision with "
        "self.trainer.strategy.reduce_boolean_decision, or let the EarlyStopping callback, "
        "which reduces it, set the flag)"), (r,), file_line(line))
