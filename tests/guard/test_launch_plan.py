"""How `ddpguard run` decides to launch, and what it concludes, as pure functions: the words,
the self-spawning script, the command's environment, the last attempt's verdict."""

from __future__ import annotations

import os

import pytest

from ddpguard import attempts
from ddpguard.launch import plan
from ddpguard.launch.command import SITE_DIR, command_env
from ddpguard.launch.outcome import attempt_line, verdict_reports
from ddpguard.launch.selfspawn import own_launch

FLAGS = {"--standalone", "-m", "--module", "--no-python", "--run-path", "--no-guard"}
SPAWNS = "import torch.multiprocessing as mp\n\ndef w(r): pass\n\nmp.spawn(w, nprocs=2)\n"


def _reader(text):
    return lambda path: own_launch(text)


def test_a_command_after_dashes_runs_as_is():
    p = plan(["--stall-timeout", "30", "--", "python", "train.py", "--lr", "1"], FLAGS)
    assert (p.kind, p.rest) == ("command", ["python", "train.py", "--lr", "1"])
    assert plan(["--", "torchrun", "--nproc-per-node", "2", "t.py"], FLAGS).kind == "command"


def test_torchruns_flags_are_read_only_where_the_words_need_them():
    """Reading torchrun's flags imports torch (over a second at each `ddpguard run`): a
    command after `--` with only ddpguard's options before it splits without them."""
    from ddpguard.launch import _flags_for

    def read():
        calls.append(1)
        return FLAGS

    calls: list[int] = []
    assert _flags_for(["--stall-timeout", "30", "--no-guard", "--", "python", "t.py"],
                      read) == set() and not calls
    # Twins: a torchrun option before `--`, or no `--` at all, needs them.
    assert _flags_for(["--standalone", "--", "t.py"], read) == FLAGS
    assert _flags_for(["--nproc-per-node", "2", "t.py"], read) == FLAGS and len(calls) == 2


def test_a_script_after_dashes_keeps_the_torchrun_form():
    p = plan(["--max-restarts", "1", "--", "t.py", "-x"], FLAGS)
    assert (p.kind, p.opts, p.rest) == ("torchrun", ["--max-restarts", "1"], ["t.py", "-x"])


def test_torchrun_options_with_a_command_are_refused_with_the_way_to_say_it():
    with pytest.raises(ValueError, match=r"--nproc-per-node 2.*own launcher"):
        plan(["--nproc-per-node", "2", "--", "python", "t.py"], FLAGS)


def test_a_script_that_spawns_its_ranks_runs_as_a_command_with_a_note():
    p = plan(["--stall-timeout", "9", "t.py", "--x"], FLAGS, _reader(SPAWNS))
    assert p.kind == "command" and p.rest[1:] == ["t.py", "--x"]
    assert p.opts == ["--stall-timeout", "9"]
    assert "torch.multiprocessing.spawn at line 5" in p.note
    # The near twin: an ordinary script stays under torchrun.
    assert plan(["t.py"], FLAGS, _reader("import torch\n")).kind == "torchrun"
    with pytest.raises(ValueError, match=r"starts its own ranks.*ddpguard run -- python t.py"):
        plan(["--nproc-per-node", "2", "t.py"], FLAGS, _reader(SPAWNS))


@pytest.mark.parametrize("source, found", [
    (SPAWNS, "torch.multiprocessing.spawn at line 5"),
    ("import torch\ntorch.multiprocessing.spawn(f, nprocs=2)\n", "torch.multiprocessing.spawn"),
    ("from torch.multiprocessing import spawn as go\ngo(f)\n", "torch.multiprocessing.spawn"),
    ("from torch.multiprocessing import start_processes\nstart_processes(f)\n",
     "torch.multiprocessing.start_processes"),
    ("from detectron2.engine import launch\nlaunch(main, 2)\n", "detectron2's launch()"),
    ("from multiprocessing import Process\nimport torch.distributed as dist\n"
     "def run(r):\n    dist.init_process_group('gloo', rank=r, world_size=2)\n"
     "ps = [Process(target=run, args=(r,)) for r in range(2)]\n", "Process per rank (target run)"),
    # near twins: a process for other work in a script that forms its group itself
    ("from multiprocessing import Process\nProcess(target=print).start()\n", None),
    ("import multiprocessing\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
     "def stuck():\n    pass\n"
     "multiprocessing.get_context('fork').Process(target=stuck).start()\n", None),
    ("import multiprocessing as mp\nmp.Pool(4).map(print, [1])\n", None),
    ("def spawn(x): pass\nspawn(1)\n", None),
    ("this is ( not python", None),
])
def test_own_launch(source, found):
    got = own_launch(source)
    assert (got is None) if found is None else (got is not None and found in got), got


def test_the_command_environment():
    env = command_env({"PYTHONPATH": f"/a{os.pathsep}{SITE_DIR}"}, {"X": "1"}, guard=True)
    assert env["PYTHONPATH"].split(os.pathsep) == [SITE_DIR, "/a"]
    assert env["DDPGUARD_AUTOGUARD"] == "1" and env["X"] == "1"
    assert "TORCH_FR_BUFFER_SIZE" in env
    off = command_env({"DDPGUARD_AUTOGUARD": "1"}, {}, guard=False)
    assert "DDPGUARD_AUTOGUARD" not in off and "PYTHONPATH" not in off


def _rep(attempt, title="t"):
    return {"attempt": attempt, "diagnosis": {"title": title}}


def test_the_verdict_is_the_last_attempts_only():
    reports = [("a0.json", _rep(0)), ("a1.json", _rep(1))]
    assert verdict_reports(reports, 1) == [("a1.json", _rep(1))]
    # attempt 2 started and failed without a report (it crashed): no earlier block
    assert verdict_reports(reports, 2) == []
    assert verdict_reports([("a0.json", _rep(0))], 1) == []
    assert verdict_reports(reports, None) == [("a1.json", _rep(1))]
    old = [("old.json", {"diagnosis": {}})]  # written before reports carried an attempt
    assert verdict_reports(old, 0) == old


def test_attempt_line():
    line = attempt_line(_rep(0, "a rank left"), "r.json", 2)
    assert line == ("ddpguard run: attempt 0 stopped by the guard: a rank left (r.json); "
                    "restarted (restart 1 of 2)")


def test_attempt_markers(tmp_path):
    folder = str(tmp_path / "r")
    assert attempts.last_attempt(folder, "L") is None
    for k in (0, 2, 1):
        attempts.mark_start(folder, "L", k)
    attempts.mark_start(folder, "other", 7)
    assert attempts.last_attempt(folder, "L") == 2
    attempts.clear(folder, "L")
    assert attempts.last_attempt(folder, "L") is None
    assert attempts.last_attempt(folder, "other") == 7
    assert attempts.attempt_now({"TORCHELASTIC_RESTART_COUNT": "3"}) == 3
    assert attempts.attempt_now({}) == 0
