"""A rank's last words when native code kills it.

gloo aborts the process on a size mismatch ("Received data size doesn't match expected size"),
a CUDA or NCCL error can segfault it: the Python process never gets to say where it was. While
the guard runs, `faulthandler` writes every thread's Python stack to a small per-rank file on
SIGABRT, SIGSEGV, SIGFPE, SIGBUS and SIGILL; a surviving rank on the same host (or the report)
reads the training thread's innermost user line from it. The file is removed when the rank
leaves normally. A script that enabled faulthandler itself keeps its own setting.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import re
import tempfile
from typing import IO

from .stacks import is_library_file

__all__ = ["FaultLog", "last_words"]

_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_COLLECTIVES = frozenset({
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather",
    "scatter", "barrier", "all_gather_object", "broadcast_object_list", "gather_object",
    "scatter_object_list", "monitored_barrier"})
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')


class FaultLog:
    def __init__(self) -> None:
        self.path: str | None = None
        self._fh: IO[str] | None = None

    def start(self, directory: str | None, run_id: str, rank: int) -> str | None:
        if faulthandler.is_enabled():
            return None  # the script's own choice
        try:
            folder = directory or tempfile.gettempdir()
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"ddpguard-fault-{run_id}-rank{rank}-{os.getpid()}.txt")
            self._fh = open(path, "w")  # noqa: SIM115 (kept open for the signal handler)
            faulthandler.enable(self._fh, all_threads=True)
        except (OSError, ValueError, RuntimeError):
            return None
        self.path = path
        atexit.register(self.stop)  # a normal exit leaves nothing behind
        return path

    def stop(self) -> None:
        """Stop listening and remove the file, unless a fatal signal already wrote into it
        (then it is the dead rank's last words, for the report)."""
        if self._fh is None:
            return
        with contextlib.suppress(Exception):
            faulthandler.disable()
        with contextlib.suppress(OSError):
            self._fh.close()
        if self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        self._fh, self.path = None, None


def last_words(path: str | None, main_ident: int | None) -> str:
    """' (it died of a fatal signal: ...; its training thread was at f:l in g)', or '' when
    there is nothing (no file, or the rank did not die of a fatal signal). When the training
    thread was inside a torch.distributed collective and the process aborted, say that a
    collective the other ranks did not match is the usual cause (gloo aborts on a size
    mismatch)."""
    if not path:
        return ""
    try:
        with open(path, errors="replace") as fh:
            text = fh.read(65536)
    except OSError:
        return ""
    if not text.strip():
        return ""
    head = text.strip().splitlines()[0].strip()
    want = f"0x{main_ident:016x}" if main_ident else None
    where: str | None = None
    caller: str | None = None
    collective = None
    current = None
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            current = m.group(1).lower()
            continue
        f = _FRAME.match(line)
        if not f or (want is not None and current != want):
            continue
        if (collective is None and where is None and "torch/distributed/" in f.group(1)
                and f.group(3) in _COLLECTIVES):
            collective = f.group(3)
        if not is_library_file(f.group(1)):
            here = f"{f.group(1)}:{f.group(2)} in {f.group(3)}"
            if where is None:
                where = here
            elif caller is None:
                # A helper (an AverageMeter's all_reduce) is rarely the line to change: its
                # caller, the one under the rank condition, is named too.
                caller = here
                where = f"{where}, called from {caller}"
    if collective and where:
        hint = (": a collective the other ranks did not match is the usual cause"
                if "Abort" in head else "")
        return (f" (it died of a fatal signal ({head}) inside torch.distributed.{collective} "
                f"called at {where}{hint})")
    at = f"; its training thread was at {where}" if where else ""
    return f" (it died of a fatal signal: {head}{at})"
