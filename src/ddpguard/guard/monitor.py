"""The guard: a daemon thread per rank that publishes a heartbeat through the rendezvous store
(progress, its collective ledger, signs of life, where its training thread is), reads every
rank's, and stops the job only on proof of a deadlock or on a stall with no sign of life.

No collective is ever issued: the training thread only bumps counters; the store traffic (one
small write and a few reads per heartbeat interval) and every /proc or flight-recorder read
happen on this thread.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Any

from . import channel, procs
from .config import GuardConfig
from .exchange import Exchange
from .failing import Failure
from .lanes import Lanes
from .ledger import Ledger, describe_entry, first_pending
from .lengths import LengthCheck
from .life import LifeSignals
from .progress import Progress, install_hooks, uninstall_hooks
from .rules import Decision, decide, notice_due
from .stacks import activity, capture_thread, fmt_frame, is_blocked, user_frame

__all__ = ["Guard"]

log = logging.getLogger("ddpguard.guard")
PREFIX = "ddpguard/guard/"
LIFE_WORDS = {"progress": "last sign of life: batches, steps or collectives",
              "io": "last sign of life: reading or writing data",
              "stack": "last sign of life: its code moving between functions",
              "cpu": "last sign of life: computing inside one call",
              "start": "no sign of life since the guard started"}


class Guard:
    """One rank's watchdog. `start()` after the process group formed; `stop()` before leaving."""

    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int,
                 config: GuardConfig | None = None, run_id: str | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.addr = master_addr
        self.port = master_port
        self.config = config or GuardConfig.from_env()
        rid = run_id or os.environ.get("TORCHELASTIC_RUN_ID") or "local"
        self.run_id = f"{rid}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self.prefix = f"{PREFIX}{self.run_id}/"
        self.progress = Progress()
        self.state = "running"
        self.error: str | None = None
        self.mismatch: str | None = None
        self.host = socket.gethostname()
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: Any = None
        self._lock = threading.Lock()
        main = threading.main_thread()
        self._main_ident = main.ident
        self.ledger = Ledger(self.config.ledger)
        self.life = LifeSignals(main.ident, getattr(main, "native_id", None))
        self.lanes = Lanes()
        self.status: dict[str, tuple[int, int]] = {}
        self.status_since = time.monotonic()
        self._pending: list[list[Any]] = []
        self._pending_key: Any = None
        self._blocked_since: float | None = None
        self._frames: list[dict[str, Any]] = []
        self._doing = ("running", "starting")
        self._where = "?"
        self._peer_seq: dict[int, tuple[int, float]] = {}
        self._notices = 0
        self._oom0 = procs.oom_kills()
        self.exchange = Exchange(self)
        self.lengths = LengthCheck(self)
        self.failure = Failure(self)

    # -- lifecycle --------------------------------------------------------------------------

    def client(self) -> Any:
        import torch.distributed as dist

        return dist.TCPStore(self.addr, self.port, is_master=False,
                             timeout=timedelta(seconds=max(5.0, self.config.dead_after)),
                             wait_for_workers=False)

    def start(self) -> Guard:
        self._store = self.client()
        self.progress.on_epoch = self.lengths.on_pass
        self.progress.on_batch = self.lengths.on_batch
        install_hooks(self.progress)
        self._publish()
        self._await_peers()
        self._thread = threading.Thread(target=self._run, name="ddpguard-guard", daemon=True)
        self._thread.start()
        return self

    def _await_peers(self) -> None:
        """Return once every rank's guard holds its store connection. Without this, a rank
        that finishes a short script could take the store (hosted by rank 0 outside torchrun)
        down while a slower peer is still connecting, and that peer would fail at start-up."""
        key = f"{self.prefix}started"
        limit = max(30.0, self.config.dead_after)
        n = self._store.add(key, 1)
        deadline = time.monotonic() + limit
        while n < self.world_size and time.monotonic() < deadline:
            time.sleep(0.01)
            n = self._store.add(key, 0)
        if n < self.world_size:
            log.warning("guard on rank %d: only %d of %d ranks started a guard within %.0f s; "
                        "start every rank with the same guard setting", self.rank, n,
                        self.world_size, limit)

    def stop(self, state: str = "exited", error: str | None = None) -> None:
        """Publish the final state (peers then know this rank left on purpose) and join."""
        if self.state == "running" and state == "exited" and self._thread is not None:
            self._final_desync_check()
        if self.state == "running":
            self.state, self.error = state, error
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self.config.heartbeat_interval + 5)
        uninstall_hooks(self.progress)
        self.lanes.add(time.time(), state, f"{state}" + (f": {error}" if error else ""))
        try:
            self._publish()
        except Exception as exc:  # the store host may already be gone at exit
            log.debug("final heartbeat not written: %s", exc)

    def _final_desync_check(self) -> None:
        """A short job can end before the periodic comparison ran: compare once more at the
        end, so a desync that did not hang is still reported."""
        try:
            found = self.exchange.at_exit()
        except Exception as exc:
            log.debug("final desync check failed: %s", exc)
            return
        if found:
            from .rules import Decision

            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self.failure.fail(Decision("desync", found), self.read_peers())

    # -- store access (guard thread, and the failure path) -------------------------------------

    def store_set(self, key: str, value: Any) -> None:
        with self._lock:
            self._store.set(self.prefix + key, json.dumps(value, default=str))

    def store_get_many(self, keys: list[str]) -> dict[str, Any]:
        """The keys that exist, decoded; missing ones left out."""
        full = [self.prefix + k for k in keys]
        with self._lock:
            present = [k for k in full if self._store.check([k])]
            vals = self._store.multi_get(present) if present else []
        n = len(self.prefix)
        return {k[n:]: json.loads(bytes(v).decode()) for k, v in zip(present, vals, strict=True)}

    def store_first(self, key: str, value: Any) -> Any:
        """Set `key` unless another rank did first; returns the value that won."""
        with self._lock:
            won = self._store.compare_set(self.prefix + key, "", json.dumps(value, default=str))
        return json.loads(bytes(won).decode())

    def store_delete(self, key: str) -> None:
        with self._lock:
            self._store.delete_key(self.prefix + key)

    # -- heartbeats -------------------------------------------------------------------------

    def heartbeat(self) -> dict[str, Any]:
        snap = self.progress.snapshot()
        now = time.monotonic()
        snap.update(
            rank=self.rank, pid=os.getpid(), host=self.host, seq=self._seq, state=self.state,
            error=self.error, mismatch=self.mismatch, t=time.time(),
            ledger=self.status if self.ledger.available else None,
            blocked=self._blocked_since is not None,
            blocked_for=now - self._blocked_since if self._blocked_since is not None else 0.0,
            pending=self._pending if self._blocked_since is not None else [],
            quiet=self.life.quiet_for(now), life=self.life.last_kind,
            doing=self._doing[1], kind=self._doing[0], where=self._where)
        return snap

    def _publish(self) -> None:
        self._seq += 1
        self.store_set(f"hb/{self.rank}", self.heartbeat())

    def read_peers(self) -> dict[int, dict[str, Any]]:
        got = self.store_get_many([f"hb/{r}" for r in range(self.world_size)])
        return {int(k.rsplit("/", 1)[1]): v for k, v in got.items()}

    # -- observing this rank ----------------------------------------------------------------

    def _observe(self, now: float) -> None:
        frames = capture_thread(self._main_ident) if self._main_ident else []
        self._frames = frames
        self._doing = activity(frames) if frames else ("running", "not started")
        self._where = fmt_frame(user_frame(frames)) if frames else "?"
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
        self.life.sample(self.progress.total() + completed, now)
        settle = self.config.settle
        quiet = self.life.quiet_for(now) >= settle
        if self.ledger.available:
            pending = any(q > c for q, c in self.status.values())
            blocked = pending and now - self.status_since >= settle and quiet
        else:
            blocked = is_blocked(frames) and quiet
        if blocked:
            if self._blocked_since is None:
                self._blocked_since = now - settle
            if self.ledger.available and self._pending_key != self.status:
                self._pending_key = self.status
                self._pending = self._read_pending()
        else:
            self._blocked_since = None
            self._pending, self._pending_key = [], None
        self._record_lane()

    def _read_pending(self) -> list[list[Any]]:
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
        peers = self.read_peers()
        trigger = self.store_get_many(["trigger"]).get("trigger")
        if trigger:
            self.failure.follow(trigger, peers)
            return
        self.exchange.serve(peers)
        decision = self.lengths.check()
        if decision is None:
            decision = self.exchange.check(peers)
        if decision is None:
            decision = decide(self._views(peers, now), self.world_size,
                              grace=self.config.grace, no_life=self.config.no_life,
                              hard_limit=self.config.stall_timeout,
                              fallback_deadlock=self.config.fallback_deadlock)
        if decision is not None:
            if decision.cause == "uneven_batches" and self._blocked_since is None:
                # The training thread raises UnevenBatchesError at its next batch; the
                # failure path below runs only if it does not get there in time.
                self.failure.soon(decision, peers, wait=max(2.0, self.config.grace))
                return
            self.failure.fail(decision, peers)
            return
        self._maybe_notice(peers)

    def _views(self, peers: dict[int, dict[str, Any]], now: float) -> dict[int, dict[str, Any]]:
        views = {}
        for r in range(self.world_size):
            hb = self.heartbeat() if r == self.rank else peers.get(r)
            if hb is None:
                continue
            v = dict(hb)
            v["gone"], v["state_text"] = self.peer_gone(r, hb, now)
            stale = self.stale_for(r, now)
            if not v["gone"] and stale > 3 * self.config.heartbeat_interval:
                # Its guard thread cannot run (process frozen, or a call holding the GIL):
                # nothing it reported since counts as life.
                v["quiet"] = float(v.get("quiet", 0.0)) + stale
                v["blocked"] = False
                v["doing"] = f"not answering for {stale:.0f} s (process stopped or frozen?)"
            views[r] = v
        return views

    def stale_for(self, r: int, now: float) -> float:
        """Seconds since rank r's heartbeat last changed (0 for this rank)."""
        if r == self.rank or r not in self._peer_seq:
            return 0.0
        return now - self._peer_seq[r][1]

    def peer_gone(self, r: int, hb: dict[str, Any], now: float) -> tuple[bool, str]:
        """Is rank r gone (exited, crashed, dead), and how to say it."""
        if r == self.rank:
            return False, ""
        if hb.get("state") == "exited":
            return True, "exited (left the job or destroyed its process group)"
        if hb.get("state") == "crashed":
            return True, f"crashed ({hb.get('error')})"
        seq, since = self._peer_seq.get(r, (-1, now))
        if hb.get("seq") != seq:
            self._peer_seq[r] = (hb.get("seq", -1), now)
            return False, ""
        silent = now - since
        if silent < 3 * self.config.heartbeat_interval:
            return False, ""
        if hb.get("host") == self.host:
            if procs.pid_alive(int(hb.get("pid", 0))):
                return False, ""
            return True, f"died (process {hb.get('pid')} is gone{self.oom_text()})"
        if silent > self.config.dead_after:
            return True, f"stopped answering {silent:.0f} s ago (host {hb.get('host')})"
        return False, ""

    def oom_text(self) -> str:
        now = procs.oom_kills()
        if now is not None and self._oom0 is not None and now > self._oom0:
            return (f"; the kernel's OOM killer killed {now - self._oom0} process(es) in this "
                    "job's cgroup since it started: out of host memory")
        return ""

    def _maybe_notice(self, peers: dict[int, dict[str, Any]]) -> None:
        """One line when others have waited long for a rank that is still working."""
        if self._blocked_since is None:
            if self._notices:
                self._notices = 0
            return
        waited = time.monotonic() - self._blocked_since
        blocked_ranks = [r for r, hb in peers.items() if hb.get("blocked")]
        if not blocked_ranks or min(blocked_ranks) != self.rank:
            return  # one rank speaks for the waiting ones
        if not notice_due(waited, self.config.notice_after, self._notices):
            return
        self._notices += 1
        busy = [f"rank {r} is at {hb.get('where')} ("
                f"{LIFE_WORDS.get(hb.get('life', ''), hb.get('life'))}, "
                f"{hb.get('quiet', 0.0):.1f} s ago)"
                for r, hb in sorted(peers.items()) if not hb.get("blocked")
                and hb.get("state") == "running"]
        first = first_pending(self._pending)
        what = f"in {describe_entry(first)}" if first else self._doing[1]
        channel.write(f"ddpguard: rank {self.rank} has waited {waited:.0f} s {what} at "
                      f"{self._where}; {'; '.join(busy) or 'the other ranks are busy'}. The "
                      "guard keeps waiting while it shows signs of life (it stops after "
                      f"{self.config.no_life:.0f} s without any).")
