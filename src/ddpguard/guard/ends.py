"""Ends of a job that are not hangs, read from what a rank's own error says and from its peers'
last heartbeats: a collective that failed on the process group's own timeout, a DataLoader
worker that was killed. Pure: the crash path (crash.py) gathers the facts, these functions
word them, so every wording is tested in one process.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from .heartbeat import Heartbeat
from .ledger import describe_entry, first_pending
from .stacks import short_text

__all__ = ["timeout_ms", "WorkerDeath", "worker_death", "peer_doing", "timeout_reason",
           "worker_reason", "oom_words", "timeout_cause", "TIMEOUT_SETTING"]

# gloo: "Timed out waiting 10000ms for recv operation to complete"; NCCL's watchdog:
# "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, ..., Timeout(ms)=600000) ran for 600055 milliseconds
# before timing out"; gloo's monitored_barrier: "Rank 1 failed to pass monitoredBarrier in
# 10000 ms".
_TIMEOUTS = (re.compile(r"Timed out waiting (\d+)\s*ms"),
             re.compile(r"Timeout\(ms\)=(\d+)"),
             re.compile(r"failed to pass monitoredBarrier in (\d+)\s*ms"))

TIMEOUT_SETTING = (
    "the timeout= argument of init_process_group (ddpguard.init(timeout=...) when ddpguard "
    "forms the group); NCCL's watchdog and gloo both wait that long for a collective")


# gloo's own words when a pair's read waits out the group's timeout: no figure in them.
_PAIR_TIMEOUT = re.compile(r"Application timeout caused pair closure")


def timeout_ms(text: str, group_ms: int | None = None) -> int | None:
    """The process group's timeout (ms) when `text` is a collective's timeout error, else
    None. A store or rendezvous timeout is not one (different words, different setting).
    `group_ms`: the group's configured timeout, for the errors that do not say it (0 when
    unknown)."""
    for pattern in _TIMEOUTS:
        m = pattern.search(text)
        if m:
            return int(m.group(1))
    if _PAIR_TIMEOUT.search(text):
        return group_ms or 0
    return None


@dataclass(frozen=True)
class WorkerDeath:
    """A DataLoader worker that died: its pid and the signal that ended it (None when it
    exited with an error code instead)."""

    pid: int
    signal: str | None

    def __post_init__(self) -> None:
        if self.pid <= 0:
            raise ValueError(f"a worker pid must be positive, got {self.pid}")


# torch: "DataLoader worker (pid 1234) is killed by signal: Killed." (strsignal's words) and
# "DataLoader worker (pid(s) 1234, 1235) exited unexpectedly".
_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.]+)\.")
_EXITED = re.compile(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")


def _signal_name(words: str) -> str:
    for sig in signal.Signals:
        if signal.strsignal(sig) == words.strip():
            return sig.name
    return words.strip()


def worker_death(text: str) -> WorkerDeath | None:
    m = _KILLED.search(text)
    if m:
        return WorkerDeath(int(m.group(1)), _signal_name(m.group(2)))
    m = _EXITED.search(text)
    if m:
        return WorkerDeath(int(m.group(1).split(",")[0]), None)
    return None


def peer_doing(r: int, hb: Heartbeat | None, gone: str = "",
               silent: float = 0.0) -> str:
    """'rank 0 was alive and working (...) at f:l' / 'rank 0 was itself blocked in barrier #7
    (group 0) at f:l' / 'rank 0 had exited', from its last heartbeat; `silent`: seconds since
    that heartbeat was written (a rank whose guard stopped answering is not said to work)."""
    if hb is None:
        return f"rank {r} had not published a heartbeat"
    where = hb.get("where") or "?"
    if gone:
        return f"rank {r} had {gone}" if not gone.startswith("died") else f"rank {r} {gone}"
    if silent > 0:
        return (f"rank {r} had not answered for {silent:.0f} s (process stopped or frozen?); "
                f"it was last at {where}")
    first = first_pending(hb.get("pending") or [])
    if hb.get("blocked") or first is not None:
        what = describe_entry(first) if first is not None else (hb.get("doing") or "a wait")
        return f"rank {r} was itself blocked in {what} at {where}"
    quiet = float(hb.get("quiet") or 0.0)
    sign = f"; last sign of life {quiet:.1f} s before" if quiet >= 1.0 else ""
    return f"rank {r} was alive and working ({hb.get('doing') or 'running'}) at {where}{sign}"


def timeout_cause(gone: list[int], frozen: list[int],
                  working: list[int]) -> tuple[str, list[int], str]:
    """(cause, culprits, kind for timeout_reason) of a collective that ran out the group's
    timeout, from which peers were gone, frozen (heartbeat not renewed) or still working; any
    other peer was blocked in a collective itself. Strongest evidence first: a peer that left
    or died explains the timeout, a frozen one is judged like a rank with no sign of life,
    and only a peer seen working makes the timeout itself the problem."""
    if gone:
        return "peer_gone", list(gone), "gone"
    if frozen:
        return "no_life", list(frozen), "frozen"
    if working:
        return "collective_timeout", list(working), "working"
    return "timeout_deadlock", [], "blocked"


def timeout_reason(rank: int, ms: int, collective: str, place: str,
                   peers: Mapping[int, str], kind: str) -> str:
    """The report's reason for a collective that failed on the group's timeout. `peers`:
    peer_doing() of every other rank; `kind`: 'working' (a peer was still working: the
    timeout was too short), 'blocked' (every peer blocked in a collective: a deadlock the
    timeout ended) or anything else (a peer gone or frozen: its own words say it)."""
    where = f" at {place}" if place else ""
    head = (f"rank {rank}'s collective{collective}{where} failed on the process group's own "
            f"timeout ({ms / 1000:g} s) while " + "; ".join(peers[r] for r in sorted(peers)))
    if kind == "blocked":
        return (f"{head}. Every rank was blocked in a collective the others were not in: the "
                "timeout only ended a deadlock")
    if kind == "working":
        return (f"{head}. No rank was stuck: a peer was still working when the timeout ran "
                f"out. The setting: {TIMEOUT_SETTING}")
    return head


def oom_words(before: int | None, after: int | None) -> str:
    """What the cgroup's oom_kill count (memory.events, read at the guard's start and now)
    says about a SIGKILL."""
    if before is None or after is None:
        return ("; SIGKILL is the kernel's OOM killer or a kill -9 (an operator, the "
                "scheduler): this machine does not say which")
    if after > before:
        return (f"; the kernel's OOM killer ended {after - before} process(es) of this job's "
                "cgroup since the guard started: out of host memory")
    return ("; not this job's OOM killer (the cgroup's oom_kill count did not change): killed "
            "by hand (kill -9), by the scheduler, or by a memory limit outside this cgroup")


def worker_reason(rank: int, death: WorkerDeath, loader: str | None, surfaced: str,
                  oom: str, made: str | None = None) -> str:
    """The report's reason for a killed DataLoader worker. `loader`: the script's line that
    iterates the worker's loader; `made`: the line that made the loader ('file:line');
    `surfaced`: where the error was raised in the training thread; `oom`: oom_words() for a
    SIGKILL."""
    how = f"was killed by {death.signal}" if death.signal else "exited unexpectedly"
    text = f"rank {rank}'s DataLoader worker (pid {death.pid}) {how}"
    if made:
        # Under a framework the iterating line is its fit() call: the making line is the
        # user's loader.
        text += f", a worker of the DataLoader made at {short_text(made)}"
        if loader:
            text += f" (iterated at {short_text(loader)})"
    elif loader:
        text += f", a worker of the loader iterated at {short_text(loader)}"
    if death.signal == "SIGKILL":
        text += oom
    if surfaced:
        text += (f"; torch raised it where the training thread happened to be ({surfaced}), "
                 "not where the data comes from")
    return text
