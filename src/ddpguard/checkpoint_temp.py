"""Temporary checkpoint files and their writers: a temp file's name says who writes it (host,
pid namespace and boot, pid, process start time), so the next save can remove the files of
writers that provably died, and never one a live writer on another node may be writing."""

from __future__ import annotations

import os
import re
import socket
import stat
import time
from pathlib import Path

__all__ = ["clean_stale_temps", "temp_path", "writer_state", "DEFAULT_STALE_AFTER"]

# .<target>.tmp@<host>@<pid namespace>.<boot>@<pid>@<start ticks>
# (older releases wrote .<target>.tmp-<pid>: removed by age only)
_TEMP = re.compile(r"^\..+\.tmp@(?P<host>[^@]+)@(?P<ns>[^@]+)@(?P<pid>\d+)@(?P<start>\d+)$")
_OLD_TEMP = re.compile(r"^\..+\.tmp-\d+$")
DEFAULT_STALE_AFTER = 24 * 3600.0  # seconds without a write before any temp file counts as dead


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "unknown"


def _namespace() -> str:
    # A pid means something only inside one pid namespace (containers) of one boot.
    try:
        ns = re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or "0"
    except OSError:
        ns = "0"
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
    except OSError:
        boot = "0"
    return f"{ns}.{boot or '0'}"


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks after boot); -1 for a zombie (killed, not yet
    reaped: it writes nothing more); None when /proc has no such process (or no /proc)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the command name may contain spaces and ')'
    return -1 if fields[0] in ("Z", "X") else int(fields[19])


def temp_path(target: Path) -> Path:
    pid = os.getpid()
    start = _start_ticks(pid) or 0
    return target.parent / f".{target.name}.tmp@{_host()}@{_namespace()}@{pid}@{start}"


def writer_state(name: str) -> str:
    """'gone' (provably), 'alive' (provably) or 'unknown' for a temporary file's writer."""
    m = _TEMP.match(name)
    if m is None or m["host"] != _host() or m["ns"] != _namespace():
        return "unknown"  # another node or container: its pids are not ours to check
    pid, start = int(m["pid"]), int(m["start"])
    ticks = _start_ticks(pid)
    if ticks is None:
        if Path("/proc/self/stat").exists():
            return "gone"  # /proc works here and has no such process
        if os.name != "posix":  # on Windows os.kill(pid, 0) would terminate the process
            return "unknown"
        try:
            os.kill(pid, 0)  # no /proc (macOS): ask the kernel; signal 0 delivers nothing
        except ProcessLookupError:
            return "gone"
        except OSError:
            return "unknown"
        return "unknown"  # a live pid without a start time to compare: maybe reused
    if ticks == -1:
        return "gone"
    if start == 0:
        return "unknown"  # written without a start time: the pid may have been reused
    return "alive" if ticks == start else "gone"  # a different start: the pid was reused


def clean_stale_temps(folder: str | os.PathLike[str], *,
                      stale_after: float | None = DEFAULT_STALE_AFTER) -> tuple[int, int]:
    """Remove temporary checkpoint files in `folder` whose writer is provably gone (same host
    and pid namespace, and the pid is dead or now belongs to a later process), or, when the
    writer cannot be checked (another node), that nobody wrote for `stale_after` seconds
    (None: never by age). A writer proven alive keeps its file whatever its age.
    Returns (files removed, bytes freed)."""
    d = Path(folder)
    removed = freed = 0
    try:
        entries = list(d.iterdir())
    except OSError:
        return 0, 0
    now = time.time()
    for p in entries:
        if not (_TEMP.match(p.name) or _OLD_TEMP.match(p.name)):
            continue
        try:
            st = p.lstat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        state = writer_state(p.name)
        old = stale_after is not None and now - st.st_mtime > stale_after
        if state == "gone" or (state == "unknown" and old):
            try:
                p.unlink()
            except OSError:  # gone already, or not ours to remove: leave it
                continue
            removed += 1
            freed += st.st_size
    return removed, freed
