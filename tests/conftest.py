"""Suite-wide guards: every test must leave no process group, no changed environment variable
and no new live thread behind (Lightning's fixtures do the same); a leak fails the test that
caused it instead of a random later one."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Variables that libraries legitimately set once per process on first import.
_ENV_ALLOWED = {"KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK", "PYTEST_CURRENT_TEST", "COLUMNS",
                "TORCHINDUCTOR_CACHE_DIR",
                "LINES", "MPLBACKEND", "TORCH_FR_BUFFER_SIZE"}
# Long-lived helpers that multiprocessing starts once per session, not per test.
_PROC_ALLOWED = ("resource_tracker", "forkserver", "semaphore_tracker")


def pytest_configure(config):
    # Orphans of a test (ranks whose launcher was killed, DataLoader workers of a killed rank)
    # are re-parented to this process instead of init, so the fixture below can see them.
    from ddpguard.guard.procs import become_subreaper

    become_subreaper()


# Tests that run real jobs or read real clocks on a shared two-core machine: the guard's
# (races between ranks, a launcher and the guard's own deadlines), the multi-process ones
# (marked slow) and the SIGKILLed writers'. Each gets one rerun, printed in the summary
# ("1 rerun"), so a race that load alone lost once does not sink a CI run; a broken promise
# fails both tries (the mutation runs in bench/ show it), and every rerun is a flake to chase.
_RERUN_DIRS = ("guard", "checkpoint")


def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("rerunfailures"):
        return
    for item in items:
        parts = Path(str(item.path)).parts
        if item.get_closest_marker("slow") or any(d in parts for d in _RERUN_DIRS):
            item.add_marker(pytest.mark.flaky(reruns=1))


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
    except OSError:
        return "?"


def _live_descendants():
    from ddpguard.guard.procs import descendants

    return {p for p in descendants(os.getpid())
            if not any(a in _cmdline(p) for a in _PROC_ALLOWED)}


@pytest.fixture(autouse=True)
def no_leaks():
    env_before = dict(os.environ)
    threads_before = set(threading.enumerate())
    procs_before = _live_descendants()
    yield
    problems = []
    left = _live_descendants() - procs_before
    deadline = time.monotonic() + 5.0
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _live_descendants() - procs_before
    if left:
        from ddpguard.guard.procs import kill_tree

        names = [f"{p} ({_cmdline(p)})" for p in sorted(left)]
        for p in left:
            kill_tree(p, include_self=True)
        problems.append(f"processes outlived the test: {names}")
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        problems.append("a torch.distributed process group was left initialized")
    changed = {
        k for k in set(env_before) | set(os.environ)
        if env_before.get(k) != os.environ.get(k) and k not in _ENV_ALLOWED
    }
    if changed:
        os.environ.clear()
        os.environ.update(env_before)
        problems.append(f"environment variables changed: {sorted(changed)}")
    deadline = time.monotonic() + 2.0
    while True:
        new = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        # multiprocessing's queue feeder threads end on their own once flushed.
        new = [t for t in new if not t.name.startswith(("QueueFeederThread", "pydevd"))]
        if not new or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if new:
        problems.append(f"threads left running: {[t.name for t in new]}")
    if problems:
        pytest.fail("test leaked state: " + "; ".join(problems))


@pytest.fixture
def clean_env(monkeypatch):
    """An environment with no launcher variables, as a plain `python script.py` would see."""
    for name in list(os.environ):
        if name in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                    "MASTER_PORT", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID"} \
                or name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    return monkeypatch

