"""`ddpguard run [torchrun options] script.py [script args]`: launch through torch.distributed.run.

We add only defaults (process count, --standalone on one node) and otherwise hand every word
to TorchElastic unchanged, so multi-node options, restarts and log redirection behave exactly
as torchrun documents them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
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
starts the hang guard when the script forms its process group: no change to the script.
When the guard stops the job, this command prints its report once, at the end, and exits 17,
whatever the script did to its ranks' output. Each rank's stderr passes through a file
(torchrun --redirects 2, shown here as it is written) unless you pass --redirects, --tee or
--log-dir yourself: a rank that crashes inside native code is shown with its last words."""

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
    argv: list[str], *, gpu_count: int, flags: set[str], guard: bool = True,
    log_dir: str | None = None,
) -> list[str]:
    """The exact argv handed to torch.distributed.run. Pure, so every default is testable.

    With `guard` (and unless `--no-guard` is among the options) the script is wrapped:
    `-m ddpguard.guard.bootstrap script.py args`; a user's own `-m module` becomes
    `-m ddpguard.guard.bootstrap -m module args`. `--no-python` runs a non-Python program,
    which cannot be guarded, so it is left alone. With `log_dir`, and unless the user chose
    how torchrun keeps logs, each rank's stderr goes to a file there (`--redirects=2`)."""
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
    if guard and log_dir and not user_logs(opts):
        opts += ["--redirects=2", f"--log-dir={log_dir}"]
    if not _given(opts, "--nproc-per-node", "--nproc_per_node"):
        opts.append(f"--nproc-per-node={default_nproc(gpu_count)}")
    multi_node = _given(
        opts, "--nnodes", "--rdzv-endpoint", "--rdzv_endpoint", "--master-addr",
        "--master_addr", "--master-port", "--master_port", "--standalone",
    )
    if not multi_node:
        opts.append("--standalone")
    return opts + rest


def user_logs(opts: list[str]) -> bool:
    """Did the user choose how torchrun keeps the ranks' output? Then we leave it alone."""
    return _given(opts, "--redirects", "-r", "--tee", "-t", "--log-dir", "--log_dir",
                  "--local-ranks-filter", "--local_ranks_filter")


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    import torch
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    from ddpguard.guard import channel, procs
    from ddpguard.guard.verdict import RankLogs

    flags = _flag_options()
    log_dir = tempfile.mkdtemp(prefix="ddpguard-run-")
    try:
        full = build_torchrun_argv(argv, gpu_count=torch.cuda.device_count(), flags=flags,
                                   log_dir=log_dir)
        _, settings = pop_our_options(split_launcher_args(argv, flags | OUR_FLAGS)[0])
    except ValueError as exc:
        shutil.rmtree(log_dir, ignore_errors=True)
        channel.write(f"ddpguard run: {exc}")
        return 2
    os.environ.update(settings)
    launch = _verdict_env()
    os.environ.update(launch)
    # Orphans of the job (DataLoader workers of a rank that was killed) come back to us, so
    # that nothing of the job outlives this command.
    procs.become_subreaper()
    oom0 = procs.oom_kills()
    logs = RankLogs(log_dir).start() if f"--log-dir={log_dir}" in full else None
    failures: dict[int, Any] = {}
    try:
        try:
            torchrun_main(full)
        except ChildFailedError as exc:
            failures = dict(exc.failures)
        finally:
            if logs is not None:
                logs.stop()
            _end_leftovers()
        return _conclude(failures, launch, oom0, logs)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def _verdict_env() -> dict[str, str]:
    """What the ranks need so that the launcher can print their verdict: a report folder it
    knows (absolute: the script may chdir), this launch's id (to tell its reports from older
    ones in the same folder), the directory paths are shown relative to, and the word that
    makes the ranks leave the block to the launcher."""
    from ddpguard.guard.channel import LAUNCHER_ENV
    from ddpguard.guard.report import LAUNCH_ENV

    folder = os.environ.get("DDPGUARD_REPORT_DIR") or "ddpguard-reports"
    return {LAUNCHER_ENV: "1", LAUNCH_ENV: uuid.uuid4().hex,
            "DDPGUARD_REPORT_DIR": os.path.abspath(folder),
            "DDPGUARD_START_DIR": os.environ.get("DDPGUARD_START_DIR") or os.getcwd()}


def _conclude(failures: dict[int, Any], launch: dict[str, str], oom0: int | None,
              logs: Any) -> int:
    """One line per failed rank, then the guard's stop block once; the exit code."""
    from ddpguard.guard import channel
    from ddpguard.guard.config import EXIT_CODE
    from ddpguard.guard.report import LAUNCH_ENV
    from ddpguard.guard.verdict import find_reports, print_verdict

    reports = find_reports(launch["DDPGUARD_REPORT_DIR"], launch[LAUNCH_ENV])
    lines = _explain_failures(failures, oom0, logs, bool(reports))
    for line in lines:
        channel.write(line)
    if reports:
        print_verdict(reports, lines)
        return EXIT_CODE
    codes = [f.exitcode for f in failures.values() if f.exitcode]
    return next((c for c in codes if c > 0), 1) if failures else 0


def _end_leftovers() -> None:
    from ddpguard.guard import channel, procs

    left = procs.kill_tree(os.getpid(), wait=3.0)
    if left:
        channel.write(f"ddpguard run: ended {len(left)} process(es) the job left behind "
                      f"(pids {', '.join(map(str, left[:10]))})")


def _explain_failures(failures: dict[int, Any], oom0: int | None, logs: Any,
                      reported: bool) -> list[str]:
    """One line per failed rank: torchrun's own summary buries a SIGKILL in a table."""
    from ddpguard.guard import procs
    from ddpguard.guard.config import EXIT_CODE
    from ddpguard.guard.verdict import NATIVE_SIGNALS, signal_text

    oom = procs.oom_kills()
    out = []
    for rank, f in sorted(failures.items()):
        if f.exitcode is not None and f.exitcode < 0:
            sig = f.signal_name()
            tail = logs.tail(f.local_rank) if logs is not None and sig in NATIVE_SIGNALS else []
            out.append(signal_text(rank, f.pid, sig, oom0, oom, tail))
        elif f.exitcode == EXIT_CODE:
            out.append(f"ddpguard run: rank {rank} was stopped by the hang guard " + (
                "(report below)" if reported else "(its report is not in this host's report "
                "folder: see that rank's output)"))
        else:
            out.append(f"ddpguard run: rank {rank} exited with code {f.exitcode}")
    return out
