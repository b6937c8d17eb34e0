"""The records the stop path hands across processes and into the report: what a rank
contributes when the job stops (`RankDump`, through the store as JSON), each rank's record
in the report (`RankRecord`), the diagnosis (`Diagnosis`, with a `Position` per rank) and
the report itself (`Report`, the JSON file). TypedDicts: plain dicts at run time, so the
JSON on disk and in the store is exactly what the code builds; mypy checks the keys."""

from __future__ import annotations

from typing import Any, TypedDict

from .heartbeat import Heartbeat
from .stacks import Frame

__all__ = ["SeqEntry", "Trigger", "RankDump", "RankRecord", "Position", "Diagnosis", "Report"]


class SeqEntry(TypedDict):
    """One collective of a rank's recent sequence, placed in its loop (sequence.py); align.py
    lines the ranks' sequences up."""

    g: str            # process group
    seq: int          # its sequence number in that group
    op: str
    sig: str          # what must agree across ranks (ledger.signature), as text
    desc: str         # 'all_reduce #57 (group 0) 65 Float'
    done: bool
    phase: str        # forward | backward | loop (timeline.py)
    epoch: int
    batches: int
    fwd: int
    tfwd: int
    bwd: int
    steps: int
    thread: str       # '' for the training thread, else the issuing Python thread's name
    line: str | None  # where the rank's own code issued it, when known


class Trigger(TypedDict):
    """The store's `trigger` key: the first rank to decide a stop sets it (failing.py), the
    others follow it."""

    by: int
    cause: str
    reason: str


class RankDump(TypedDict, total=False):
    """What one rank adds when the job stops (failing.py); a rank that died in native code
    leaves only `stacks` (from its fault log) and its last `hb`."""

    stacks: dict[str, list[Frame]]  # thread name -> frames, the training thread first
    lanes: list[list[Any]]           # lanes.Lanes.export: [t0, t1, kind, label]
    hb: Heartbeat
    issued: dict[str, str]           # 'group/seq' -> where it was issued (issued.py)
    ddp_training: bool | None        # ddpstate.ddp_training
    sequence: list[SeqEntry]         # its recent collectives placed in its loop (sequence.py)
    unwinding: str | None            # the error its training thread is unwinding (unwinding.py)


class RankRecord(TypedDict, total=False):
    """One rank in the report (assemble.py); `diagnose` reads these."""

    rank: int
    state: str                       # running | exited | crashed | dead | missing
    hb: Heartbeat
    error: str | None
    stacks: dict[str, list[Frame]] | None
    issued: dict[str, str]
    issued_code: dict[str, str]      # where-issued -> its source line, when known
    ddp_training: bool | None
    sequence: list[SeqEntry]
    lanes: list[list[Any]]
    unwinding: str | None


class Position(TypedDict, total=False):
    """Where a rank is (diagnose.rank_position gives every key; the alignment reads a rank
    without one as an empty position)."""

    kind: str
    doing: str
    user: str
    buffer_sync: bool
    user_line: tuple[str, int] | None
    callers: list[tuple[str, int]]
    innermost: str
    pending: str | None
    blocked_in: str | None
    child_wait: bool


class Diagnosis(TypedDict):
    cause: str
    title: str
    explanation: str
    fix: str
    culprits: list[int]
    positions: dict[str, Position]   # str(rank) -> where it is


class Report(TypedDict, total=False):
    """The JSON report: what assemble builds; write_json adds version, launch_id and
    attempt; a partial report carries `partial`, one finished by the launcher `notes`."""

    version: int
    launch_id: str | None
    attempt: int
    event: str
    reason: str
    proof: bool
    created: float
    t_start: float
    run_id: str
    reporter_rank: int | None        # None: composed by `ddpguard run` (launch/postmortem.py)
    world_size: int
    diagnosis: Diagnosis
    ranks: list[RankRecord]
    config: dict[str, Any]           # GuardConfig's fields
    partial: bool
    finished_by: str                 # 'launcher' (verdict.finish_partial)
    notes: list[str]
