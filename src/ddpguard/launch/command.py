"""`ddpguard run [guard options] -- COMMAND [ARGS...]`: run COMMAND as it is, every Python
process of its tree guarded from the moment it forms a process group.

The command starts its ranks its own way (mp.spawn, torchrun, `python -m
torch.distributed.launch`, accelerate, Lightning, one srun task per rank); we only put the
guard's sitecustomize first on PYTHONPATH, tell the ranks where reports go, wait, and print
the verdict. Under srun every task runs its own `ddpguard run`: the stop block is printed by
the launcher of the rank that decided (its report carries that launcher's id), the others say
one line.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from typing import Any

from ddpguard.guard import channel, procs
from ddpguard.guard.autostart import AUTOGUARD_ENV
from ddpguard.guard.ledger import ensure_recorder_env

from .env import launch_env
from .outcome import AttemptWatch, conclude, end_leftovers

__all__ = ["run_command", "command_env", "SITE_DIR"]

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
_FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def command_env(base: Mapping[str, str], extra: Mapping[str, str], guard: bool) -> dict[str, str]:
    """The command's environment: `base` plus the launch's variables and, with the guard,
    our sitecustomize first on PYTHONPATH and the flight recorder on. Pure."""
    env = {**base, **extra}
    if guard:
        env[AUTOGUARD_ENV] = "1"
        path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != SITE_DIR]
        env["PYTHONPATH"] = os.pathsep.join([SITE_DIR, *path])
        ensure_recorder_env(env)
    else:
        env.pop(AUTOGUARD_ENV, None)
    return env


def run_command(command: list[str], settings: Mapping[str, str], guard: bool) -> int:
    launch = launch_env()
    env = command_env(os.environ, {**settings, **launch.variables}, guard)
    procs.become_subreaper()
    oom0 = procs.oom_kills()
    watch = AttemptWatch(launch.launch, None).start()
    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as exc:
        watch.stop()
        channel.write(f"ddpguard run: cannot start {command[0]!r}: {exc.strerror or exc}; "
                      "give the program to run after `--` (e.g. `-- python train.py`)")
        return 127
    previous = _forward_signals(proc)
    try:
        code = proc.wait()
    finally:
        _restore(previous)
        watch.stop()
        end_leftovers(grace=2.0 if proc.returncode == 0 else 0.0)
    if code < 0:
        channel.write(f"ddpguard run: {command[0]} (pid {proc.pid}) died from signal "
                      f"{signal.Signals(-code).name}")
        code = 128 - code
    return conclude(code != 0, {}, launch.launch, oom0, None, code=code)


def _forward_signals(proc: subprocess.Popen[Any]) -> dict[int, Any]:
    """The scheduler's SIGTERM reaches the command as it would without us; we stay to print
    the verdict and end what the command leaves behind. Ctrl-C reaches the command from the
    terminal itself (same process group), so we only ignore it: forwarding would deliver it
    twice."""
    def forward(signum: int, _frame: Any) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    previous: dict[int, Any] = {}
    for sig in (signal.SIGINT, *_FORWARDED):
        try:
            previous[sig] = signal.signal(sig, signal.SIG_IGN if sig == signal.SIGINT
                                          else forward)
        except (OSError, ValueError):  # not the main thread, or a signal we may not catch
            continue
    return previous


def _restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
