"""What one rank publishes every tick: the schema in one place. Heartbeats travel as JSON
through the store, so readers see plain dicts; this TypedDict says which keys they may read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from .ledger import Entry

__all__ = ["Heartbeat", "LoaderInfo", "PeerView"]


class LoaderInfo(TypedDict):
    """One `for` site's current pass (progress.LoaderState)."""

    epoch: int
    batches: int
    len: int | None
    key: str | None
    at: str | None              # the line that created the loader
    end: str                    # "" open, "stop" ran out (StopIteration), "drop" left early
    seq0: dict[str, int]        # group -> last collective enqueued when the pass began
    done: list[list[Any]]       # recent passes that ran out: [key, len, batches]
    short: list[int] | None     # the first pass left before its end: [pass, batches, len]


class Heartbeat(TypedDict, total=False):
    # Progress (progress.Progress.snapshot)
    epoch: int
    steps: int
    steps_epoch: int
    batches: int
    forwards: int
    train_forwards: int         # forwards in training mode with gradients on
    backwards: int              # calls of torch.autograd.backward
    forward_lines: dict[str, int]  # user file:line -> forwards through the wrapper there
    synced_logs: dict[str, int]  # user file:line -> Lightning self.log(sync_dist=True) calls
    stop_requests: dict[str, int]  # user file:line -> Lightning trainer.should_stop = True
    epoch_batches: int
    epoch_len: int | None
    loaders: dict[str, LoaderInfo]
    # Who and when
    rank: int
    pid: int
    host: str
    seq: int                    # bumped on every publish: a peer's silence is an unchanged seq
    t: float                    # wall clock
    state: str                  # running | exited | crashed
    error: str | None
    mismatch: str | None        # the loader-length notice, if lengths differed
    # The ledger and waiting
    ledger: Mapping[str, Sequence[int]] | None  # group -> [last enqueued, last completed]
    blocked: bool
    blocked_for: float
    pending: list[Entry]        # ledger entries it waits on (at most 8), when blocked
    # Life and position
    quiet: float                # seconds without a sign of life (waiting counts as quiet)
    life: str                   # kind of the latest sign of life
    spinning: bool              # a loop burning CPU in its own bytecode (life.py)
    doing: str
    kind: str
    where: str                  # the training thread's user file:line
    # For the survivors when this rank dies of a fatal signal (fault.py)
    fault: str | None
    main: int | None


class PeerView(Heartbeat, total=False):
    """A heartbeat as the rules read it (peers.PeerTable.views): with whether that rank is
    gone, and how to say it."""

    gone: bool
    state_text: str
