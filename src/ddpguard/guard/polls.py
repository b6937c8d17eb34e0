"""Busy-wait polls: `while not ready(): pass` (or `...: time.sleep(0.1)`), a loop that only
evaluates its condition. The calls its condition makes move the stack between functions, which
would read as work; a loop that does nothing else is waiting, for whatever sets its condition.
Read from the source of the frame that holds the loop (linecache, cached per line)."""

from __future__ import annotations

import functools
import linecache
import re
from typing import Any

from .stacks import is_library_file

__all__ = ["poll_head", "poll_site"]

_WHILE = re.compile(r"^(\s*)while\b.*:\s*(?:#.*)?$")
_WHILE_ONE_LINE = re.compile(r"^\s*while\b.*:\s*(?:pass|continue|\.\.\.)\s*(?:#.*)?$")
# What a body that only waits may hold.
_IDLE = re.compile(r"^(?:pass|continue|\.\.\.|(?:time\.)?sleep\([^()]*\))\s*(?:#.*)?$")


@functools.lru_cache(maxsize=4096)
def poll_head(filename: str, lineno: int) -> int | None:
    """The line of the busy-wait `while` that `lineno` belongs to (its header or a line of its
    body), or None when that line is no part of such a loop."""
    lines = linecache.getlines(filename)
    if not 0 < lineno <= len(lines):
        return None
    head = lineno
    text = lines[head - 1]
    if not text.lstrip().startswith("while"):
        # A body line: its header is the nearest line above with less indentation.
        indent = len(text) - len(text.lstrip())
        head = next((n for n in range(lineno - 1, 0, -1) if lines[n - 1].strip()
                     and not lines[n - 1].lstrip().startswith("#")
                     and len(lines[n - 1]) - len(lines[n - 1].lstrip()) < indent), 0)
        if not head:
            return None
    text = lines[head - 1].rstrip("\n")
    if _WHILE_ONE_LINE.match(text):
        return head
    m = _WHILE.match(text)
    if not m:
        return None
    indent = len(m.group(1))
    body = []
    for n in range(head + 1, len(lines) + 1):
        line = lines[n - 1]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line.strip())
    return head if body and all(_IDLE.match(b) for b in body) else None


def poll_site(frame: Any, depth: int = 40) -> tuple[int, Any, str, int] | None:
    """(id of the frame, its code, file, the loop's line) of the user frame on this stack that
    sits in a busy-wait `while`, innermost first; None where there is none."""
    f = frame
    for _ in range(depth):
        if f is None:
            return None
        name = f.f_code.co_filename
        line = f.f_lineno  # None at some instructions of a running frame (3.11)
        if line is not None and not is_library_file(name):
            head = poll_head(name, line)
            if head is not None:
                return id(f), f.f_code, name, head
        f = f.f_back
    return None
