"""`ddpguard run [torchrun options] script.py`: the script's ranks are started by
torch.distributed.run in this process, each under `python -m ddpguard.guard.bootstrap`."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from ddpguard.guard import channel, procs

from .argv import (
    OUR_FLAGS,
    build_torchrun_argv,
    flag_options,
    max_restarts,
    pop_our_options,
    split_launcher_args,
)
from .env import launch_env
from .outcome import AttemptWatch, conclude, end_leftovers

__all__ = ["run_script"]


def run_script(argv: list[str]) -> int:
    import torch
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    from ddpguard.guard.verdict import RankLogs

    flags = flag_options()
    log_dir = tempfile.mkdtemp(prefix="ddpguard-run-")
    try:
        full = build_torchrun_argv(argv, gpu_count=torch.cuda.device_count(), flags=flags,
                                   log_dir=log_dir)
        opts = split_launcher_args(argv, flags | OUR_FLAGS)[0]
        _, settings = pop_our_options(opts)
        restarts = max_restarts(opts)
    except ValueError as exc:
        shutil.rmtree(log_dir, ignore_errors=True)
        channel.write(f"ddpguard run: {exc}")
        return 2
    os.environ.update(settings)
    env = launch_env()
    os.environ.update(env.variables)
    # Orphans of the job (DataLoader workers of a rank that was killed) come back to us, so
    # that nothing of the job outlives this command.
    procs.become_subreaper()
    oom0 = procs.oom_kills()
    logs = RankLogs(log_dir).start() if f"--log-dir={log_dir}" in full else None
    watch = AttemptWatch(env.launch, restarts).start()
    failures: dict[int, Any] = {}
    failed = False
    try:
        try:
            torchrun_main(full)
        except ChildFailedError as exc:
            failed, failures = True, dict(exc.failures)
        finally:
            watch.stop()
            if logs is not None:
                logs.stop()
            end_leftovers()
        return conclude(failed, failures, env.launch, oom0, logs)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)



