"""`ddpguard run [torchrun options] script.py [script args]`: launch through torch.distributed.run.

We add only defaults (process count, --standalone on one node) and otherwise hand every word
to TorchElastic unchanged, so multi-node options, restarts and log redirection behave exactly
as torchrun documents them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

NAME = "run"
HELP = "launch a script through torch.distributed.run (torchrun) with safe defaults"
RAW = True

USAGE = """usage: ddpguard run [torchrun options] script.py [script args]

Launches through torch.distributed.run. Defaults added when absent:
  --nproc-per-node  the number of visible GPUs, or 2 on a CPU-only machine
  --standalone      when no --nnodes/--rdzv-endpoint/--master-addr/--master-port is given
  --monitor-interval 1 (torchrun's is 0.1 s): surviving ranks get a second to say where they
                    wait before torchrun stops them after a rank died
  --no-guard        run the script as is, without ddpguard's hang guard
  --stall-timeout S a hard limit: stop the job when any rank has waited S seconds in a
                    collective, even for a peer that is still working (default: no limit;
                    the guard stops on proof of a deadlock or after 45 s with no sign of life)
All other options go to torchrun unchanged (see `torchrun --help`).

Unless --no-guard is given, the script runs under `python -m ddpguard.guard.bootstrap`, which
starts the hang guard when the script forms its process group: no change to the script."""

BOOTSTRAP = "ddpguard.guard.bootstrap"
OUR_FLAGS = {"--no-guard"}
OUR_VALUES = {"--stall-timeout"}


def _flag_options() -> set[str]:
    """torchrun options that take no value, read from torchrun's own parser so a new torch
    release with new flags cannot make us misplace the script."""
    from torch.distributed.run import get_args_parser

    flags: set[str] = set()
    for action in get_args_parser()._actions:
        if action.nargs == 0:
            flags.update(action.option_strings)
    return flags


def split_launcher_args(argv: list[str], flags: set[str]) -> tuple[list[str], list[str]]:
    """Split into (torchrun options, [script, *script args]). Pure."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[:i], argv[i + 1 :]
        if not word.startswith("-"):
            return argv[:i], argv[i:]
        if "=" in word or word in flags:
            i += 1
        else:
            i += 2  # an option with its value in the next word
    return argv, []


def pop_our_options(opts: list[str]) -> tuple[list[str], dict[str, str]]:
    """Take ddpguard's own valued options out of the launcher options: (rest, settings). Pure.
    A bad value raises ValueError naming it."""
    rest: list[str] = []
    settings: dict[str, str] = {}
    i = 0
    while i < len(opts):
        word = opts[i]
        name, eq, value = word.partition("=")
        if name in OUR_VALUES:
            if not eq:
                if i + 1 >= len(opts):
                    raise ValueError(f"{name} needs a value in seconds")
                value = opts[i + 1]
                i += 1
            try:
                seconds = float(value)
            except ValueError:
                raise ValueError(f"{name}={value!r} is not a number of seconds") from None
            if not seconds > 0:
                raise ValueError(f"{name}={value!r} must be > 0 seconds")
            settings["DDPGUARD_STALL_TIMEOUT"] = value
        else:
            rest.append(word)
        i += 1
    return rest, settings


def _given(opts: list[str], *names: str) -> bool:
    return any(o == n or o.startswith(n + "=") for o in opts for n in names)


def default_nproc(gpu_count: int) -> int:
    return gpu_count if gpu_count > 0 else 2


def build_torchrun_argv(
    argv: list[str], *, gpu_count: int, flags: set[str], guard: bool = True
) -> list[str]:
    """The exact argv handed to torch.distributed.run. Pure, so every default is testable.

    With `guard` (and unless `--no-guard` is among the options) the script is wrapped:
    `-m ddpguard.guard.bootstrap script.py args`; a user's own `-m module` becomes
    `-m ddpguard.guard.bootstrap -m module args`. `--no-python` runs a non-Python program,
    which cannot be guarded, so it is left alone."""
    opts, rest = split_launcher_args(argv, flags | OUR_FLAGS)
    if not rest:
        raise ValueError("no script given: usage is `ddpguard run [torchrun options] script.py`")
    guard = guard and "--no-guard" not in opts
    opts = [o for o in opts if o not in OUR_FLAGS]
    opts, _ = pop_our_options(opts)
    if guard and not _given(opts, "--no-python", "--no_python"):
        user_module = [o for o in opts if o in ("-m", "--module")]
        opts = [o for o in opts if o not in ("-m", "--module")]
        rest = ["-m", BOOTSTRAP, *(["-m"] if user_module else []), *rest]
    if guard and not _given(opts, "--monitor-interval", "--monitor_interval"):
        opts.append("--monitor-interval=1")
    if not _given(opts, "--nproc-per-node", "--nproc_per_node"):
        opts.append(f"--nproc-per-node={default_nproc(gpu_count)}")
    multi_node = _given(
        opts, "--nnodes", "--rdzv-endpoint", "--rdzv_endpoint", "--master-addr",
        "--master_addr", "--master-port", "--master_port", "--standalone",
    )
    if not multi_node:
        opts.append("--standalone")
    return opts + rest


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    import torch
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    from ddpguard.guard import procs

    flags = _flag_options()
    try:
        full = build_torchrun_argv(argv, gpu_count=torch.cuda.device_count(), flags=flags)
        _, settings = pop_our_options(split_launcher_args(argv, flags | OUR_FLAGS)[0])
    except ValueError as exc:
        print(f"ddpguard run: {exc}", file=sys.stderr)
        return 2
    os.environ.update(settings)
    # Orphans of the job (DataLoader workers of a rank that was killed) come back to us, so
    # that nothing of the job outlives this command.
    procs.become_subreaper()
    oom0 = procs.oom_kills()
    try:
        torchrun_main(full)
    except ChildFailedError as exc:
        _explain_failures(exc.failures, oom0)
        codes = [f.exitcode for f in exc.failures.values() if f.exitcode]
        return next((c for c in codes if c > 0), 1)
    finally:
        _end_leftovers()
    return 0


def _end_leftovers() -> None:
    from ddpguard.guard import procs

    left = procs.kill_tree(os.getpid(), wait=3.0)
    if left:
        print(f"ddpguard run: ended {len(left)} process(es) the job left behind "
              f"(pids {', '.join(map(str, left[:10]))})", file=sys.stderr, flush=True)


def _explain_failures(failures: dict[int, Any], oom0: int | None = None) -> None:
    """One line per failed rank: torchrun's own summary buries a SIGKILL in a table."""
    from ddpguard.guard import procs
    from ddpguard.guard.config import EXIT_CODE

    oom = procs.oom_kills()
    oom_text = (" The kernel's OOM killer ended a process of this job: out of host memory."
                if oom is not None and oom0 is not None and oom > oom0 else "")
    for rank, f in sorted(failures.items()):
        if f.exitcode is not None and f.exitcode < 0 and f.signal_name() == "SIGTERM":
            print(f"ddpguard run: rank {rank} was stopped (SIGTERM) after another rank failed",
                  file=sys.stderr, flush=True)
        elif f.exitcode is not None and f.exitcode < 0:
            print(f"ddpguard run: rank {rank} (pid {f.pid}) died from signal {f.signal_name()}: "
                  "a crashed rank (killed by hand, the OOM killer or the scheduler?); the "
                  f"other ranks were stopped.{oom_text if f.signal_name() == 'SIGKILL' else ''}",
                  file=sys.stderr, flush=True)
        elif f.exitcode == EXIT_CODE:
            print(f"ddpguard run: rank {rank} was stopped by the hang guard (report above)",
                  file=sys.stderr, flush=True)
        else:
            print(f"ddpguard run: rank {rank} exited with code {f.exitcode}",
                  file=sys.stderr, flush=True)
