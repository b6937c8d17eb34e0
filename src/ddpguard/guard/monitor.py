"""The guard: a daemon thread per rank that publishes heartbeats through the rendezvous store,
watches every rank's, and turns a stall or a dead peer into a diagnosed exit within seconds.

No collective is ever issued: the training thread only bumps counters; the store traffic
(one small write and one multi-get per heartbeat interval) happens on this thread.
"""

from __future__ import annotations

import json
import linecache
import logging
import os
import socket
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from .config import GuardConfig
from .diagnose import diagnose
from .progress import LoaderState, Progress, UnevenBatchesError, install_hooks, uninstall_hooks
from .report import format_text, report_path, write_json
from .stacks import activity, capture_all, capture_thread, fmt_frame, is_blocked, user_frame

__all__ = ["Guard"]

log = logging.getLogger("ddpguard.guard")
PREFIX = "ddpguard/guard/"
TIMELINE_MAX = 4000


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Peer:
    __slots__ = ("hb", "seq", "seq_at", "progress", "progress_at")

    def __init__(self, now: float) -> None:
        self.hb: dict[str, Any] | None = None
        self.seq = -1
        self.seq_at = now
        self.progress = -1
        self.progress_at = now


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
        self._main_store: Any = None
        self._lock = threading.Lock()
        self._peers: dict[int, _Peer] = {}
        self._timeline: list[list[float]] = []
        self._blocked_since: float | None = None
        self._armed_at: float | None = None
        self._store_failed_at: float | None = None
        self._asymmetric: set[str] = set()
        self._main_ident = threading.main_thread().ident

    # -- lifecycle --------------------------------------------------------------------------

    def _client(self) -> Any:
        import torch.distributed as dist

        return dist.TCPStore(self.addr, self.port, is_master=False,
                             timeout=timedelta(seconds=max(5.0, self.config.dead_after)),
                             wait_for_workers=False)

    def start(self) -> Guard:
        self._store = self._client()
        self._main_store = self._client()
        self.progress.on_epoch = self._agree_lengths
        install_hooks(self.progress)
        self._publish()
        self._await_peers()
        self._thread = threading.Thread(target=self._run, name="ddpguard-guard", daemon=True)
        self._thread.start()
        return self

    def _await_peers(self) -> None:
        """Return once every rank's guard holds its store connections. Without this, a rank
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
        if self.state == "running":
            self.state, self.error = state, error
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self.config.heartbeat_interval + 5)
        uninstall_hooks(self.progress)
        try:
            self._publish()
        except Exception as exc:  # the store host may already be gone at exit
            log.debug("final heartbeat not written: %s", exc)

    # -- heartbeats -------------------------------------------------------------------------

    def heartbeat(self) -> dict[str, Any]:
        snap = self.progress.snapshot()
        snap.update(rank=self.rank, pid=os.getpid(), host=self.host, seq=self._seq,
                    state=self.state, error=self.error, mismatch=self.mismatch,
                    t=time.time(), last_progress=self.progress.last_progress_wall,
                    blocked_for=(time.monotonic() - self._blocked_since
                                 if self._blocked_since is not None else 0.0))
        return snap

    def _publish(self) -> None:
        self._seq += 1
        hb = self.heartbeat()
        with self._lock:
            self._store.set(f"{self.prefix}hb/{self.rank}", json.dumps(hb))
        point = [hb["t"], hb["epoch"], hb["batches"], hb["steps"]]
        if not self._timeline or self._timeline[-1][1:] != point[1:]:
            self._timeline.append(point)
            if len(self._timeline) > TIMELINE_MAX:
                self._timeline = self._timeline[::2]

    def _read_peers(self) -> dict[int, dict[str, Any]]:
        keys = [f"{self.prefix}hb/{r}" for r in range(self.world_size)]
        with self._lock:
            present = [k for k in keys if self._store.check([k])]
            vals = self._store.multi_get(present) if present else []
        out = {}
        for k, v in zip(present, vals, strict=True):
            out[int(k.rsplit("/", 1)[1])] = json.loads(bytes(v).decode())
        return out

    # -- the loader-length agreement (runs on the training thread, at __iter__) --------------

    def _agree_lengths(self, st: LoaderState, loader: Any) -> None:
        if not self.config.check_lengths or st.length is None or self.world_size == 1:
            return
        path, _, line = st.site.rpartition(":")
        site = f"{os.path.basename(path)}:{line}"
        if site in self._asymmetric:
            return
        base = f"{self.prefix}len/{site}/{st.epoch}/"
        self._main_store.set(f"{base}{self.rank}", str(st.length))
        keys = [f"{base}{r}" for r in range(self.world_size)]
        deadline = time.monotonic() + self.config.agree_timeout
        while not self._main_store.check(keys):
            if time.monotonic() > deadline:
                # Some rank never iterates this loader (rank-0-only evaluation): stop checking it.
                self._asymmetric.add(site)
                log.debug("loader at %s is not iterated by every rank; not compared", site)
                return
            time.sleep(0.005)
        lengths = [int(bytes(v).decode()) for v in self._main_store.multi_get(keys)]
        if len(set(lengths)) == 1:
            return
        counts = ", ".join(f"rank {r}: {n}" for r, n in enumerate(lengths))
        self.mismatch = (
            f"the DataLoader iterated at {st.site} (epoch {st.epoch}) has a different number "
            f"of batches on each rank ({counts}); DDP would pair gradient all-reduces of "
            "different steps and then hang. Stopped before the first batch."
        )
        self._fail_fast(self.mismatch)
        raise UnevenBatchesError(
            f"ddpguard, rank {self.rank}: ranks have different numbers of batches: {counts} "
            f"(DataLoader at {st.site}, epoch {st.epoch}). Use drop_last=True in the sampler "
            "and the DataLoader, filter before sharding, or ddpguard.EvenSampler."
        )

    def _fail_fast(self, text: str) -> None:
        try:
            self._publish()
            me = {"stacks": capture_all(), "timeline": self._timeline}
            rep = self._build_report("uneven batches detected before the first step",
                                     self._read_peers(), {self.rank: me})
            path = write_json(report_path(self.config.report_dir, self.run_id, self.rank), rep)
            print(format_text(rep, path), file=sys.stderr, flush=True)
        except Exception as exc:  # the error itself is raised regardless
            log.debug("could not write the mismatch report: %s", exc)

    def peer_failures(self, wait: float = 1.5) -> list[str]:
        """Which other ranks crashed or died, for a rank whose own collective just failed
        with a connection error that blames nobody in particular."""
        deadline = time.monotonic() + wait
        while True:
            found = []
            try:
                peers = self._read_peers()
            except Exception:
                peers = {}
            for r, hb in sorted(peers.items()):
                if r == self.rank:
                    continue
                if hb.get("state") == "crashed":
                    found.append(f"rank {r} crashed ({hb.get('error')})")
                elif hb.get("host") == self.host and not _pid_alive(int(hb.get("pid", 0))):
                    found.append(f"rank {r} died (process {hb.get('pid')} is gone)")
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.1)

    # -- the monitor loop ---------------------------------------------------------------------

    def _run(self) -> None:
        interval = self.config.heartbeat_interval
        while not self._stop.wait(interval):
            try:
                self._tick()
            except Exception as exc:  # the watchdog must never take training down by itself
                now = time.monotonic()
                if self._store_failed_at is None:
                    self._store_failed_at = now
                    log.debug("guard store access failed: %s", exc)
                elif now - self._store_failed_at > self.config.dead_after and self._blocked():
                    self._fail("the rendezvous store became unreachable (its host rank died)",
                               {}, store_lost=True)

    def _blocked(self) -> bool:
        frames = capture_thread(self._main_ident) if self._main_ident else []
        return is_blocked(frames)

    def _tick(self) -> None:
        now = time.monotonic()
        blocked = self._blocked()
        self._blocked_since = (self._blocked_since or now) if blocked else None
        self._publish()
        peers = self._read_peers()
        self._store_failed_at = None
        with self._lock:
            triggered = self._store.check([f"{self.prefix}trigger"])
        if triggered:
            self._fail("a hang was detected by another rank", peers)
            return
        gone = []
        max_step = self.progress.max_step_s
        any_progress = self.progress.started
        for r in range(self.world_size):
            if r == self.rank:
                continue
            p = self._peers.setdefault(r, _Peer(now))
            hb = peers.get(r)
            if hb is None:
                continue
            p.hb = hb
            if hb["seq"] != p.seq:
                p.seq, p.seq_at = hb["seq"], now
            prog = hb["batches"] + hb["steps"]
            if prog != p.progress:
                p.progress, p.progress_at = prog, now
            any_progress = any_progress or prog > 0
            max_step = max(max_step, hb.get("max_step_s", 0.0))
            if hb["state"] in ("exited", "crashed") or self._dead(hb, p, now):
                gone.append(r)
        if gone and self._blocked_since is not None \
                and now - self._blocked_since >= self.config.grace:
            self._fail(f"rank(s) {gone} left while rank {self.rank} waits for them", peers)
            return
        if not any_progress:
            return
        if self._armed_at is None:
            self._armed_at = now
        timeout = self.config.timeout_for(max_step)
        idle = {self.rank: now - max(self.progress.last_progress, self._armed_at)}
        for r, p in self._peers.items():
            if r not in gone:
                idle[r] = now - max(p.progress_at, self._armed_at)
        worst = max(idle, key=lambda r: idle[r])
        live = [p for r, p in self._peers.items() if r not in gone and p.hb is not None]
        if self._blocked_since is not None and len(live) == self.world_size - 1:
            # Shortest time any rank has been blocked (ours included) and least idle rank.
            all_blocked = min([now - self._blocked_since]
                              + [float(p.hb.get("blocked_for", 0.0)) for p in live if p.hb])
            deadlock = self.config.deadlock_timeout_for(max_step)
            if all_blocked > 0 and min(idle.values()) > deadlock and all_blocked > deadlock / 2:
                self._fail(f"every rank has waited inside a collective with no progress for "
                           f"{min(idle.values()):.1f} s (deadlock timeout {deadlock:.1f} s): "
                           "the ranks are in different collectives", peers)
                return
        if idle[worst] > timeout:
            self._fail(f"no progress on rank {worst} for {idle[worst]:.1f} s "
                       f"(stall timeout {timeout:.1f} s)", peers)

    def _dead(self, hb: dict[str, Any], p: _Peer, now: float) -> bool:
        silent = now - p.seq_at
        if silent < 3 * self.config.heartbeat_interval:
            return False
        if hb.get("host") == self.host:
            return not _pid_alive(int(hb["pid"]))
        return silent > self.config.dead_after

    # -- failing ----------------------------------------------------------------------------

    def _fail(self, reason: str, peers: dict[int, dict[str, Any]], store_lost: bool = False
              ) -> None:
        me = threading.current_thread().ident
        stacks = capture_all(skip_ident=me)
        dumps: dict[int, dict[str, Any]] = {}
        if not store_lost:
            try:
                with self._lock:
                    self._store.compare_set(f"{self.prefix}trigger", "",
                                            json.dumps({"by": self.rank, "reason": reason}))
                    self._store.set(f"{self.prefix}stack/{self.rank}", json.dumps(
                        {"stacks": stacks, "timeline": self._timeline}))
                dumps = self._collect_dumps(peers)
                peers = self._read_peers()
            except Exception as exc:
                log.debug("store failed while collecting stacks: %s", exc)
        dumps[self.rank] = {"stacks": stacks, "timeline": self._timeline}
        rep = self._build_report("training hang detected", peers, dumps, reason=reason)
        path = None
        try:
            path = write_json(report_path(self.config.report_dir, self.run_id, self.rank), rep)
        except OSError as exc:
            log.warning("could not write the report: %s", exc)
        try:
            print(format_text(rep, path), file=sys.stderr, flush=True)
            sys.stdout.flush()
        finally:
            # The training thread is stuck inside a C-level collective: no exception can reach
            # it, so the process ends here and the launcher ends (or restarts) the job.
            os._exit(self.config.exit_code)

    def _collect_dumps(self, peers: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        want = [r for r in range(self.world_size) if r != self.rank
                and (peers.get(r) or {}).get("state", "running") == "running"
                and not (r in self._peers and self._peers[r].hb is not None
                         and self._dead(self._peers[r].hb or {}, self._peers[r],
                                        time.monotonic()))]
        out: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + self.config.dump_wait
        while want and time.monotonic() < deadline:
            for r in list(want):
                key = f"{self.prefix}stack/{r}"
                with self._lock:
                    if self._store.check([key]):
                        out[r] = json.loads(bytes(self._store.get(key)).decode())
                        want.remove(r)
            time.sleep(0.05)
        return out

    def _build_report(self, event: str, peers: dict[int, dict[str, Any]],
                      dumps: dict[int, dict[str, Any]], reason: str = "") -> dict[str, Any]:
        peers = dict(peers)
        peers[self.rank] = self.heartbeat()
        now = time.monotonic()
        records = []
        for r in range(self.world_size):
            hb = peers.get(r)
            state = (hb or {}).get("state", "missing")
            p = self._peers.get(r)
            if hb is not None and state == "running" and p is not None and self._dead(hb, p, now):
                state = "dead"
            if hb is None:
                state = "missing"
            dump = dumps.get(r) or {}
            records.append({"rank": r, "state": state, "hb": hb or {},
                            "error": (hb or {}).get("error"),
                            "stacks": dump.get("stacks"), "timeline": dump.get("timeline", [])})
        sources: dict[str, list[str]] = {}
        for rec in records:
            main: list[dict[str, Any]] = next(iter((rec["stacks"] or {}).values()), [])
            uf = user_frame(main)
            if uf is not None:
                sources[uf["file"]] = linecache.getlines(uf["file"])
        diag = diagnose(records, sources)
        return {"event": event, "reason": reason, "created": time.time(),
                "run_id": self.run_id, "reporter_rank": self.rank,
                "world_size": self.world_size, "diagnosis": diag, "ranks": records,
                "config": {k: getattr(self.config, k) for k in self.config.__dataclass_fields__}}


def where_now() -> str:
    """file:line of the user's code on the calling thread (for crash messages)."""
    frames = capture_thread(threading.current_thread().ident or 0)
    return fmt_frame(user_frame(frames)) + " (" + activity(frames)[1] + ")"
