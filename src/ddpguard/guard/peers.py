"""The judge's table of its peers: whether each is gone (exited, crashed, dead) and how long
its heartbeat has been unchanged. Only the rank that reads every heartbeat (the judge, or a
rank on the failure path) keeps one."""

from __future__ import annotations

import time
from collections.abc import Mapping

from . import procs
from .fault import last_words
from .heartbeat import Heartbeat, PeerView

__all__ = ["PeerTable"]


class PeerTable:
    def __init__(self, rank: int, host: str, heartbeat_interval: float,
                 dead_after: float) -> None:
        self.rank = rank
        self.host = host
        self.interval = heartbeat_interval
        self.dead_after = dead_after
        self._seq: dict[int, tuple[int, float]] = {}
        self._oom0 = procs.oom_kills()

    def stale_for(self, r: int, now: float | None = None) -> float:
        """Seconds since rank r's heartbeat last changed (0 for this rank or one not seen)."""
        now = time.monotonic() if now is None else now
        if r == self.rank or r not in self._seq:
            return 0.0
        return now - self._seq[r][1]

    def gone(self, r: int, hb: Heartbeat, now: float | None = None) -> tuple[bool, str]:
        """Is rank r gone (exited, crashed, dead), and how to say it."""
        now = time.monotonic() if now is None else now
        if r == self.rank:
            return False, ""
        if hb.get("state") == "exited":
            return True, "exited (left the job or destroyed its process group)"
        if hb.get("state") == "crashed":
            return True, f"crashed ({hb.get('error')})"
        if hb.get("host") == self.host and not procs.pid_alive(int(hb.get("pid", 0))):
            # On this host a vanished process is dead now, however recent its heartbeat.
            return True, (f"died (process {hb.get('pid')} is gone{self.oom_text()})"
                          f"{last_words(hb.get('fault'), hb.get('main'))}")
        seq, since = self._seq.get(r, (-1, now))
        if hb.get("seq") != seq:
            self._seq[r] = (hb.get("seq", -1), now)
            return False, ""
        silent = now - since
        if silent < 3 * self.interval:
            return False, ""
        if hb.get("host") == self.host:
            if procs.pid_alive(int(hb.get("pid", 0))):
                return False, ""
            return True, (f"died (process {hb.get('pid')} is gone{self.oom_text()})"
                          f"{last_words(hb.get('fault'), hb.get('main'))}")
        if silent > self.dead_after:
            return True, f"stopped answering {silent:.0f} s ago (host {hb.get('host')})"
        return False, ""

    def oom_text(self) -> str:
        now = procs.oom_kills()
        if now is not None and self._oom0 is not None and now > self._oom0:
            return (f"; the kernel's OOM killer killed {now - self._oom0} process(es) in this "
                    "job's cgroup since it started: out of host memory")
        return ""

    def views(self, peers: Mapping[int, Heartbeat], own: Heartbeat, world_size: int,
              now: float) -> dict[int, PeerView]:
        """Every rank's heartbeat as the rules read it: gone or not, and a rank whose guard
        has not answered for a while shown as quiet and not blocked."""
        views = {}
        for r in range(world_size):
            hb = own if r == self.rank else peers.get(r)
            if hb is None:
                continue
            v: PeerView = {**hb}
            v["gone"], v["state_text"] = self.gone(r, hb, now)
            stale = self.stale_for(r, now)
            if not v["gone"] and stale > 3 * self.interval:
                # Its guard thread cannot run (process frozen, or a call holding the GIL):
                # nothing it reported since counts as life.
                v["quiet"] = float(v.get("quiet", 0.0)) + stale
                v["blocked"] = False
                v["doing"] = f"not answering for {stale:.0f} s (process stopped or frozen?)"
            views[r] = v
        return views
