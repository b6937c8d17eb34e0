"""The guard: a daemon thread per rank that publishes a heartbeat through the rendezvous store
(progress, its collective ledger, signs of life, where its training thread is), reads every
rank's, and stops the job only on proof of a deadlock or on a stall with no sign of life.

No collective is ever issued: the training thread only bumps counters; the store traffic (one
small write and a few reads per heartbeat interval) and every /proc or flight-recorder read
happen on this thread.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Any

from .board import Board
from .config import GuardConfig
from .exchange import Exchange
from .failing import Failure
from .fault import FaultLog
from .heartbeat import Heartbeat, PeerView
from .hooks import install_hooks, uninstall_hooks
from .issued import IssueSites
from .lanes import Lanes
from .leaving import on_leave
from .ledger import (
    Entry,
    Ledger,
    describe_entry,
    first_pending,
    started_on_device,
    waiting_on_peers,
)
from .lengths import LengthCheck
from .life import LifeSignals
from .notices import Notices
from .peers import PeerTable
from .progress import Progress
from .report import LAUNCH_ENV
from .rules import Decision, decide
from .stacks import (
    Frame,
    activity,
    blocked_call,
    capture_thread,
    fmt_frame,
    is_blocked,
    stands_in_collective,
    user_frame,
)
from .store import GuardStore
from .waiting import setup_entry, setup_wait, waits_now

__all__ = ["Guard"]

log = logging.getLogger("ddpguard.guard")
PREFIX = "ddpguard/guard/"


class Guard:
    """One rank's watchdog. `start()` after the process group formed; `stop()` before leaving."""

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int,
                 config: GuardConfig | None = None, run_id: str | None = None,
                 shared_store: Any = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.addr = master_addr
        self.port = master_port
        self.shared_store = shared_store  # cloned instead of a TCPStore client (file://)
        self.config = config or GuardConfig.from_env()
        rid = run_id or os.environ.get("TORCHELASTIC_RUN_ID") or "local"
        self.run_id = f"{rid}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self.prefix = f"{PREFIX}{self.run_id}/"
        self.progress = Progress()
        self.state = "running"
        self.error: str | None = None
        self.host = socket.gethostname()
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Connected at start(); the helpers below hold this handle, not the guard.
        self.store = GuardStore(None, self.prefix)
        self.board = Board(self.store, rank, world_size, self.config.heartbeat_interval)
        main = threading.main_thread()
        self._main_ident = main.ident
        self.ledger = Ledger(self.config.ledger)
        self.life = LifeSignals(main.ident, getattr(main, "native_id", None))
        self.lanes = Lanes()
        self.fault_log = FaultLog()
        self.issue_sites = IssueSites(note=self.fault_log.note)
        self.status: dict[str, tuple[int, int]] = {}
        self.status_since = time.monotonic()
        self._pending: list[Entry] = []
        self._pending_key: Any = None
        self._blocked_since: float | None = None
        self._frames: list[Frame] = []
        self._doing = ("running", "starting")
        self._where = "?"
        self.leave_site: str | None = None  # the line that left (sys.exit, destroy), if known
        self._waiting: str | None = None
        self._setup: str | None = None
        self._waiting_since: float | None = None
        self.notices = Notices(self.config.notice_after, self.config.no_life)
        self.peers = PeerTable(rank, self.host, self.config.heartbeat_interval,
                               self.config.dead_after)
        self.exchange = Exchange(self.store, self.ledger, rank, world_size, self.config)
        self.lengths = LengthCheck(self.store, self.ledger, rank, world_size, self.config)
        self.failure = Failure(self)

    # -- lifecycle --------------------------------------------------------------------------

    def client(self) -> Any:
        import torch.distributed as dist

        timeout = timedelta(seconds=max(5.0, self.config.dead_after))
        if self.shared_store is not None:
            # A connection of its own to the group's FileStore: the group's timeout (30 min by
            # default) must not hold the guard's reads.
            own = self.shared_store.clone()
            own.set_timeout(timeout)
            return own
        return dist.TCPStore(self.addr, self.port, is_master=False, timeout=timeout,
                             wait_for_workers=False)

    def start(self) -> Guard:
        self.store.attach(self.client())
        self.board.create()
        self.progress.on_epoch = self.lengths.on_pass
        install_hooks(self.progress)
        self.issue_sites.install()
        self.fault_log.start(self.config.report_dir, self.run_id, self.rank, self.world_size,
                             self._main_ident, os.environ.get(LAUNCH_ENV))
        self._publish()
        self.board.await_peers(max(30.0, self.config.dead_after))
        self.board.watch_from()
        self._thread = threading.Thread(target=self._run, name="ddpguard-guard", daemon=True)
        self._thread.start()
        return self

    def stop(self, state: str = "exited", error: str | None = None) -> None:
        """Publish the final state (peers then know this rank left on purpose) and join."""
        if self.state == "running" and state == "exited" and self._thread is not None:
            # Peers learn at once that this rank left on purpose (a rank waiting for it has
            # proof), before the final comparison below takes its few seconds.
            self.state = "exited"
            try:
                self._publish()
            except Exception as exc:
                log.debug("exit heartbeat not written: %s", exc)
            found = on_leave(self)
            if found:
                self._stop.set()
                if self._thread is not None:
                    self._thread.join(timeout=5)
                if isinstance(found, Decision):
                    self.failure.fail(found, self.read_peers())
                else:  # another rank is stopping the job: leave with it, exit 17
                    self.failure.follow(found, self.read_peers())
        if self.state == "running":
            self.state, self.error = state, error
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self.config.heartbeat_interval + 5)
        uninstall_hooks(self.progress)
        self.issue_sites.uninstall()
        self.fault_log.stop()
        self.lanes.add(time.time(), state, f"{state}" + (f": {error}" if error else ""))
        try:
            self._publish()
        except Exception as exc:  # the store host may already be gone at exit
            log.debug("final heartbeat not written: %s", exc)
        if self.shared_store is not None:
            # A FileStore's file is removed when its last connection closes: the guard's own
            # must close too, or the next run would find a stale file to rendezvous on.
            self.store.attach(None)

    # -- store access (guard thread, and the failure path) -------------------------------------

    def _st(self) -> GuardStore:
        if not self.store.connected:
            raise RuntimeError("the guard has not started: no store connection")
        return self.store

    def store_set(self, key: str, value: Any) -> None:
        self._st().set(key, value)

    def store_get_many(self, keys: list[str], partial: bool = True) -> dict[str, Any]:
        """The keys that are set, decoded; missing ones left out."""
        return self._st().get_many(keys, partial=partial)

    def store_first(self, key: str, value: Any) -> Any:
        """Set `key` unless another rank did first; returns the value that won."""
        return self._st().first(key, value)

    def store_add(self, key: str, n: int) -> int:
        return self._st().add(key, n)

    def store_delete(self, key: str) -> None:
        self._st().delete(key)

    # -- heartbeats -------------------------------------------------------------------------

    def heartbeat(self) -> Heartbeat:
        """This rank's heartbeat; its keys are those of `heartbeat.Heartbeat` (a test keeps
        the two in step)."""
        snap = self.progress.snapshot()
        now = time.monotonic()
        snap.update(Heartbeat(
            rank=self.rank, pid=os.getpid(), host=self.host, seq=self._seq, state=self.state,
            error=self.error, mismatch=self.lengths.mismatch, t=time.time(),
            ledger=self.status if self.ledger.available else None,
            blocked=self._blocked_since is not None,
            blocked_for=now - self._blocked_since if self._blocked_since is not None else 0.0,
            pending=self._pending if self._blocked_since is not None else [],
            quiet=self.quiet_for(now), life=self.life.last_kind, spinning=self.life.spinning,
            doing=self._doing[1], kind=self._doing[0],
            # Leaving, the guard thread's ticks see no stack: the line that left says where.
            where=self.leave_site if self.state == "exited" and self.leave_site else self._where,
            fault=self.fault_log.path, main=self._main_ident))
        return snap

    def pending_entries(self) -> list[Entry]:
        """The ledger entries this rank waits for (empty unless it is blocked)."""
        return list(self._pending)

    def waiting_call(self) -> str | None:
        """The wait the training thread stands in for an issued collective, if any."""
        return self._waiting

    def quiet_for(self, now: float) -> float:
        """Seconds without a sign of life; time spent waiting for an issued collective is
        quiet time even when the wait spins a core."""
        quiet = self.life.quiet_for(now)
        if self._waiting_since is not None:
            quiet = max(quiet, now - self._waiting_since)
        return quiet

    def _publish(self) -> None:
        self._seq += 1
        hb = self.heartbeat()
        self.fault_log.seen(hb)
        self.store_set(f"hb/{self.rank}", hb)

    def read_peers(self) -> dict[int, Heartbeat]:
        """Every rank's heartbeat (the judge every tick; other ranks only on the failure
        path)."""
        self._st()
        return self.board.heartbeats()

    # -- observing this rank ----------------------------------------------------------------

    def _observe(self, now: float) -> None:
        frames = capture_thread(self._main_ident) if self._main_ident else []
        self._frames = frames
        self._doing = activity(frames) if frames else ("running", "not started")
        self._where = fmt_frame(user_frame(frames)) if frames else "?"
        if self._doing[0] == "running" and self.life.quiet_for(now) >= self.config.settle:
            # Sitting in one call outside torch with no life (a lock, a queue, a read) is not
            # computing: say where it is blocked (notices and reports quote this text).
            call = blocked_call(frames)
            if call is not None and not self.life.spinning:
                self._doing = ("running", f"blocked in {call}")
        completed = 0
        if self.ledger.available:
            try:
                status = self.ledger.status()
            except Exception as exc:  # torch changed under us: stacks only from now on
                log.debug("flight recorder read failed: %s", exc)
                self.ledger.available = False
                status = {}
            if status != self.status:
                self.status, self.status_since = status, now
            completed = sum(c for _, c in status.values())
        # Forming a group or a store-based barrier: a wait the recorder does not list.
        self._setup = setup_wait(frames) if frames else None
        if self.ledger.available:
            recorded = waiting_on_peers(self.status, self.ledger.started)
            # Standing in a wait for an issued collective (Work.wait, a poll on
            # is_completed, a device synchronise) is waiting, however much CPU it spins.
            self._waiting = waits_now(self._main_ident) if recorded else None
            # Where the device reports the start (NCCL) that is the proof; where it does not
            # (gloo), the thread's own stack must stand in the collective.
            pending = self._setup is not None or (recorded and (
                started_on_device(self.status, self.ledger.started)
                or stands_in_collective(recorded, self._doing[0], frames, self._waiting)))
        else:
            pending = is_blocked(frames)
        # In a collective, only the training thread's own signs count (life.py says why).
        self.life.sample(self.progress.total() + completed, now, waiting=pending)
        self._where = self.life.poll_at or self._where  # a stuck busy-wait: its loop's line
        settle = self.config.settle
        quiet = self.life.quiet_for(now) >= settle
        if self.ledger.available:
            if self._waiting is None:
                self._waiting_since = None
            elif self._waiting_since is None:
                self._waiting_since = now
            blocked = (pending and now - self.status_since >= settle
                       and (quiet or self._waiting is not None))
            if self._waiting is not None and self._doing[0] == "running":
                self._doing = ("collective:wait", f"waiting in {self._waiting}() for a "
                               "collective it issued")
        else:
            blocked = is_blocked(frames) and quiet
        if blocked:
            if self._blocked_since is None:
                self._blocked_since = now - settle
            key = (self.status, self._setup)
            if self.ledger.available and self._pending_key != key:
                self._pending_key = key
                self._pending = self._read_pending()
                if self._setup is not None:
                    self._pending.insert(0, setup_entry(self._setup))
        else:
            self._blocked_since = None
            self._pending, self._pending_key = [], None
        self._record_lane()

    def _read_pending(self) -> list[Entry]:
        try:
            entries = self.ledger.entries()
        except Exception as exc:
            log.debug("flight recorder entries unreadable: %s", exc)
            return []
        out = [e for e in entries
               if e[0] in self.status and self.status[e[0]][1] < e[1] <= self.status[e[0]][0]]
        return out[:8]

    def _record_lane(self) -> None:
        t = time.time()
        if self._blocked_since is not None:
            first = first_pending(self._pending)
            label = (f"in {describe_entry(first)}" if first else self._doing[1])
            since = t - (time.monotonic() - self._blocked_since)
            self.lanes.add(t, "collective", f"{label} at {self._where}", since=since)
        elif self._doing[0] == "dataloader":
            self.lanes.add(t, "loader", f"waiting for a batch at {self._where}")
        else:
            self.lanes.add(t, "computing", f"{self._doing[1]} at {self._where}")

    # -- the monitor loop ---------------------------------------------------------------------

    def _run(self) -> None:
        store_failed_at: float | None = None
        while not self._stop.wait(self.config.heartbeat_interval):
            try:
                self._tick()
                store_failed_at = None
            except Exception as exc:  # the watchdog must never take training down by itself
                now = time.monotonic()
                if store_failed_at is None:
                    store_failed_at = now
                    log.debug("guard store access failed: %s", exc)
                elif (now - store_failed_at > self.config.dead_after
                      and self._blocked_since is not None):
                    self.failure.fail(Decision(
                        "peer_gone", "the rendezvous store became unreachable (the rank or "
                        "launcher hosting it is gone) while this rank waits in a collective"),
                        {}, store_lost=True)

    def _tick(self) -> None:
        now = time.monotonic()
        self._observe(now)
        self._publish()
        control = self.board.poll(now)
        trigger = control.get("trigger")
        if trigger:
            self.failure.follow(trigger, {})
            return
        self.exchange.serve(control)
        self.lengths.check()
        peers: dict[int, Heartbeat] = {}
        decision: Decision | None = None
        if self.board.judging(now):
            # Only the judge reads every heartbeat: traffic per tick stays linear in W.
            peers = self.read_peers()
            self.board.publish()
            decision = self.exchange.check(peers)
            views = self._views(peers, now)
            if decision is None:
                decision = decide(views, self.world_size,
                                  grace=self.config.grace, no_life=self.config.no_life,
                                  hard_limit=self.config.stall_timeout,
                                  fallback_deadlock=self.config.fallback_deadlock)
            if decision is None:
                self.notices.maybe(views)
        if decision is not None:
            if not peers:
                peers = self.read_peers()
            self.failure.fail(decision, peers)

    def _views(self, peers: dict[int, Heartbeat], now: float) -> dict[int, PeerView]:
        return self.peers.views(peers, self.heartbeat(), self.world_size, now)

    def stale_for(self, r: int, now: float) -> float:
        """Seconds since rank r's heartbeat last changed (0 for this rank)."""
        return self.peers.stale_for(r, now)

    def peer_gone(self, r: int, hb: Heartbeat, now: float) -> tuple[bool, str]:
        """Is rank r gone (exited, crashed, dead), and how to say it."""
        return self.peers.gone(r, hb, now)

    def oom_text(self) -> str:
        return self.peers.oom_text()
