"""What `ddpguard run` says and returns once its job ends, attempt by attempt.

An attempt the guard stopped and torchrun restarted is announced in one line at once; the
stop block is printed at the end only when the job's LAST attempt was stopped, and the exit
code is that attempt's: 0 when the job recovered, 17 when the guard stopped the last attempt,
the rank's own code when it crashed. A report of an earlier attempt is never the verdict.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from ddpguard import attempts as markers
from ddpguard.guard import channel, procs
from ddpguard.guard.config import EXIT_CODE
from ddpguard.guard.ends import oom_words
from ddpguard.guard.poller import Poller
from ddpguard.guard.verdict import NATIVE_SIGNALS, find_reports, print_verdict, signal_text

from .postmortem import clear_logs, postmortem

__all__ = ["Launch", "AttemptWatch", "conclude", "end_leftovers", "explain_failures",
           "attempt_of", "verdict_reports"]


@dataclass(frozen=True)
class Launch:
    """One `ddpguard run`: the folder its ranks write reports to and the id they carry."""

    report_dir: str
    launch_id: str


def attempt_of(report: dict[str, Any]) -> int:
    value = report.get("attempt", 0)
    return value if isinstance(value, int) and value >= 0 else 0


def verdict_reports(reports: list[tuple[str, dict[str, Any]]],
                    last: int | None) -> list[tuple[str, dict[str, Any]]]:
    """The reports that may be the job's verdict: the last attempt's only. Pure. `last` is the
    highest attempt that started (None: no attempt marked itself, so the highest reported)."""
    if not reports:
        return []
    top = max(attempt_of(rep) for _, rep in reports) if last is None else last
    return [(p, rep) for p, rep in reports if attempt_of(rep) == top]


def attempt_line(report: dict[str, Any], path: str, restarts: int | None) -> str:
    """One line for an attempt the guard stopped and the launcher restarted. Pure.
    `restarts`: torchrun's --max-restarts, where this launcher started torchrun itself."""
    k = attempt_of(report)
    title = (report.get("diagnosis") or {}).get("title", "?")
    of = f" of {restarts}" if restarts else ""
    return (f"ddpguard run: attempt {k} stopped by the guard: {title} ({path}); "
            f"restarted (restart {k + 1}{of})")


class AttemptWatch(Poller):
    """Announces each attempt the guard stopped, once, as soon as a later attempt has started
    (torchrun restarted the job): the launcher cannot know earlier whether a stopped attempt
    is the last one, whose report is the verdict printed at the end."""

    def __init__(self, launch: Launch, restarts: int | None, interval: float = 0.5) -> None:
        super().__init__("ddpguard-attempts", interval)
        self.launch = launch
        self.restarts = restarts
        self._told: set[int] = set()

    def tick(self) -> None:
        self.poll()

    def poll(self) -> None:
        last = markers.last_attempt(self.launch.report_dir, self.launch.launch_id)
        if not last:
            return
        for path, rep in find_reports(self.launch.report_dir, self.launch.launch_id):
            k = attempt_of(rep)
            if k < last and k not in self._told:
                self._told.add(k)
                channel.write(attempt_line(rep, path, self.restarts))


def conclude(failed: bool, failures: dict[int, Any], launch: Launch, oom0: int | None,
             logs: Any, code: int | None = None) -> int:
    """One line per failed rank, then the last attempt's stop block once; the exit code.
    `failed`: the job's last attempt failed; `code`: the command's own exit code, where the
    launcher ran a command rather than torchrun."""
    reports = find_reports(launch.report_dir, launch.launch_id)
    final = verdict_reports(reports, markers.last_attempt(launch.report_dir, launch.launch_id))
    markers.clear(launch.report_dir, launch.launch_id)
    if failed and not final:
        # No rank was left to report (a native abort took the others with it): the ranks'
        # fault logs still say where each stood.
        found = postmortem(launch.report_dir, launch.launch_id,
                           oom_words(oom0, procs.oom_kills()))
        final = [(found[0], dict(found[1]))] if found else []
    clear_logs(launch.report_dir, launch.launch_id, keep=bool(final))
    if not failed and not final:
        return 0
    if not failed:
        # The guard stopped the ranks (exit 17), but the program that started them ended
        # well: it does not pass its ranks' exit codes on (one multiprocessing.Process per
        # rank, joined and never checked). The verdict is still the guard's.
        channel.write("ddpguard run: the command exited 0, but the hang guard stopped its ranks "
                      "(the program does not pass its ranks' exit codes on)")
    lines = explain_failures(failures, oom0, logs, bool(final))
    for line in lines:
        channel.write(line)
    if final:
        print_verdict(final, lines)
        return EXIT_CODE
    if code is not None:
        if code == EXIT_CODE:
            channel.write("ddpguard run: the command was stopped by the hang guard; its report "
                          f"is not in {launch.report_dir} under this launch (another task's "
                          "`ddpguard run` prints it)")
        return code if code > 0 else 1
    codes = [f.exitcode for f in failures.values() if f.exitcode]
    return next((c for c in codes if c > 0), 1) if failures else 1


def end_leftovers(grace: float = 0.0) -> None:
    """Nothing of the job outlives `ddpguard run` (we are its child subreaper). `grace`: how
    long helpers of a job that ended well may take to leave by themselves (multiprocessing's
    resource tracker leaves just after the program that started it)."""
    deadline = time.monotonic() + grace
    while procs.descendants(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = procs.kill_tree(os.getpid(), wait=3.0)
    if left:
        channel.write(f"ddpguard run: ended {len(left)} process(es) the job left behind "
                      f"(pids {', '.join(map(str, left[:10]))})")


def explain_failures(failures: dict[int, Any], oom0: int | None, logs: Any,
                     reported: bool) -> list[str]:
    """One line per failed rank: torchrun's own summary buries a SIGKILL in a table."""
    oom = procs.oom_kills()
    out = []
    for rank, f in sorted(failures.items()):
        if f.exitcode is not None and f.exitcode < 0:
            sig = f.signal_name()
            tail = logs.tail(f.local_rank) if logs is not None and sig in NATIVE_SIGNALS else []
            out.append(signal_text(rank, f.pid, sig, oom0, oom, tail))
        elif f.exitcode == EXIT_CODE:
            out.append(f"ddpguard run: rank {rank} was stopped by the hang guard " + (
                "(report below)" if reported else "(its report is not in this host's report "
                "folder: see that rank's output)"))
        else:
            out.append(f"ddpguard run: rank {rank} exited with code {f.exitcode}")
    return out
