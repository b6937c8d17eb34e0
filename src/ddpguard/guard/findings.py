"""What an alignment of the ranks' collective sequences found, and the words it is said in.
Pure; shared by align.py (places in the loop) and parting.py (the sequences alone)."""

from __future__ import annotations

import dataclasses
import re

__all__ = ["Finding", "file_line", "phase_words"]


@dataclasses.dataclass(frozen=True)
class Finding:
    cause: str
    text: str
    culprits: tuple[int, ...]
    line: tuple[str, int] | None = None  # the line that issued the collective named


def file_line(where: str | None) -> tuple[str, int] | None:
    """('f.py', 12) from 'f.py:12 in main'."""
    m = re.match(r"(.+):(\d+)(?: in .*)?$", where or "")
    return (m.group(1), int(m.group(2))) if m else None


def phase_words(phase: str) -> str:
    return {"forward": "inside the DDP forward", "backward": "inside the backward",
            "loop": "in the loop's own code"}.get(phase, phase)
