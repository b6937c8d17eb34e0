"""Launching a job under the guard: `ddpguard run` and the demo both come here.

Two ways, one verdict (outcome.py):
- `run script.py` (torchrun.py): torchrun starts the script once per rank, each under the
  guard's bootstrap;
- `run -- COMMAND` (command.py): the command starts its ranks its own way and every Python
  process of its tree is guarded from the moment it forms a process group.
A script that starts its own ranks (selfspawn.py) is run the second way, with a note.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .argv import OUR_FLAGS, pop_our_options, split_launcher_args

__all__ = ["Plan", "plan", "main"]


@dataclass(frozen=True)
class Plan:
    """How to launch: 'torchrun' (opts are torchrun's and ours, rest the script and its
    arguments) or 'command' (rest is the command, run as is)."""

    kind: str
    opts: list[str]
    rest: list[str]
    note: str = ""


def plan(argv: list[str], flags: set[str],
         read: Callable[[str], str | None] | None = None) -> Plan:
    """Decide the launch from the words. Pure but for reading the script's source through
    `read` (a callable path -> text or None; None: do not look). Raises ValueError naming
    the problem."""
    opts, rest = split_launcher_args(argv, flags | OUR_FLAGS)
    if not rest:
        raise ValueError("no script or command given: usage is `ddpguard run [torchrun "
                         "options] script.py [args]` or `ddpguard run [--stall-timeout S] "
                         "[--no-guard] -- COMMAND [args]`")
    theirs, _ = pop_our_options([o for o in opts if o not in OUR_FLAGS])
    dashed = len(opts) < len(argv) and argv[len(opts)] == "--"
    if dashed and not rest[0].endswith(".py"):
        if theirs:
            raise ValueError(
                f"torchrun options ({' '.join(theirs)}) apply to `ddpguard run [options] "
                "script.py`; with `-- COMMAND` the command starts its own ranks: give them "
                "to its own launcher (e.g. `ddpguard run -- torchrun --nproc-per-node 2 "
                "train.py`)")
        return Plan("command", opts, rest)
    how = read(rest[0]) if read is not None and rest[0] not in ("-m", "--module") and \
        "-m" not in opts and "--module" not in opts else None
    if how:
        command = [sys.executable, *rest]
        if theirs:
            raise ValueError(
                f"{rest[0]} starts its own ranks ({how}), so torchrun must not start it once "
                f"per rank. Run it as `ddpguard run -- python {' '.join(rest)}` (the guard "
                "then watches the ranks it starts), without torchrun options "
                f"({' '.join(theirs)})")
        note = (f"ddpguard run: {rest[0]} starts its own ranks ({how}): running it as "
                f"`ddpguard run -- python {' '.join(rest)}`, not once per rank under torchrun")
        return Plan("command", [o for o in opts if o not in theirs], command, note)
    return Plan("torchrun", opts, rest)


def _own_launch_of(path: str) -> str | None:
    from .selfspawn import own_launch

    try:
        with open(path, encoding="utf-8") as fh:
            return own_launch(fh.read())
    except (OSError, UnicodeDecodeError):
        return None  # torchrun says what is wrong with a missing or unreadable script


def _flags_for(argv: list[str], read: Callable[[], set[str]]) -> set[str]:
    """torchrun's flag options where the words need them: not for `[our options] -- ...`,
    whose split is plain (reading them imports torch, over a second at every launch)."""
    if "--" in argv:
        try:
            theirs, _ = pop_our_options([o for o in argv[:argv.index("--")]
                                         if o not in OUR_FLAGS])
        except ValueError:
            theirs = ["?"]
        if not theirs:
            return set()
    return read()


def main(argv: list[str]) -> int:
    """`ddpguard run ...`: the exit code of the job's last attempt (17: the guard stopped it)."""
    from ddpguard.guard import channel

    from .argv import flag_options

    try:
        p = plan(argv, _flags_for(argv, flag_options), _own_launch_of)
    except ValueError as exc:
        channel.write(f"ddpguard run: {exc}")
        return 2
    if p.kind == "torchrun":
        from .torchrun import run_script

        return run_script(argv)
    from .command import run_command

    if p.note:
        channel.write(p.note)
    try:
        _, settings = pop_our_options([o for o in p.opts if o not in OUR_FLAGS])
    except ValueError as exc:
        channel.write(f"ddpguard run: {exc}")
        return 2
    os.environ.update(settings)
    return run_command(p.rest, settings, guard="--no-guard" not in p.opts)
