"""Python stacks of every thread, as plain data, and what a stack says a rank is doing.

Pure functions over frame lists (dicts with file, line, func, code) so the diagnosis can be
tested on recorded stacks without processes.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import sysconfig
import threading
import traceback
from typing import Any, TypedDict

__all__ = [
    "Frame",
    "capture_all",
    "capture_thread",
    "is_library_file",
    "user_frame",
    "innermost",
    "activity",
    "is_blocked",
    "blocked_call",
    "waits_for_child",
    "fmt_frame",
    "short_path",
    "short_text",
]

class Frame(TypedDict):
    """One frame of a stack, outermost first in a list, as reports and dumps carry it."""

    file: str
    line: int
    func: str
    code: str               # its source line, stripped ('' when unknown)

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # src/ddpguard
_LIB_DIRS = tuple(
    {p for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib"),
                 sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"))
     if p}
)


# The directory the job was started from: `ddpguard run` passes its own (a script may chdir
# before the guard loads); otherwise the working directory when the guard was loaded.
START_DIR = os.path.abspath(os.environ.get("DDPGUARD_START_DIR") or os.getcwd())
# Longest first, so a venv's site-packages inside the stdlib tree is stripped whole.
_STRIP = sorted({d for d in _LIB_DIRS if d} | {os.path.dirname(_PKG_DIR)}, key=len, reverse=True)


def short_path(path: str) -> str:
    """The path as the user knows it: library files from their package down
    (`torch/nn/parallel/distributed.py`, `threading.py`, `ddpguard/guard/...`), the script's
    own files relative to the directory the job was started from (`moco/builder.py`, not the
    absolute path of a checkout or temporary folder), anything else unchanged."""
    if not path or path.startswith("<") or not os.path.isabs(path):
        return path  # relative: already as given on the command line, from START_DIR
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    for d in _STRIP:
        if path.startswith(d + os.sep):
            return path[len(d) + 1:]
    if path.startswith(START_DIR + os.sep):
        return path[len(START_DIR) + 1:]
    return path


def short_text(text: str) -> str:
    """short_path for every absolute path inside a finished text (file:line references that
    other modules formatted themselves, such as the flight recorder's frames)."""
    for marker in ("site-packages/", "dist-packages/"):
        while marker in text:
            i = text.index(marker)
            start = max(text.rfind(c, 0, i) for c in " `'\"(\n") + 1
            text = text[:start] + text[i + len(marker):]
    for d in _STRIP:
        text = text.replace(d + os.sep, "")
    if len(START_DIR) > 1:  # never strip a bare '/'
        text = text.replace(START_DIR + os.sep, "")
    return text


def is_library_file(path: str) -> bool:
    """True for torch, the standard library, site-packages and ddpguard itself: frames that
    are never 'the user's line'."""
    if not path or path.startswith("<"):
        return True
    if os.path.isabs(path):
        # Asked for every frame of every forward through the wrapper (hooks.py): an absolute
        # path's answer never changes, a relative one's follows the working directory.
        return _absolute_is_library(path)
    return _absolute_is_library(os.path.abspath(path))


@functools.lru_cache(maxsize=4096)
def _absolute_is_library(path: str) -> bool:
    p = os.path.normpath(path)
    if p.startswith(_PKG_DIR + os.sep):
        return True
    if "site-packages" in p or "dist-packages" in p:
        return True
    return any(p.startswith(d + os.sep) for d in _LIB_DIRS)


def _frames_of(frame: Any) -> list[Frame]:
    out: list[Frame] = []
    for fs in traceback.extract_stack(frame):
        out.append({"file": fs.filename, "line": fs.lineno or 0, "func": fs.name,
                    "code": (fs.line or "").strip()})
    return out


def capture_thread(ident: int) -> list[Frame]:
    frame = sys._current_frames().get(ident)
    return _frames_of(frame) if frame is not None else []


def capture_all(skip_ident: int | None = None) -> dict[str, list[Frame]]:
    """Every live thread's stack, outermost first, keyed 'name (ident)'; main thread first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()
    main = threading.main_thread().ident
    order = sorted(frames, key=lambda i: (i != main, i))
    out: dict[str, list[Frame]] = {}
    for ident in order:
        if ident == skip_ident:
            continue
        out[f"{names.get(ident, 'thread')} ({ident})"] = _frames_of(frames[ident])
    return out


def user_frame(frames: list[Frame]) -> Frame | None:
    """The innermost frame in the user's own code (not torch, stdlib or ddpguard)."""
    for fr in reversed(frames):
        if not is_library_file(fr["file"]):
            return fr
    return None


def innermost(frames: list[Frame]) -> Frame | None:
    return frames[-1] if frames else None


def _in(fr: Frame, *parts: str) -> bool:
    f = fr["file"].replace("\\", "/")
    return any(p in f for p in parts)


_COLLECTIVES = {"barrier", "all_reduce", "all_gather", "all_gather_object", "broadcast",
                "broadcast_object_list", "reduce", "gather", "scatter", "all_to_all",
                "reduce_scatter", "all_gather_into_tensor", "reduce_scatter_tensor",
                "monitored_barrier", "send", "recv", "wait", "destroy_process_group",
                "gather_object", "scatter_object_list", "all_reduce_coalesced"}


# What a training thread does while it waits for its peers: a collective call of its own
# (`collective:<name>`), DDP's buffer broadcast in a forward, the gradient all-reduce that
# ends a backward, our own loader-length agreement at an epoch's start.
_WAITING_KINDS = ("ddp_forward", "backward", "epoch_start")


def stands_in_collective(pending: bool, kind: str, frames: list[Frame],
                         waiting: str | None) -> bool:
    """Whether a collective the ledger lists as pending is one the training thread waits in:
    its stack is in a collective, in torch.distributed, in a DDP forward or backward, or in a
    wait for an issued collective (`waiting`, from waiting.waits_now). Not while it runs other
    code: a gloo collective's completion can reach the flight recorder long after the thread
    has moved on (seen on CI with the thread in a DataLoader, and under load with rank 0
    downloading through a socket after DDP's last gradient all-reduce). Where the device itself
    reports the collective started (NCCL), the monitor needs no such look (ledger.
    started_on_device). A thread stuck elsewhere while its peers wait is a stall, for the life
    check to judge, never a deadlock."""
    if not pending:
        return False
    if kind.startswith("collective:") or kind in _WAITING_KINDS or waiting is not None:
        return True
    return any(_in(f, "torch/distributed/") for f in frames)


def activity(frames: list[Frame]) -> tuple[str, str]:
    """(kind, text) for what this stack is doing. kind is one of: 'collective:<name>',
    'ddp_forward', 'backward', 'dataloader', 'epoch_start', 'optimizer', 'sleep', 'running'."""
    ddp_forward = any(_in(f, "torch/nn/parallel/distributed.py") and f["func"] in (
        "forward", "_pre_forward", "_sync_buffers", "_sync_module_buffers",
        "_default_broadcast_coalesced", "_distributed_broadcast_coalesced") for f in frames)
    if any(f["func"] == "_agree_lengths" for f in frames):
        return "epoch_start", "at the start of an epoch, comparing loader lengths"
    for fr in reversed(frames):
        if _in(fr, "torch/distributed/") and fr["func"] in _COLLECTIVES:
            name = fr["func"]
            if ddp_forward:
                return "ddp_forward", f"in the DDP model's forward ({name} of buffers)"
            return f"collective:{name}", f"in torch.distributed.{name}"
    if ddp_forward:
        return "ddp_forward", "in the DDP model's forward (buffer broadcast)"
    if any(f["func"] in ("_engine_run_backward", "run_backward") or
           (_in(f, "torch/autograd/") and f["func"] == "backward") or
           (_in(f, "torch/_tensor.py") and f["func"] == "backward") for f in frames):
        return "backward", "in backward (DDP gradient all-reduce)"
    if any(_in(f, "torch/utils/data/") and f["func"] in ("__next__", "_next_data", "_get_data",
                                                           "_try_get_data") for f in frames):
        return "dataloader", "waiting for the next batch from a DataLoader"
    if any(_in(f, "torch/optim/") for f in frames):
        return "optimizer", "in optimizer.step"
    inner = innermost(frames)
    if inner is not None and inner["func"] == "sleep":
        return "sleep", "sleeping"
    return "running", "running Python code"


_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
_WITH = re.compile(r"^(?:async\s+)?with\s+([^:]+?)(?:\s+as\s+\w+)?\s*:")


def _call_in(code: str) -> str | None:
    """The call a line of code makes ('fcntl.flock' in `fcntl.flock(fh, LOCK_EX)`); a `with X:`
    line enters X ('lock.__enter__')."""
    m = _WITH.match(code.strip())
    if m:
        return f"{m.group(1).strip()}.__enter__"
    for m in _CALL.finditer(code):
        name = m.group(1)
        if name not in ("if", "while", "elif", "return", "not", "and", "or", "assert", "await"):
            return name
    return None


def blocked_call(frames: list[Frame]) -> str | None:
    """The call outside torch a training thread sits in, as the user wrote it: the callee of
    its innermost frame's line when that frame is the user's own (a C function: a Python one
    would have a frame of its own), else the user's call into the library and the library's
    innermost call ('q.get -> waiter.acquire'). None inside torch, in time.sleep, and on a line
    that calls nothing (a loop spinning in its own bytecode is not blocked in a call)."""
    if not frames:
        return None
    uf = user_frame(frames)
    # Only the calls below the user's line count: torch's mp.spawn wrapper above it is no wait.
    below = frames[frames.index(uf):] if uf is not None and uf in frames else frames
    if any(_in(f, "torch/") for f in below):
        return None
    inner = frames[-1]
    if inner["func"] == "sleep" or not inner.get("code"):
        return None
    own = _call_in(inner["code"])
    if own is None:
        return None
    theirs = _call_in(uf["code"]) if uf is not None and uf.get("code") else None
    if own.endswith("sleep"):
        # A sleep is no wait on anything, except inside a library's lock that polls (py-filelock
        # and its kin try a non-blocking flock, then sleep): that rank waits for the lock.
        if is_library_file(inner["file"]) and _POLLED_LOCK.search(inner["func"]):
            return f"{theirs or 'a call'} -> {inner['func']} (polling a lock)"
        return None
    if not is_library_file(inner["file"]):
        return own
    return f"{theirs} -> {own}" if theirs else own


_POLLED_LOCK = re.compile(r"acquire|lock", re.IGNORECASE)


# Waits for a child process: the child's own state is the cause, not a lock between ranks.
_CHILD_WAITS = ("subprocess.py", "multiprocessing/popen_", "multiprocessing/pool.py",
                "concurrent/futures/process.py")


def waits_for_child(frames: list[Frame]) -> bool:
    """The stack waits for a child process (Popen.wait, Process.join, a process pool).

    Only the calls below the innermost user frame count: a rank forked by multiprocessing
    (mp.start_processes with the fork method) has popen_fork.py at the outer end of every
    stack, where it started the rank, not where the rank waits."""
    users = [i for i, f in enumerate(frames) if not is_library_file(f["file"])]
    inner = frames[users[-1] + 1:] if users else frames
    return any(_in(f, *_CHILD_WAITS) for f in inner) or bool(
        frames and "waitpid" in (frames[-1].get("code") or ""))


def is_blocked(frames: list[Frame]) -> bool:
    """True when the stack waits on other ranks (a collective, DDP's backward or forward)."""
    kind, _ = activity(frames)
    return kind.startswith("collective:") or kind in ("backward", "ddp_forward")


def fmt_frame(fr: Frame | None) -> str:
    if fr is None:
        return "?"
    code = f"  `{fr['code']}`" if fr["code"] else ""
    func = f" in {fr['func']}" if fr["func"] else ""
    return f"{short_path(fr['file'])}:{fr['line']}{func}{code}"
