"""The report of a job whose ranks could not write one: a rank died inside native code (gloo
aborts a collective the others did not match, a segfault) and took the survivors with it
before their guards could report. Under mp.spawn the rank that dies may host the store the
guards talk through; mp.spawn and torchrun's agent end the other ranks with SIGTERM within
milliseconds of the death.

What outlives them is on disk: each rank's fault log (guard/fault.py), with the dead rank's
stacks at its fatal signal and the survivors' stacks at the SIGTERM that ended them. `ddpguard
run` reads this launch's logs and diagnoses from them as the guard would have: the dead rank's
collective and line against where the others stood.
"""

from __future__ import annotations

import contextlib
import glob
import linecache
import os
import re
import time
from dataclasses import dataclass

from ddpguard.guard.diagnose import diagnose
from ddpguard.guard.ends import oom_words
from ddpguard.guard.fault import (
    fault_meta,
    fault_notes,
    fault_seen,
    fault_stacks,
    last_words,
    parse_fault,
    read_fault,
    side_collectives,
)
from ddpguard.guard.heartbeat import Heartbeat
from ddpguard.guard.records import RankRecord, Report
from ddpguard.guard.report import write_json
from ddpguard.guard.stacks import Frame, user_frame
from ddpguard.guard.unwinding import from_notes

__all__ = ["RankLog", "read_logs", "compose", "postmortem", "clear_logs"]


@dataclass(frozen=True)
class RankLog:
    """One rank's fault log: the rank, its pid, its training thread, and the dump in it
    (`fatal`: the fatal error's line, '' when only a SIGTERM's stacks or nothing)."""

    path: str
    rank: int
    world: int
    pid: int
    main: int | None
    fatal: str
    dumped: bool
    text: str  # the log as read once (a few KB)
    stacked: bool = False  # its stacks were dumped (at a fatal signal or at the SIGTERM)


def _int(text: str | None, default: int = 0) -> int:
    try:
        return int(text or "", 0)
    except ValueError:
        return default


def _all_logs(report_dir: str, launch_id: str) -> list[tuple[float, RankLog]]:
    out = []
    for path in glob.glob(os.path.join(glob.escape(report_dir), "ddpguard-fault-*.txt")):
        text = read_fault(path)
        meta = fault_meta(text)
        if meta.get("launch") != launch_id or "rank" not in meta:
            continue
        main = _int(meta.get("main")) or None
        head, threads = parse_fault(text, main)
        log = RankLog(path, _int(meta.get("rank"), -1), _int(meta.get("world")),
                      _int(meta.get("pid")), main, head, bool(threads or fault_notes(text)), text,
                      bool(threads))
        with contextlib.suppress(OSError):
            out.append((os.path.getmtime(path), log))
    return out


def read_logs(report_dir: str, launch_id: str) -> list[RankLog]:
    """This launch's fault logs in `report_dir`, the newest per rank (a restarted job's
    last attempt)."""
    found: dict[int, tuple[float, RankLog]] = {}
    for mtime, log in _all_logs(report_dir, launch_id):
        if log.rank >= 0 and mtime >= found.get(log.rank, (-1.0, log))[0]:
            found[log.rank] = (mtime, log)
    return [log for _, log in sorted(found.values(), key=lambda x: x[1].rank)]


def compose(logs: list[RankLog], oom: str = "") -> Report | None:
    """The report the logs prove, or None: a rank that died of a fatal signal explains a job
    that ended without a report; so does a rank that vanished (its log holds no stack, no
    error and no exit of its own: SIGKILL, which nothing can catch) while the others were
    ended by the launcher (their logs hold the stacks of the SIGTERM). `oom`: what the
    cgroup's OOM-kill count says of a SIGKILL (ends.oom_words; its "cannot tell" by default).
    Pure but for reading the logs and the source lines."""
    dead = [log for log in logs if log.fatal and log.dumped]
    world = max([log.world for log in logs] + [log.rank + 1 for log in logs], default=0)
    vanished: list[RankLog] = []
    if not dead:
        vanished = [log for log in logs if not log.fatal and not log.stacked]
        ended = [log for log in logs if not log.fatal and log.stacked]
        # Every rank's log must be here: a rank that exited normally removes its log, so a
        # missing one may be the rank that failed first (one srun task per rank: its own
        # launcher holds it).
        if not vanished or not ended or len(logs) < world:
            return None
        dead = vanished
    if len(logs) < world and not any(log.rank == 0 for log in dead):
        # Other ranks belong to other launchers (one srun task per rank): the survivors'
        # own launchers print the job's verdict; this one says how its rank ended. Unless
        # the rank that died is rank 0: it hosts the group's store when each task forms the
        # group itself (env:// or the program's own TCPStore), so no survivor's guard can
        # report, and this launcher's log is all that is left (the others show as missing).
        return None
    by_rank = {log.rank: log for log in logs}
    records: list[RankRecord] = []
    sources: dict[str, list[str]] = {}
    for r in range(world):
        log = by_rank.get(r)
        stacks = _stacks(log) if log is not None else {}
        state = ("dead" if log is not None and (log.fatal or log in vanished)
                 else "running" if stacks else "missing")
        hb: Heartbeat = ({"rank": r, "pid": log.pid, "fault": log.path,
                          "main": log.main, "kind": "unknown",
                          "doing": "no stack (it left no dump)"} if log is not None else {})
        if log is not None:
            # Where the rank was seen last, and its counters: all a SIGKILLed rank leaves.
            hb.update(fault_seen(log.text))  # type: ignore[typeddict-item]
        notes = fault_notes(log.text) if log is not None else []
        records.append({"rank": r, "state": state, "hb": hb, "error": None,
                        "stacks": stacks or None, "issued": {}, "ddp_training": None,
                        "sequence": [], "lanes": [],
                        "unwinding": from_notes(notes)})
        for frames in stacks.values():
            for f in frames:
                sources.setdefault(f["file"], _lines(f["file"]))
    first = dead[0]
    if vanished:
        words = (" without a trace, killed by SIGKILL: its process ended with no error, no "
                 f"stack and no exit of its own{oom or oom_words(None, None)}")
    else:
        words = last_words(first.path, first.main, first.text)
    survivors = [log.rank for log in logs if not log.fatal and log.dumped
                 and log not in vanished]
    cause = "mismatch" if "did not match" in words else "peer_gone"
    culprits = [log.rank for log in dead]
    reason = f"rank {first.rank} died{words}"
    side = [(log.rank, *found) for log in logs
            for found in side_collectives(log.text, log.main)]
    if side:
        # A collective from a second thread is paired by the group with whatever the other
        # ranks issue next: that, not the rank the transport happened to abort, is the bug.
        r, thread, op, site = side[0]
        cause, culprits = "second_thread", [r]
        reason = (f"rank {r}'s thread {thread} issued torch.distributed.{op} at {site}: "
                  "collectives are numbered in the order a rank issues them, whatever the "
                  "thread, so it paired with another rank's training collective; " + reason)
    ranked = _ranked_last(logs)
    if ranked is not None and not side:
        # A collective under a rank test, issued just before the end: the ranks that skip the
        # test never issue it, and the transport aborted a rank on the pairing that followed.
        r, op, site, age = ranked
        cause, culprits = "conditional_collective", [r]
        reason = (f"rank {r} issued torch.distributed.{op} at {site}, under a rank test, "
                  f"{age:.1f} s before its end: the ranks that skip the test never issue it, "
                  "so it paired with their next collective; " + reason)
    if survivors:
        reason += (f"; {_ranks(survivors)} ended by the launcher a moment later, before the "
                   "guard could report (the stacks at that moment are below)")
    diag = diagnose(records, sources, cause, reason, culprits)
    now = time.time()
    report: Report = {
        "event": "training hang detected", "reason": reason, "proof": True,
        "created": now, "t_start": now, "run_id": "", "reporter_rank": None,
        "world_size": world, "diagnosis": diag, "ranks": records, "config": {},
        "finished_by": "launcher",
        "notes": [f"composed by `ddpguard run` from the ranks' fault logs "
                  f"({', '.join(os.path.basename(log.path) for log in logs if log.dumped)}): "
                  "no rank was left to write the report"]}
    return report


# A collective issued under a rank test counts when its log ended this soon after it.
_RANKED_RECENT = 10.0


def _ranked_last(logs: list[RankLog]) -> tuple[int, str, str, float] | None:
    """(rank, collective, 'file:line in func', seconds before the log's end) of the latest
    collective a rank issued under a rank test shortly before its log ended (issued.py's
    note), where no other rank ever noted that line."""
    last: dict[int, tuple[str, str, float]] = {}
    every: dict[int, set[str]] = {}
    for log in logs:
        notes = [rest.split("|", 2) for kind, rest in fault_notes(log.text) if kind == "ranked"]
        every[log.rank] = {n[2] for n in notes if len(n) == 3}
        if not notes or len(notes[-1]) < 3:
            continue
        try:
            age = os.path.getmtime(log.path) - float(notes[-1][0])
        except (OSError, ValueError):
            continue
        if 0.0 <= age <= _RANKED_RECENT:
            last[log.rank] = (notes[-1][1], notes[-1][2], age)
    # A site another rank issued too is one every rank passes (`if local_rank != -1:`); a
    # rank that vanished (SIGKILL: an empty log) cannot say, so nothing is concluded.
    if any(not log.dumped for log in logs):
        return None
    alone = {r: v for r, v in last.items()
             if not any(v[1] in sites for o, sites in every.items() if o != r)}
    if not alone:
        return None
    r = min(alone)
    return r, *alone[r]


def _stacks(log: RankLog) -> dict[str, list[Frame]]:
    """The rank's stacks from its dump; where its training thread was inside ddpguard's own
    crash handling when it was ended (its error had unwound the script's frames), the line
    of that error first, from the rank's note."""
    stacks = fault_stacks(log.path, log.main, log.text) if log.dumped else {}
    main = next(iter(stacks.values()), [])
    if user_frame(main) is not None:
        return stacks
    for kind, text in fault_notes(log.text):
        m = re.match(r"(.+):(\d+) in (.+?)\|(.*)$", text)
        if kind == "error" and m:
            frame: Frame = {"file": m.group(1), "line": int(m.group(2)), "func": m.group(3),
                            "code": linecache.getline(m.group(1), int(m.group(2))).strip()}
            return {f"MainThread at its error ({m.group(4)[:200]})": [frame], **stacks}
    return stacks


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]} was"
    return f"ranks {', '.join(map(str, ranks))} were"


def _lines(path: str) -> list[str]:
    return linecache.getlines(path)


def postmortem(report_dir: str, launch_id: str, oom: str = "") -> tuple[str, Report] | None:
    """Compose and write this launch's report from its fault logs, if they prove anything."""
    rep = compose(read_logs(report_dir, launch_id), oom)
    if rep is None:
        return None
    path = os.path.join(report_dir, f"ddpguard-{launch_id[:12]}-{time.strftime('%Y%m%d-%H%M%S')}"
                        "-launcher.json")
    try:
        write_json(path, {**rep, "launch_id": launch_id})
    except OSError:
        return None
    return path, rep


def clear_logs(report_dir: str, launch_id: str, keep: bool) -> None:
    """Remove this launch's fault logs that hold no fatal dump (ranks that ended normally
    remove theirs; a rank ended by a signal cannot). `keep`: a report names them."""
    if keep:
        return
    for _, log in _all_logs(report_dir, launch_id):
        if not log.fatal:
            with contextlib.suppress(OSError):
                os.unlink(log.path)
