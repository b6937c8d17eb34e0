"""The guard's verdict reaches the user whatever the script does to its own output (issue 24).

Real `ddpguard run` jobs on 2 gloo ranks (tests/guard/scripts/verdict_job.py). Each broken
case runs twice with the four ways real scripts silence a rank split across the two ranks and
swapped, so every way is tried on rank 0 (the usual reporter) and on the other rank:
replacing `builtins.print` with `def p(*a)`, `sys.stdout = sys.stderr = /dev/null`,
`os.dup2` of /dev/null onto fd 2, `logging.disable()`. Every job must end with exit 17, the
stop block exactly once on the launcher's stderr, a JSON report naming the right cause and
lines, and no traceback of ddpguard's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, child_env, guard_run, run_cli

SCRIPT = "tests/guard/scripts/verdict_job.py"
SHORT = {"DDPGUARD_NO_LIFE": "2", "DDPGUARD_DUMP_WAIT": "2", "DDPGUARD_DIGEST_INTERVAL": "1"}
BLOCK = "=============== ddpguard:"
# Each way on each rank across the two jobs of a case.
SIDES = {"r0_print_streams": "0:print+streams,1:fd2+logging",
         "r0_fd2_logging": "0:fd2+logging,1:print+streams"}
ALL = "0:print+streams+fd2+logging,1:print+streams+fd2+logging"
slow = pytest.mark.slow  # the real jobs; the unit tests below run always


def line_of(snippet: str) -> str:
    lines = (ROOT / SCRIPT).read_text().splitlines()
    found = [i + 1 for i, text in enumerate(lines) if snippet in text]
    assert len(found) == 1, (snippet, found)
    return f"tests/guard/scripts/verdict_job.py:{found[0]}"


# case -> (cause, culprits or None, texts that must be in the printed block)
CASES = {
    "mismatch": ("conditional_collective", None,
                 [line_of("verdict: rank 0 only"), line_of("verdict: rank 1 only")]),
    "crash": ("crashed_rank", [1], [line_of("waits for the crashed rank")]),
    "stall": ("no_life", [1], [line_of("verdict: endless loop"),
                                line_of("waits for the looping rank")]),
}


def _reports(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def check_verdict(res: subprocess.CompletedProcess[str], folder: Path, cause: str,
                  culprits: list[int] | None, texts: list[str]) -> dict:
    err = res.stderr
    assert res.returncode == 17, (res.returncode, err[-4000:])
    assert err.count(BLOCK) == 1, err[-6000:]
    block = err[err.index(BLOCK):]
    reps = _reports(folder)
    assert len(reps) == 1 and not reps[0].get("partial"), [r.get("partial") for r in reps]
    d = reps[0]["diagnosis"]
    assert d["cause"] == cause, (d["cause"], err[-4000:])
    if culprits is not None:
        assert d["culprits"] == culprits
    assert f"likely cause: {d['title']}" in block
    for text in texts:
        assert text in block, (text, block)
    # Nothing of ddpguard's own failed on the way (print(..., file=) on a replaced print).
    assert "TypeError" not in err and "guard/bootstrap.py" not in err, err[-4000:]
    return reps[0]


def run_job(case: str, silence: str, folder: Path, timeout: float = 120,
            torchrun: bool = False):
    env = child_env(DDPGUARD_REPORT_DIR=str(folder), **SHORT)
    t0 = time.monotonic()
    res = run_cli(*guard_run(torchrun=torchrun), SCRIPT, "--case", case, "--silence", silence,
                  timeout=timeout, env=env)
    return res, time.monotonic() - t0


@slow
@pytest.mark.parametrize("side", sorted(SIDES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_verdict_reaches_the_user_through_silenced_ranks(case, side, tmp_path):
    cause, culprits, texts = CASES[case]
    res, took = run_job(case, SIDES[side], tmp_path)
    rep = check_verdict(res, tmp_path, cause, culprits, texts)
    assert took < 60, took
    if case == "crash":
        # The crashed rank's own error, said through the guard's descriptor although that
        # rank's print, streams or fd 2 are gone, and kept in the report.
        where = line_of("bad record in shard 7")
        assert f"rank 1 crashed: ValueError: bad record in shard 7 at {where}" in res.stderr
        assert "bad record in shard 7" in json.dumps(rep)


@slow
def test_unequal_loaders_through_silenced_ranks_are_the_same_verdict(tmp_path):
    # Rank 1 runs out of batches and waits in the final barrier, which rank 0's all_reduce
    # of its extra batch can never pair with: the uneven proof, with the loop's line, although
    # both ranks' output is silenced (the notice before it goes through the same channel).
    res, _ = run_job("uneven", "0:print+streams,1:print+fd2", tmp_path)
    check_verdict(res, tmp_path, "uneven_batches", [1],
                  ["rank 0: 4, rank 1: 3", f"`for` at {line_of('verdict: uneven loader')}"])
    assert "ddpguard: notice: the DataLoader" in res.stderr, res.stderr[-3000:]


@slow
def test_native_crash_is_told_apart_and_quoted(tmp_path):
    # gloo aborts a rank on a size mismatch: SIGABRT is a crash inside native code, and the
    # launcher quotes that rank's own last words (kept from torchrun's stderr file of it).
    res, _ = run_job("abort", "", tmp_path, torchrun=True)
    err = res.stderr
    assert res.returncode != 0
    assert "died from signal SIGABRT: a crash inside native code" in err, err[-4000:]
    quoted = [ln for ln in err.splitlines() if ln.startswith("    | ")]
    assert any("Received data size doesn't match" in ln for ln in quoted), err[-4000:]


@slow
def test_healthy_silenced_job_exits_0_and_the_guard_says_nothing(tmp_path):
    res, _ = run_job("healthy", ALL, tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    assert not list(tmp_path.glob("*.json"))
    assert "ddpguard" not in res.stderr and "ddpguard" not in res.stdout, res.stderr[-3000:]


@slow
def test_without_the_launcher_the_rank_prints_the_block_through_its_own_descriptor(tmp_path):
    """`ddpguard.init()` under plain torchrun: no launcher of ours reads the reports, so the
    reporting rank prints the block through the duplicate of fd 2 it took at start."""
    from ddpguard.guard.procs import kill_tree

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "--monitor-interval", "1", SCRIPT, "--init", "--case", "mismatch",
           "--silence", ALL]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=ROOT, env=child_env(DDPGUARD_REPORT_DIR=str(tmp_path), **SHORT))
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        kill_tree(p.pid, include_self=True)
        out, err = p.communicate()
        raise
    res = subprocess.CompletedProcess(cmd, 17 if "exitcode: 17" in err else p.returncode,
                                      out, err)
    cause, culprits, texts = CASES["mismatch"]
    check_verdict(res, tmp_path, cause, culprits, texts)


def test_paths_are_shown_as_the_user_knows_them():
    import os
    import sysconfig

    from ddpguard.guard import stacks

    site = sysconfig.get_paths()["purelib"]
    lib = f"{site}/torch/nn/parallel/distributed.py"
    mine = os.path.join(stacks.START_DIR, "moco", "builder.py")
    assert stacks.short_path(lib) == "torch/nn/parallel/distributed.py"
    assert stacks.short_path(mine) == "moco/builder.py"
    assert stacks.short_path("tests/x.py") == "tests/x.py"  # as typed on the command line
    assert stacks.short_path("/elsewhere/y.py") == "/elsewhere/y.py"
    text = f"rank 1 at {mine}:187 in forward, innermost `{lib}:1640`"
    assert stacks.short_text(text) == ("rank 1 at moco/builder.py:187 in forward, innermost "
                                       "`torch/nn/parallel/distributed.py:1640`")


def _fake_report(partial: bool, rank: int = 1) -> dict:
    pos = {"doing": "waiting in all_reduce #5 (group 0) 8 Float", "user": "train.py:9",
           "innermost": "?"}
    return {"event": "training hang detected", "reason": "rank 0 died", "proof": True,
            "created": time.time(), "run_id": "x-0", "reporter_rank": rank, "world_size": 2,
            "diagnosis": {"cause": "crashed_rank", "title": "a rank crashed or died",
                          "explanation": "e", "fix": "f", "culprits": [0],
                          "positions": {"0": pos, "1": pos}},
            "ranks": [{"rank": r, "state": "running", "hb": {}} for r in (0, 1)],
            **({"partial": True} if partial else {})}


def test_launcher_finishes_a_report_its_rank_could_not(tmp_path, monkeypatch):
    """The deciding rank wrote its first report, then died collecting the others' stacks:
    `ddpguard run` prints that one, completed, once; older runs' reports are not this run's."""
    import os

    from ddpguard.guard import channel, verdict
    from ddpguard.guard.report import LAUNCH_ENV, write_json

    monkeypatch.setenv(LAUNCH_ENV, "old")
    write_json(str(tmp_path / "ddpguard-x-0-1-rank0.json"), _fake_report(False, 0))
    monkeypatch.setenv(LAUNCH_ENV, "this")
    path = write_json(str(tmp_path / "ddpguard-x-0-2-rank1.json"), _fake_report(True))
    out = tmp_path / "stderr"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT)
    monkeypatch.setattr(channel, "_fd", fd)
    try:
        reports = verdict.find_reports(str(tmp_path), "this")
        assert [p for p, _ in reports] == [path]
        verdict.print_verdict(reports, ["ddpguard run: rank 1 (pid 7) died from signal SIGKILL"])
    finally:
        os.close(fd)
    text = out.read_text()
    assert text.count(BLOCK) == 1 and "likely cause: a rank crashed or died" in text
    assert "note: rank 1 decided to stop the job but ended before" in text
    assert "note: ddpguard run: rank 1 (pid 7) died from signal SIGKILL" in text
    done = json.loads(Path(path).read_text())
    assert done["partial"] is False and done["finished_by"] == "launcher"
