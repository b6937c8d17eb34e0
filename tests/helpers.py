"""Helpers shared by test modules (conftest holds fixtures only)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ddpguard.lint import Finding, Selection
from ddpguard.lint import lint_paths as _lint_paths
from ddpguard.lint import lint_source as _lint_source

# The lint tests' other way to lint: with the CLI's own default selection unless one is given.
lint_with_defaults = _lint_source
lint_paths_with_defaults = _lint_paths

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

_LAUNCH_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK", "ROLE_RANK"}


def child_env(*, gpus: bool = False, **extra: str) -> dict[str, str]:
    """Environment for a child process: no launcher variables, loopback, one thread, and no
    GPU unless `gpus`: the multi-rank tests are gloo on the CPU, and on a machine with fewer
    GPUs than ranks ddpguard would (rightly) refuse to start NCCL."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k not in _LAUNCH_VARS}
    env.update({"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    if not gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra)
    return env


FORKRUN = "tests/guard/scripts/forkrun.py"


def guard_run(*guard_opts: str, torchrun: bool = False) -> tuple[str, ...]:
    """`ddpguard run` arguments that start a 2-rank job, the script and its arguments to
    follow. By default the ranks are forked by torch.multiprocessing after one torch import
    (scripts/forkrun.py): a third of the CPU of a torchrun job, whose agent and ranks each
    import torch. `torchrun` starts them under torchrun, for what its agent adds."""
    if torchrun:
        return ("run", *guard_opts, "--nproc-per-node", "2")
    return ("run", *guard_opts, "--", sys.executable, FORKRUN)


def run_cli(*args: str, timeout: float = 120, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `ddpguard ARGS` in a subprocess with a hard timeout. On expiry the whole job is
    ended by pid, launcher and everything below it: torchrun starts each rank in a session of
    its own, so killing the launcher alone would leave ranks running."""
    from ddpguard.guard.procs import kill_tree

    cmd = [sys.executable, "-m", "ddpguard", *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env or child_env(), cwd=cwd or ROOT)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(p.pid, include_self=True)
        out, err = p.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)



# The default rules, the preview rules (DDP001, DDP005, DDP015) and DDP007 (off by default:
# its findings on unseen code were mostly false): the analysis tests lint with this selection
# unless they pass one.
WITH_WRITES = Selection(extend_select=("DDP007",), preview=True)


def lint_source(source: str, path: str = "<string>",
                selection: Selection | None = None) -> list[Finding]:
    return _lint_source(source, path, selection or WITH_WRITES)


def lint_paths(paths: list[Path], selection: Selection | None = None) -> list[Finding]:
    return _lint_paths(paths, selection or WITH_WRITES)


# -- the lint tests (tests/lint/): one way each to lint a snippet or a corpus file --------
LINT_FIXTURES = ROOT / "tests" / "lint" / "fixtures"
ALL_BUT_PRINT = Selection(select=("ALL",), ignore=("DDP018",))
HEAD_DDP = """\
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
"""
HEAD_DIST = "import torch\nimport torch.distributed as dist\n\n\n"
HEAD_SCHEDULE = """\
import os
import pickle
import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
"""
CACHE_LEADER = "DDP005_cache_leader_eval.py"
def codes_after_head(src: str, select: tuple[str, ...] = ("ALL",)) -> list[str]:
    """The codes reported for `src` after HEAD_DDP's imports, with `select`."""
    source = HEAD_DDP + textwrap.dedent(src)
    return [f.code for f in lint_with_defaults(source, "t.py", Selection(select=select))]


def finding_lines(src: str) -> list[tuple[str, int]]:
    """(code, line) of `src`, linted with WITH_WRITES."""
    return [(f.code, f.line) for f in lint_source(src)]


def inline_lines(src: str) -> list[tuple[str, int]]:
    """(code, line within `src`) after HEAD_DIST's imports, with ALL_BUT_PRINT."""
    found = lint_with_defaults(HEAD_DIST + src, "t.py", ALL_BUT_PRINT)
    return [(f.code, f.line - HEAD_DIST.count("\n")) for f in found]


def snippet_lines(src: str, selection: Selection = ALL_BUT_PRINT) -> list[tuple[str, int]]:
    """(code, line within `src`) of dedented `src` after HEAD_SCHEDULE's imports."""
    source = HEAD_SCHEDULE + textwrap.dedent(src)
    found = lint_with_defaults(source, "t.py", selection)
    return [(f.code, f.line - HEAD_SCHEDULE.count("\n")) for f in found]


def snippet_codes(src: str) -> list[str]:
    """The codes of snippet_lines(src)."""
    return [c for c, _ in snippet_lines(src)]


def fixture_lines(name: str, old: str = "", new: str = "") -> list[tuple[str, int]]:
    """(code, line) of a fixture (tests/lint/fixtures), `old` replaced by `new` (ALL_BUT_PRINT)."""
    source = (LINT_FIXTURES / name).read_text(encoding="utf-8")
    if old:
        assert old in source, old
        source = source.replace(old, new)
    return [(f.code, f.line) for f in lint_with_defaults(source, name, ALL_BUT_PRINT)]


def fixture_lines_once(name: str, old: str = "", new: str = "",
                      selection: Selection | None = None) -> list[tuple[str, int]]:
    """As fixture_lines, `old` present exactly once, with `selection` (WITH_WRITES)."""
    source = (LINT_FIXTURES / name).read_text(encoding="utf-8")
    if old:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return [(f.code, f.line) for f in lint_source(source, name, selection)]


def fixture_line_of(name: str, text: str) -> int:
    """The line of a fixture (tests/lint/fixtures) that holds `text` (exactly one)."""
    lines = (LINT_FIXTURES / name).read_text(encoding="utf-8").splitlines()
    [n] = [i for i, line in enumerate(lines, 1) if text in line]
    return n


def cache_leader_findings(*edits: str) -> list[tuple[str, int, str]]:
    """The fixture's findings after each (old, new) pair of `edits` is applied once."""
    source = (LINT_FIXTURES / CACHE_LEADER).read_text(encoding="utf-8")
    for old, new in zip(edits[::2], edits[1::2], strict=True):
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    # DDP050 (its `--local_rank` option alone) is the fixture's own finding, not what the
    # tests of its leader-only cache and evaluation ask about.
    found = lint_with_defaults(source, CACHE_LEADER, Selection(select=("ALL",),
                                                               ignore=("DDP018", "DDP050")))
    return [(f.code, f.line, f.message) for f in found]


def cache_leader_lines(*edits: str) -> list[tuple[str, int]]:
    """(code, line) of cache_leader_findings."""
    return [(c, line) for c, line, _ in cache_leader_findings(*edits)]


def ddp_source(body: str) -> str:
    """Dedented `body` after the torch, dist and DDP imports."""
    return "import torch\nimport torch.distributed as dist\n" \
           "from torch.nn.parallel import DistributedDataParallel as DDP\n" + \
        textwrap.dedent(body)


def computed_once(tmp_path_factory: Any, key: str, compute: Callable[[Path], T]) -> T:
    """`compute(folder)` once per test run, also under xdist: a module fixture whose tests are
    spread over several workers would otherwise launch its (multi-process) job once per worker.
    The first worker computes under a file lock and leaves the pickled result; the others wait
    for it and read it. `folder` (empty at first) is shared by the workers. The result must be
    picklable; a failure is not kept, so a worker that comes later tries again."""
    import fcntl
    import pickle

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # this run's folder, above the workers' own
    folder = base / f"once-{key}"
    folder.mkdir(exist_ok=True)
    result = folder.with_name(folder.name + ".pickle")
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if result.exists():
            with open(result, "rb") as f:
                return pickle.load(f)  # type: ignore[no-any-return]
        value = compute(folder)
        with open(result, "wb") as f:
            pickle.dump(value, f)
        return value
