"""The launcher's side of the verdict (`ddpguard run`, the parent of every rank).

The ranks' own output can be anything: a script may replace `print`, its streams or fd 2 on
some ranks. So the launcher, not a rank, prints the stop block, once, from the JSON reports
the ranks leave in the report folder it gave them; a report whose writer died before it was
complete is finished here from what it holds. The launcher also keeps each rank's stderr in a
file (torchrun's `--redirects`, forwarded to the console unchanged by `RankLogs`), so a rank
that crashed inside native code (SIGABRT, SIGSEGV) is shown with the last words it wrote.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any

from . import channel
from .ends import TIMEOUT_SETTING, timeout_ms
from .poller import Poller
from .report import format_text, write_json

__all__ = ["RankLogs", "find_reports", "finish_partial", "signal_text", "NATIVE_SIGNALS"]

NATIVE_SIGNALS = {"SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL"}
_RANK_DIR = re.compile(r"(?:^|/)attempt_(\d+)/(\d+)/stderr\.log$")


class RankLogs(Poller):
    """Forward every rank's stderr file (torchrun writes `<dir>/.../attempt_N/<local
    rank>/stderr.log`) to the launcher's fd 2 as it grows, byte for byte, and keep each
    file's path so a crashed rank's last lines can be quoted."""

    def __init__(self, log_dir: str, interval: float = 0.1) -> None:
        super().__init__("ddpguard-rank-logs", interval)
        self.log_dir = log_dir
        self._pos: dict[str, int] = {}

    def tick(self) -> None:
        self._pump()

    def _files(self) -> list[str]:
        return sorted(glob.glob(os.path.join(glob.escape(self.log_dir), "**", "stderr.log"),
                                recursive=True))

    def _pump(self) -> None:
        for path in self._files():
            try:
                with open(path, "rb") as fh:
                    fh.seek(self._pos.get(path, 0))
                    data = fh.read()
            except OSError:
                continue
            if data:
                self._pos[path] = self._pos.get(path, 0) + len(data)
                channel.write_bytes(data)

    def tail(self, local_rank: int, lines: int = 12) -> list[str]:
        """The last `lines` non-empty lines the rank wrote to its stderr (latest attempt)."""
        best: tuple[int, str] | None = None
        for path in self._files():
            m = _RANK_DIR.search(path.replace(os.sep, "/"))
            if m and int(m.group(2)) == local_rank and (best is None or
                                                          int(m.group(1)) >= best[0]):
                best = (int(m.group(1)), path)
        if best is None:
            return []
        try:
            with open(best[1], "rb") as fh:
                fh.seek(max(0, os.path.getsize(best[1]) - 16384))
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return []
        return [ln.rstrip() for ln in text.splitlines() if ln.strip()][-lines:]


def find_reports(report_dir: str, launch_id: str) -> list[tuple[str, dict[str, Any]]]:
    """This launch's reports in `report_dir`: finished ones first, then the earliest."""
    found = []
    for path in glob.glob(os.path.join(glob.escape(report_dir), "ddpguard-*.json")):
        try:
            with open(path, encoding="utf-8") as fh:
                rep = json.load(fh)
        except (OSError, ValueError):
            continue  # half-written files are never renamed into place (write_json)
        if isinstance(rep, dict) and rep.get("launch_id") == launch_id and "diagnosis" in rep:
            found.append((path, rep))
    found.sort(key=lambda pr: (bool(pr[1].get("partial")), float(pr[1].get("created", 0))))
    return found


def finish_partial(path: str, rep: dict[str, Any], failures: list[str]) -> dict[str, Any]:
    """A report its rank wrote before collecting the other ranks' stacks, and then died:
    complete it with what the launcher knows (how each failed rank ended) and rewrite it."""
    rep = {k: v for k, v in rep.items() if k not in ("version", "launch_id")}
    rep["partial"] = False
    rep["finished_by"] = "launcher"
    rep["notes"] = [f"rank {rep.get('reporter_rank')} decided to stop the job but ended before "
                    "it had the other ranks' stacks; this report holds its own stacks and the "
                    "heartbeats it had read, completed by `ddpguard run`", *failures]
    try:
        write_json(path, rep)
    except OSError as exc:
        channel.write(f"ddpguard run: could not complete {path}: {exc}")
    return rep


def signal_text(rank: int, pid: int, sig: str, oom_before: int | None,
                oom_after: int | None, tail: list[str]) -> str:
    """Why a rank died of `sig`, told apart by what a signal means."""
    head = f"ddpguard run: rank {rank} (pid {pid}) died from signal {sig}"
    if sig == "SIGKILL":
        if oom_before is not None and oom_after is not None and oom_after > oom_before:
            why = (f"the kernel's OOM killer ended {oom_after - oom_before} process(es) of this "
                   "job's cgroup: out of host memory")
        elif oom_before is not None and oom_after is not None:
            why = ("not this job's OOM killer (the cgroup's oom_kill count did not change): "
                   "killed by hand (kill -9), by the scheduler, or by a memory limit outside "
                   "this cgroup")
        else:
            why = ("the kernel's OOM killer or an operator / the scheduler (kill -9); this "
                   "machine does not say which")
        return f"{head}: {why}; the other ranks were stopped."
    ms = timeout_ms("\n".join(tail)) if sig == "SIGABRT" else None
    if ms is not None:
        # NCCL's watchdog aborts the process when a collective runs out the group's timeout
        # (TORCH_NCCL_ASYNC_ERROR_HANDLING): that is no crash in native code.
        text = (f"{head}: NCCL's watchdog ended it: a collective ran out the process group's "
                f"timeout ({ms / 1000:g} s); if a peer was still working (a long checkpoint "
                f"or evaluation), raise {TIMEOUT_SETTING}")
        return text + "; its last error output:\n" + "\n".join(f"    | {ln}" for ln in tail)
    if sig in NATIVE_SIGNALS:
        text = (f"{head}: a crash inside native code (a C/C++ library such as gloo, NCCL, "
                "CUDA or an extension), not in Python")
        if tail:
            text += "; its last error output:\n" + "\n".join(f"    | {ln}" for ln in tail)
        return text
    if sig == "SIGTERM":
        return (f"ddpguard run: rank {rank} was stopped (SIGTERM), by torchrun after another "
                "rank failed, or by the scheduler")
    return f"{head}; the other ranks were stopped."


def print_verdict(reports: list[tuple[str, dict[str, Any]]], failures: list[str]) -> None:
    """The stop block, once: from the first finished report (others only named)."""
    path, rep = reports[0]
    if rep.get("partial"):
        rep = finish_partial(path, rep, failures)
    channel.write(format_text(rep, path))
    for other, _ in reports[1:]:
        channel.write(f"ddpguard run: another report of this run: {other}")
