"""Loaded by every Python process that `ddpguard run -- COMMAND` starts, directly or through
any launcher below it (torch.multiprocessing.spawn, torchrun, `python -m
torch.distributed.launch`, accelerate, Lightning re-running the script, one task per rank under
srun): `ddpguard run` puts this folder first on PYTHONPATH, so Python imports this file at
start-up as `sitecustomize` (the way coverage.py and ddtrace-run reach every process of a tree).

It must cost nothing in a process that never trains (a compiler worker, `pip`, a shell tool),
so it imports neither torch nor ddpguard: it only watches for torch.distributed's own modules
being imported and hands over to `ddpguard.guard.autostart` then. A sitecustomize of the
user's own, further down the path, still runs.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# The modules whose loading starts the hand-over: the process-group calls live in the first,
# mp.spawn's per-rank entry point in the second, the DataLoader (whose making line a killed
# worker's report names, also for loaders made before the group exists) in the third.
_WATCHED = ("torch.distributed.distributed_c10d", "torch.multiprocessing.spawn",
            "torch.utils.data.dataloader")


class _AfterImport(importlib.abc.MetaPathFinder):
    """Lets the real finders find a watched module, then runs the hand-over right after the
    module's code has run (before anything can copy its names, as torch.distributed's
    `from .distributed_c10d import *` does)."""

    def find_spec(self, name, path, target=None):
        if name not in _WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                _chain(spec.loader)
                return spec
        return None


def _chain(loader: importlib.abc.Loader) -> None:
    exec_module = loader.exec_module

    def run_then_patch(module):
        exec_module(module)
        try:
            from ddpguard.guard import autostart

            autostart.patch_module(module)
        except Exception as exc:  # never break the user's import because of the guard
            _say(f"ddpguard: the guard could not hook {module.__name__}: {exc}")

    loader.exec_module = run_then_patch  # type: ignore[method-assign]


def _say(text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, (text + "\n").encode("utf-8", "replace"))


def _keep_stderr() -> None:
    """Take a duplicate of fd 2 now, before the script can `dup2` /dev/null onto it; the
    guard's channel picks it up by this process's pid (a child inheriting the variable has
    another pid and takes its own)."""
    try:
        fd = os.dup(2)
    except OSError:
        return
    os.environ["DDPGUARD_CHANNEL_FD"] = f"{os.getpid()}:{fd}"


def _users_sitecustomize() -> None:
    """Python imports only the first `sitecustomize` on the path, which is this one: run the
    next one, as if this file were not there."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        _say(f"sitecustomize ({spec.origin}): {type(exc).__name__}: {exc}")


def _mark_attempt() -> None:
    """Under torchrun (inside the command), say which restart this process belongs to, so
    that `ddpguard run` prints the last attempt's verdict (ddpguard/attempts.py)."""
    launch, folder = os.environ.get("DDPGUARD_LAUNCH_ID"), os.environ.get("DDPGUARD_REPORT_DIR")
    if launch and folder and "TORCHELASTIC_RESTART_COUNT" in os.environ:
        from ddpguard import attempts

        attempts.mark_start(folder, launch, attempts.attempt_now())


if os.environ.get("DDPGUARD_AUTOGUARD") == "1":
    _keep_stderr()
    _mark_attempt()
    sys.meta_path.insert(0, _AfterImport())
_users_sitecustomize()
