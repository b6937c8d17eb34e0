"""What the stop protocol (failing.py) and the crash path (crash.py) need of a rank's guard,
as a Protocol: they depend on this, not on the monitor, so no module of the package imports
the monitor back (tests/guard/test_guard_layers.py checks it)."""

from __future__ import annotations

from typing import Any, Protocol

from .config import GuardConfig
from .fault import FaultLog
from .heartbeat import Heartbeat
from .issued import IssueSites
from .lanes import Lanes
from .ledger import Entry, Ledger
from .peers import PeerTable
from .progress import Progress

__all__ = ["GuardHandle"]


class GuardHandle(Protocol):
    rank: int
    world_size: int
    host: str
    run_id: str
    config: GuardConfig
    ledger: Ledger
    lanes: Lanes
    peers: PeerTable
    issue_sites: IssueSites
    fault_log: FaultLog
    progress: Progress

    def heartbeat(self) -> Heartbeat: ...
    def read_peers(self) -> dict[int, Heartbeat]: ...
    def pending_entries(self) -> list[Entry]: ...
    def waiting_call(self) -> str | None: ...
    def store_set(self, key: str, value: Any) -> None: ...
    def store_get_many(self, keys: list[str], partial: bool = True) -> dict[str, Any]: ...
    def store_first(self, key: str, value: Any) -> Any: ...
