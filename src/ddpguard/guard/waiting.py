"""Is the training thread waiting for a collective it already issued?

With NCCL (and with `async_op=True` on any backend) the host returns from the collective at
once and waits later: in `Work.wait()`, a poll loop on `work.is_completed()`, a device
synchronise, or `.item()` / `.cpu()` on the collective's output. CUDA's default
synchronisation spins a CPU core while it waits, so CPU time says nothing there. What does is
where the thread stands: at a call to one of those waits, or in a loop whose body polls one.
Together with a pending collective in the rank's ledger, that is waiting, not life.

Read from the thread's innermost frames by looking at the bytecode around the instruction it
is on; the analysis of each code object is cached.
"""

from __future__ import annotations

import dis
import os
import sys
from typing import Any

from .ledger import Entry
from .stacks import Frame

__all__ = ["WAIT_NAMES", "waiting_call", "waits_now"]

# Calls that wait for a device or a collective to finish.
WAIT_NAMES = frozenset({"wait", "is_completed", "synchronize", "item", "cpu", "tolist",
                        "numpy", "query", "wait_stream"})
_LOADS = {"LOAD_METHOD", "LOAD_ATTR", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF"}
_CACHE_MAX = 512
_TORCH_DIR = None


def _torch_dir() -> str | None:
    global _TORCH_DIR
    if _TORCH_DIR is None:
        mod = sys.modules.get("torch")
        path = getattr(mod, "__file__", None)
        _TORCH_DIR = os.path.dirname(path) + os.sep if path else ""
    return _TORCH_DIR or None


class _CodeMap:
    """Per code object: the name each call instruction calls, and, per backward jump, the
    names called in the loop it closes."""

    __slots__ = ("calls", "loops")

    def __init__(self, code: Any) -> None:
        self.calls: dict[int, str] = {}
        self.loops: dict[int, frozenset[str]] = {}
        name: str | None = None
        called: list[tuple[int, str]] = []
        for ins in dis.get_instructions(code):
            op = ins.opname
            if op in _LOADS and isinstance(ins.argval, str):
                name = ins.argval
            elif op.startswith("CALL") and name is not None:
                self.calls[ins.offset] = name
                called.append((ins.offset, name))
            is_back = "BACKWARD" in op or (
                op == "JUMP_ABSOLUTE" and isinstance(ins.argval, int) and ins.argval < ins.offset)
            if is_back and isinstance(ins.argval, int):
                start = ins.argval
                self.loops[ins.offset] = frozenset(n for off, n in called if off >= start)


_maps: dict[Any, _CodeMap] = {}


def _map(code: Any) -> _CodeMap:
    m = _maps.get(code)
    if m is None:
        if len(_maps) >= _CACHE_MAX:
            _maps.clear()
        m = _maps[code] = _CodeMap(code)
    return m


def waiting_call(frame: Any, depth: int = 4) -> str | None:
    """The wait the thread whose innermost frame is `frame` stands in ('wait',
    'is_completed', ...), or None. Looks at the innermost `depth` frames: a wait written in
    torch's Python code (`torch.cuda.synchronize`, `Future.wait`) counts by the function's
    name; user code counts by the call it stands on or the loop it spins in."""
    torch_dir = _torch_dir()
    f = frame
    for _ in range(depth):
        if f is None:
            return None
        code = f.f_code
        if torch_dir and code.co_filename.startswith(torch_dir):
            if code.co_name in WAIT_NAMES:
                return code.co_name
            f = f.f_back
            continue
        m = _map(code)
        at = f.f_lasti
        name = m.calls.get(at)
        if name in WAIT_NAMES:
            return name
        names = m.loops.get(at)
        if names:
            hit = names & WAIT_NAMES
            if hit:
                return min(hit)
        return None  # the first user frame decides
    return None


def waits_now(ident: int | None) -> str | None:
    """`waiting_call` for the thread `ident`, read now."""
    if ident is None:
        return None
    frame = sys._current_frames().get(ident)
    return waiting_call(frame) if frame is not None else None


# Waits that the flight recorder does not list: forming a process group (gloo and NCCL connect
# through the store), store-based barriers, and gloo's monitored barrier (point-to-point).
SETUP_WAITS = frozenset({"new_group", "new_subgroups", "new_subgroups_by_enumeration",
                         "_new_process_group_helper", "_store_based_barrier",
                         "monitored_barrier", "init_device_mesh", "split_group"})
SETUP_GROUP = "set-up"


def setup_wait(frames: list[Frame]) -> str | None:
    """The torch.distributed set-up call the stack waits in ('new_group', ...), or None.
    `frames` as stacks.capture_thread gives them, outermost first."""
    for fr in frames:
        if fr.get("func") in SETUP_WAITS and "torch/distributed/" in str(fr.get("file", "")):
            return str(fr["func"])
    return None


def setup_entry(name: str) -> Entry:
    """A ledger-shaped entry for a set-up wait, so the deadlock rules can compare it with the
    other ranks' pending collectives: it never matches a real collective, and two ranks in
    the same set-up call match each other."""
    return [SETUP_GROUP, -1, name, [], [], False]
