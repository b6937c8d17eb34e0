"""What a rank whose own code raised can still tell (used by the bootstrap): which peer failed
first, which collective this rank was in, and a wait that lets the waiting ranks write the
report before this process exits."""

from __future__ import annotations

import logging
import time

from . import procs
from .fault import last_words
from .handles import GuardHandle
from .ledger import describe_entry, first_pending

__all__ = ["await_report", "waiting_on", "peer_failures"]

log = logging.getLogger("ddpguard.guard")


def await_report(g: GuardHandle, wait: float) -> None:
    """After this rank crashed: give the ranks that wait for it up to `wait` seconds to
    notice and write the report (where everyone was), before this process exits and the
    launcher or the transport cuts them off. Returns as soon as the report is written."""
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline:
            if "reported" in g.store_get_many(["reported"]):
                return
            time.sleep(0.1)
    except Exception as exc:  # the store may be gone: leave
        log.debug("no report awaited: %s", exc)

def waiting_on(g: GuardHandle) -> str:
    """' while in all_reduce #57 (group 0) ...': the collective this rank had pending, or
    its latest one (a collective that failed counts as completed)."""
    try:
        status = g.ledger.status() if g.ledger.available else {}
        entries = g.ledger.entries() if status else []
    except Exception:
        return ""
    pend = [e for e in entries if e[0] in status
            and status[e[0]][1] < e[1] <= status[e[0]][0]]
    last = [e for e in entries if e[0] in status and e[1] == status[e[0]][0]]
    first = first_pending(pend) or (max(last, key=lambda e: e[1]) if last else None)
    return f" in {describe_entry(first)}" if first else ""

def peer_failures(g: GuardHandle, wait: float = 1.5) -> list[str]:
    """Which other ranks crashed or died, for a rank whose own collective just failed
    with a connection error that blames nobody in particular."""
    deadline = time.monotonic() + wait
    while True:
        found = []
        try:
            peers = g.read_peers()
        except Exception:
            peers = {}
        now = time.monotonic()
        for r, hb in sorted(peers.items()):
            if r == g.rank:
                continue
            if hb.get("state") == "crashed":
                found.append(f"rank {r} crashed ({hb.get('error')})")
            elif hb.get("host") == g.host and not procs.pid_alive(int(hb.get("pid", 0))):
                found.append(f"rank {r} died (process {hb.get('pid')} is gone"
                             f"{g.oom_text()}){last_words(hb.get('fault'), hb.get('main'))}")
        if found or now > deadline:
            return found
        time.sleep(0.1)
