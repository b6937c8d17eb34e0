"""Which attempts of a launch have started: each rank of an attempt leaves an empty file named
after the launch and torchrun's restart count in the report folder, at start-up (before the
script runs, so an attempt that crashes before forming its group counts too).

The launcher reads them to know the last attempt: the verdict it prints at the end is that
attempt's, never an earlier one's (a job the guard stopped and torchrun restarted, which then
finished, exits 0). Light on purpose: the sitecustomize of `ddpguard run -- COMMAND` imports
this in every Python process of the command's tree.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re

__all__ = ["RESTART_ENV", "attempt_now", "mark_start", "last_attempt", "clear"]

# torchrun's restart count, as it gives it to every worker of an attempt.
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"
_PREFIX = ".ddpguard-attempt-"


def attempt_now(env: dict[str, str] | os._Environ[str] | None = None) -> int:
    """This process's attempt number: torchrun's restart count, 0 outside torchrun."""
    raw = (os.environ if env is None else env).get(RESTART_ENV, "0")
    return int(raw) if raw.isdigit() else 0


def _name(launch_id: str, attempt: int) -> str:
    return f"{_PREFIX}{launch_id}-{attempt}"


def mark_start(report_dir: str, launch_id: str, attempt: int) -> None:
    """Best effort: a folder we cannot write to costs the launcher only its attempt count."""
    with contextlib.suppress(OSError):
        os.makedirs(report_dir, exist_ok=True)
        with open(os.path.join(report_dir, _name(launch_id, attempt)), "a"):
            pass


def last_attempt(report_dir: str, launch_id: str) -> int | None:
    """The highest attempt of the launch that started, or None when no rank marked one."""
    found = re.compile(re.escape(_PREFIX + launch_id) + r"-(\d+)$")
    seen = [int(m.group(1)) for p in glob.glob(os.path.join(glob.escape(report_dir), ".*"))
            if (m := found.search(os.path.basename(p)))]
    return max(seen) if seen else None


def clear(report_dir: str, launch_id: str) -> None:
    for p in glob.glob(os.path.join(glob.escape(report_dir), glob.escape(_PREFIX + launch_id)
                                    + "-*")):
        with contextlib.suppress(OSError):
            os.remove(p)
