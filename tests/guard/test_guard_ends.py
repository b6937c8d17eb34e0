"""Ends of a job that are not hangs get a report, the stop block and exit 17: a collective that
fails on the process group's own timeout, a rank aborted inside gloo (a collective from a
second thread), a DataLoader worker killed by SIGKILL. Each on a real 2-rank gloo job
(tests/guard/scripts/end_scenarios.py) under `ddpguard run` and with `ddpguard.init()` in
ranks started by hand (as srun starts them: nothing wraps the script, no launcher prints the
block); the wording in one process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import ROOT, child_env, run_cli

import ddpguard
from ddpguard.guard.ends import (
    WorkerDeath,
    oom_words,
    peer_doing,
    timeout_cause,
    timeout_ms,
    timeout_reason,
    worker_death,
    worker_reason,
)
from ddpguard.guard.fault import fault_stacks, last_words, parse_fault
from ddpguard.guard.verdict import signal_text
from ddpguard.testing import free_port, loopback_env

SCRIPT = "tests/guard/scripts/end_scenarios.py"
LAUNCHES = ["ddpguard_run", "init_by_hand"]


def line_of(snippet: str) -> str:
    lines = (ROOT / SCRIPT).read_text().splitlines()
    found = [i + 1 for i, text in enumerate(lines) if snippet in text]
    assert len(found) == 1, f"{snippet!r} found at lines {found}"
    return f"end_scenarios.py:{found[0]}"


def lines_of_function(name: str) -> set[str]:
    lines = (ROOT / SCRIPT).read_text().splitlines()
    start = int(line_of(f"def {name}(").rsplit(":", 1)[1])
    out = set()
    for j in range(start, len(lines)):
        if lines[j].strip() and not lines[j].startswith((" ", "\t")):
            break
        out.add(f"end_scenarios.py:{j + 1}")
    return out


def _launch(case: str, how: str, tmp_path: Path) -> tuple[dict[int, int] | int, str]:
    """Run the case; returns (exit code(s), everything written to stderr)."""
    env = child_env(DDPGUARD_REPORT_DIR=str(tmp_path), DDPGUARD_DUMP_WAIT="3")
    if how == "ddpguard_run":
        res = run_cli("run", "--nproc-per-node", "2", SCRIPT, "--case", case, timeout=120,
                      env=env)
        return res.returncode, res.stderr
    port = free_port()
    procs = [subprocess.Popen([sys.executable, SCRIPT, "--case", case, "--init"], cwd=ROOT,
                              env={**env, **loopback_env(r, 2, port)}, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for r in range(2)]
    codes, err = {}, ""
    deadline = time.monotonic() + 90
    from ddpguard.guard.procs import kill_tree

    for r, p in enumerate(procs):
        try:
            _, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:  # our own children and what they started, by pid
                kill_tree(q.pid, include_self=True)
            _, e = p.communicate()
        codes[r] = p.returncode
        err += f"\n[rank {r} stderr]\n{e}"
    return codes, err


def _report(tmp_path: Path) -> dict:
    reports = sorted(tmp_path.glob("ddpguard-*.json"))
    assert reports, "no JSON report written"
    return json.loads(reports[0].read_text())


def _block(err: str) -> str:
    """The stop block, printed once (by the launcher, or by the reporting rank)."""
    assert err.count("=============== ddpguard:") == 1, err[-5000:]
    return err[err.index("=============== ddpguard:"):]


@pytest.mark.slow
@pytest.mark.parametrize("how", LAUNCHES)
def test_timeout_names_the_timeout_the_working_peer_and_the_setting(how, tmp_path):
    codes, err = _launch("pg_timeout", how, tmp_path)
    assert codes in (17, {0: 17, 1: 17}), (codes, err[-5000:])
    block = _block(err)
    assert "likely cause: a collective ran out the process group's timeout while a peer was " \
           "still working" in block, block
    assert "process group's own timeout (3 s)" in block
    assert "rank 1's collective in barrier #" in block and line_of("rank 1 times out") in block
    # What the peer was doing at that moment: alive, working in the checkpoint, at its line.
    assert "rank 0 was alive and working" in block
    peer = block.split("rank 0 was alive and working", 1)[1].split("No rank was stuck", 1)[0]
    assert " in checkpoint" in peer and any(
        f"{where} in" in peer for where in lines_of_function("checkpoint")), block
    assert "timeout= argument of init_process_group" in block
    d = _report(tmp_path)["diagnosis"]
    assert d["cause"] == "collective_timeout" and d["culprits"] == [0]


@pytest.mark.slow
@pytest.mark.parametrize("how", LAUNCHES)
def test_rank_aborted_by_gloo_gives_the_mismatch_with_both_lines(how, tmp_path):
    # gloo aborts the rank whose collective is the smaller (rank 1's metrics thread: it
    # receives more than it expects); rank 0 survives in DDP's gradient all-reduce.
    codes, err = _launch("thread_collective", how, tmp_path)
    assert codes == 17 or (isinstance(codes, dict) and codes[0] == 17), (codes, err[-5000:])
    block = _block(err)
    # The mismatch's title, or the more specific one for a collective from a second thread.
    d = _report(tmp_path)["diagnosis"]
    assert d["cause"] in ("mismatch", "second_thread"), d
    assert f"likely cause: {d['title']}" in block, block
    thread_line, ddp_line = line_of("dist.all_reduce(torch.ones(3))"), line_of("loss.backward()")
    assert (f"inside torch.distributed.all_reduce called from a second thread (not the "
            f"training thread) at tests/guard/scripts/{thread_line} in metrics_sync") in block
    if "rank 0 was ended by the launcher a moment later" in block:
        # The launcher's SIGTERM reached rank 0 before gloo's error did (seen once in a
        # fresh-clone CI run under load): `ddpguard run` composed the report from the fault
        # logs, with rank 0's stack at that moment (its position is checked below).
        assert how == "ddpguard_run" and "from the fault logs" in block, block
    else:
        assert "rank 0 waited in all_reduce #" in block and f"issued at tests/guard/scripts/" \
            f"{ddp_line}" in block, block
    # The dead rank is shown where its fault log says it was: in the thread's collective.
    pos = d["positions"]
    assert thread_line in pos["1"]["user"] and ddp_line in pos["0"]["user"], pos


@pytest.mark.slow
@pytest.mark.parametrize("how", LAUNCHES)
def test_killed_loader_worker_names_the_loader_line_and_the_signal(how, tmp_path):
    codes, err = _launch("worker_killed", how, tmp_path)
    assert codes in (17, {0: 17, 1: 17}), (codes, err[-5000:])
    block = _block(err)
    loop = line_of("for step, (xb, yb) in enumerate(loader):")
    assert "likely cause: a DataLoader worker was killed" in block, block
    made = line_of("loader = DataLoader(data, batch_size=4, sampler=sampler,")
    assert f"was killed by SIGKILL, a worker of the DataLoader made at tests/guard/scripts/" \
           f"{made} (iterated at tests/guard/scripts/{loop}" in block, err[-6000:]
    assert "OOM killer" in block, block  # what the cgroup says (or that it cannot tell)
    d = _report(tmp_path)["diagnosis"]
    assert d["cause"] == "loader_worker_killed" and d["culprits"] == [1]
    # Rank 1 is shown at its loader's loop, not where torch happened to raise.
    assert loop in d["positions"]["1"]["user"] and d["positions"]["1"]["doing"] == "crashed"


# -- the wording, in one process ---------------------------------------------------------------

def test_timeout_value_is_read_from_gloo_nccl_and_monitored_barrier_errors():
    assert timeout_ms("[unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation "
                      "to complete") == 10000
    assert timeout_ms("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL("
                      "SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
                      "ran for 600055 milliseconds before timing out.") == 600000
    assert timeout_ms("Rank 1 failed to pass monitoredBarrier in 5000 ms") == 5000
    # The store's own timeout is another setting: not a collective's timeout.
    assert timeout_ms("Socket Timeout: wait timeout after 30000ms, keys: /ddp") is None
    assert timeout_ms("Connection closed by peer") is None
    # gloo's pair timeout says no figure: the group's own setting is used, 0 when unknown.
    assert timeout_ms("RuntimeError: Application timeout caused pair closure", 10000) == 10000
    assert timeout_ms("RuntimeError: Application timeout caused pair closure") == 0


def test_worker_death_is_read_with_its_signal():
    assert worker_death("RuntimeError: DataLoader worker (pid 4242) is killed by signal: "
                        "Killed. ") == WorkerDeath(4242, "SIGKILL")
    assert worker_death("DataLoader worker (pid 7) is killed by signal: Segmentation "
                        "fault. ") == WorkerDeath(7, "SIGSEGV")
    assert worker_death("DataLoader worker (pid(s) 12, 13) exited unexpectedly") == \
        WorkerDeath(12, None)
    assert worker_death("CUDA out of memory") is None
    with pytest.raises(ValueError, match="-1"):
        WorkerDeath(-1, None)


def test_peer_doing_tells_working_from_blocked_from_gone():
    working = {"where": "train.py:70 in save", "doing": "running Python code", "quiet": 0.1}
    assert peer_doing(0, working) == \
        "rank 0 was alive and working (running Python code) at train.py:70 in save"
    blocked = {"where": "train.py:9 in <module>", "blocked": True,
               "pending": [["0", 7, "barrier", [], [], False]]}
    assert peer_doing(2, blocked) == \
        "rank 2 was itself blocked in barrier #7 (group 0) at train.py:9 in <module>"
    assert peer_doing(3, working, "exited (left the job)") == "rank 3 had exited (left the job)"
    # A heartbeat nobody renewed is no proof of work.
    assert peer_doing(0, working, silent=12.0) == ("rank 0 had not answered for 12 s (process "
                                                   "stopped or frozen?); it was last at "
                                                   "train.py:70 in save")
    assert "not published" in peer_doing(4, None)


def test_timeout_reason_names_the_setting_only_when_a_peer_worked():
    peers = {0: "rank 0 was alive and working (saving) at t.py:3 in save"}
    text = timeout_reason(1, 10000, " in barrier #4 (group 0)", "t.py:9 in <module>", peers,
                          "working")
    assert text.startswith("rank 1's collective in barrier #4 (group 0) at t.py:9 in <module> "
                           "failed on the process group's own timeout (10 s) while rank 0 "
                           "was alive and working")
    assert "timeout= argument of init_process_group" in text
    dead = timeout_reason(1, 500, "", "", {0: "rank 0 was itself blocked in x"}, "blocked")
    assert "(0.5 s)" in dead and "deadlock" in dead and "timeout=" not in dead
    frozen = timeout_reason(1, 500, "", "", {0: "rank 0 had not answered for 9 s"}, "frozen")
    assert frozen.endswith("while rank 0 had not answered for 9 s")


def test_timeout_cause_takes_the_strongest_evidence():
    assert timeout_cause([], [], [0, 2]) == ("collective_timeout", [0, 2], "working")
    assert timeout_cause([], [], []) == ("timeout_deadlock", [], "blocked")
    assert timeout_cause([], [3], [0]) == ("no_life", [3], "frozen")
    assert timeout_cause([2], [3], [0]) == ("peer_gone", [2], "gone")


def test_oom_words_follow_the_cgroup_count():
    assert "OOM killer ended 2 process(es)" in oom_words(3, 5)
    assert "not this job's OOM killer" in oom_words(3, 3)
    assert "does not say which" in oom_words(None, 3)
    text = worker_reason(1, WorkerDeath(9, "SIGKILL"), "t.py:5 in <module>", "m.py:2 in f",
                         oom_words(0, 1))
    assert text.startswith("rank 1's DataLoader worker (pid 9) was killed by SIGKILL, a worker "
                           "of the loader iterated at t.py:5 in <module>; the kernel's OOM")
    assert "raised it where the training thread happened to be (m.py:2 in f)" in text
    assert "OOM" not in worker_reason(1, WorkerDeath(9, None), None, "", "")


# faulthandler's dump of a rank gloo aborted while a second thread stood in a collective.
_C10D = "/".join([os.path.dirname(threading.__file__), "site-packages", "torch", "distributed"])
_THREADING = threading.__file__
FAULT = f"""Fatal Python error: Aborted

Thread 0x00007f734106b6c0 (most recent call first):
  File "{_C10D}/distributed_c10d.py", line 3252 in all_reduce
  File "{_C10D}/c10d_logger.py", line 83 in wrapper
  File "/work/job/train.py", line 78 in metrics_sync
  File "{_THREADING}", line 982 in run

Thread 0x00007f7348d266c0 (most recent call first):
  File "{_THREADING}", line 331 in wait

Thread 0x00007f7369e85b80 (most recent call first):
  File "/work/job/train.py", line 85 in <module>
"""
MAIN = 0x00007F7369E85B80


def test_fault_log_names_a_second_threads_collective_and_the_training_line(tmp_path):
    head, threads = parse_fault(FAULT, MAIN)
    assert head == "Fatal Python error: Aborted"
    assert [t.main for t in threads] == [False, False, True]
    path = tmp_path / "fault.txt"
    path.write_text(FAULT)
    words = last_words(str(path), MAIN)
    assert ("inside torch.distributed.all_reduce called from a second thread (not the "
            "training thread) at /work/job/train.py:78 in metrics_sync; its training thread "
            "was at /work/job/train.py:85 in <module>: a collective the other ranks did not "
            "match") in words, words
    # The report shows the thread in the collective first, then the training thread.
    stacks = fault_stacks(str(path), MAIN)
    first, second = list(stacks.values())[:2]
    assert first[-1]["func"] == "all_reduce" and second[-1]["line"] == 85
    # The training thread's own collective, as before.
    own = FAULT.replace('"/work/job/train.py", line 85 in <module>',
                        f'"{_C10D}/distributed_c10d.py", line 9 in barrier\n'
                        '  File "/work/job/train.py", line 85 in <module>')
    path.write_text(own)
    assert "inside torch.distributed.barrier called at /work/job/train.py:85" in \
        last_words(str(path), MAIN)


def test_an_nccl_watchdog_abort_is_told_as_the_timeout_not_a_native_crash():
    tail = ["[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=9, OpType=BROADCAST, NumelIn=1, NumelOut=1, "
            "Timeout(ms)=10000) ran for 10043 milliseconds before timing out."]
    text = signal_text(1, 77, "SIGABRT", None, None, tail)
    assert "NCCL's watchdog ended it: a collective ran out the process group's timeout (10 s)" \
        in text and "timeout= argument of init_process_group" in text
    assert "native code" not in text and "Timeout(ms)=10000" in text
    other = signal_text(1, 77, "SIGABRT", None, None, ["Received data size doesn't match"])
    assert "a crash inside native code" in other


def _die_by_sigkill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_workers_signal_is_known_when_torch_only_saw_it_exit():
    # torch may notice a dead worker by polling ("exited unexpectedly", no signal named);
    # the worker's process object still holds the status.
    import multiprocessing as mp

    from ddpguard.guard import workers

    proc = mp.get_context("fork").Process(target=_die_by_sigkill)
    proc.start()
    workers._note([proc], "train.py:5 in <module>")
    proc.join(10)
    assert workers.site_of(proc.pid) == "train.py:5 in <module>"
    assert workers.exit_signal(proc.pid) == "SIGKILL"
    assert workers.exit_signal(1) is None  # never seen
    # A worker the loader's own shutdown terminated is no cause; a killed one is.
    term = mp.get_context("fork").Process(target=time.sleep, args=(30,))
    term.start()
    workers._note([term], "train.py:9 in <module>")
    term.terminate()
    term.join(10)
    assert workers.exit_signal(term.pid) == "SIGTERM"
    assert workers.dead_worker() == (proc.pid, "SIGKILL")


def test_launcher_composes_the_report_from_the_fault_logs(tmp_path):
    """No rank left to report: the dead rank's fatal dump and the survivor's SIGTERM dump (no
    fatal line: it was ended, it did not fail) give the verdict, read by `ddpguard run`. Logs
    of another launch, and logs without a fatal dump, prove nothing."""
    from ddpguard.guard.fault import HEADER
    from ddpguard.launch.postmortem import clear_logs, compose, read_logs

    src = tmp_path / "train.py"
    src.write_text("import torch.distributed as dist\n" * 9 +
                   "if rank == 0:\n    dist.all_reduce(t)\nloss.backward()\n")
    dead = (f"{HEADER} rank=0 world=2 pid=11 main=0x{MAIN:016x} launch=L1\n"
            f"Fatal Python error: Aborted\n\nCurrent thread 0x{MAIN:016x} (most recent call "
            f"first):\n  File \"{_C10D}/distributed_c10d.py\", line 3252 in all_reduce\n"
            f"  File \"{src}\", line 11 in <module>\n")
    ended = (f"{HEADER} rank=1 world=2 pid=12 main=0x{MAIN:016x} launch=L1\n"
             f"Current thread 0x{MAIN:016x} (most recent call first):\n"
             f"  File \"{src}\", line 12 in <module>\n")
    (tmp_path / "ddpguard-fault-x-rank0-11.txt").write_text(dead)
    (tmp_path / "ddpguard-fault-x-rank1-12.txt").write_text(ended)
    (tmp_path / "ddpguard-fault-y-rank0-13.txt").write_text(dead.replace("launch=L1",
                                                                          "launch=L2"))
    assert parse_fault(ended, MAIN)[0] == ""  # a SIGTERM dump has no fatal line
    logs = read_logs(str(tmp_path), "L1")
    assert [(log.rank, bool(log.fatal)) for log in logs] == [(0, True), (1, False)]
    rep = compose(logs)
    assert rep is not None and rep["reporter_rank"] is None
    d = rep["diagnosis"]
    assert d["cause"] == "conditional_collective", d
    assert f"{src}:11" in rep["reason"] and "rank 1 was ended by the launcher" in rep["reason"]
    assert [r["state"] for r in rep["ranks"]] == ["dead", "running"]
    assert compose([log for log in logs if not log.fatal]) is None
    clear_logs(str(tmp_path), "L1", keep=False)
    assert sorted(p.name for p in tmp_path.glob("ddpguard-fault-*")) == [
        "ddpguard-fault-x-rank0-11.txt", "ddpguard-fault-y-rank0-13.txt"]


def _ended_by_sigterm(src: Path) -> str:
    """Rank 0's log when the launcher ended it with SIGTERM in an all_reduce at src:21."""
    from ddpguard.guard.fault import HEADER

    return (f"{HEADER} rank=0 world=2 pid=30 main=0x{MAIN:016x} launch=K\n"
            f"Current thread 0x{MAIN:016x} (most recent call first):\n"
            f"  File \"{_C10D}/distributed_c10d.py\", line 3252 in all_reduce\n"
            f"  File \"{src}\", line 21 in <module>\n")


def test_a_rank_killed_without_a_trace_is_composed_from_the_survivors_sigterm_dump(tmp_path):
    """corpus33g's tuning case: rank 1 SIGKILLed (the OOM killer's signal) while its loader
    worker kept its sockets open, so rank 0's collective never failed and the launcher's agent
    ended rank 0 with SIGTERM before its guard's grace ran out: exit 1 and no report. Rank 1's
    log holds no stack, no error and no exit of its own; rank 0's holds the SIGTERM's stacks."""
    from ddpguard.guard.ends import oom_words
    from ddpguard.guard.fault import HEADER
    from ddpguard.launch.postmortem import compose, read_logs

    src = tmp_path / "train.py"
    src.write_text("x = 1\n" * 30)
    killed = f"{HEADER} rank=1 world=2 pid=31 main=0x{MAIN:016x} launch=K\n"
    ended = _ended_by_sigterm(src)
    (tmp_path / "ddpguard-fault-k-rank1-31.txt").write_text(killed)
    (tmp_path / "ddpguard-fault-k-rank0-30.txt").write_text(ended)
    rep = compose(read_logs(str(tmp_path), "K"), oom_words(0, 1))
    assert rep is not None
    d = rep["diagnosis"]
    assert d["cause"] == "crashed_rank" and d["culprits"] == [1], d
    assert "rank 1 died without a trace, killed by SIGKILL" in rep["reason"], rep["reason"]
    assert "the kernel's OOM killer ended 1 process(es)" in rep["reason"], rep["reason"]
    assert [r["state"] for r in rep["ranks"]] == ["running", "dead"]
    assert "OOM killer or a kill -9" in compose(read_logs(str(tmp_path), "K"))["reason"]
    assert "not this job's OOM killer" in compose(read_logs(str(tmp_path), "K"),
                                                   oom_words(1, 1))["reason"]
    # Twins: a rank with no log at all exited normally (its log is removed at exit); ranks
    # that all left no stack (the script's own SIGTERM handler) prove nothing.
    (tmp_path / "ddpguard-fault-k-rank1-31.txt").unlink()
    assert compose(read_logs(str(tmp_path), "K")) is None
    (tmp_path / "ddpguard-fault-k-rank1-31.txt").write_text(killed)
    (tmp_path / "ddpguard-fault-k-rank0-30.txt").write_text(ended.split("Current", 1)[0])
    assert compose(read_logs(str(tmp_path), "K")) is None


def test_a_second_threads_failed_collective_noted_in_the_log_is_the_cause(tmp_path):
    """The thread whose collective gloo paired with a peer's training collective has ended
    (its collective failed) before anything could dump it: its note names it, and the
    composed report's title is the second thread's, not the aborted peer's crash. The
    survivor's training thread was inside ddpguard's crash handling when it was ended: its
    own error's line, noted first, is where it is shown. Twin: no note, no second thread."""
    from ddpguard.guard.fault import HEADER, fault_notes, side_collectives
    from ddpguard.launch.postmortem import compose, read_logs

    src = tmp_path / "train.py"
    src.write_text("x = 1\n" * 30)
    dead = (f"{HEADER} rank=1 world=2 pid=21 main=0x{MAIN:016x} launch=L\n"
            f"Fatal Python error: Aborted\n\nCurrent thread 0x{MAIN:016x} (most recent call "
            f"first):\n  File \"{src}\", line 17 in train\n")
    note = (f"# ddpguard thread-error: Thread-1 (report)|all_reduce|{src}:22 in report|"
            "RuntimeError: Connection reset by peer\n")
    error = f"# ddpguard error: {src}:17 in train|RuntimeError: Connection reset by peer\n"
    ours = (f"Current thread 0x{MAIN:016x} (most recent call first):\n"
            f"  File \"{os.path.dirname(ddpguard.__file__)}/guard/crash.py\", line 9 in x\n")
    survivor = f"{HEADER} rank=0 world=2 pid=20 main=0x{MAIN:016x} launch=L\n"
    (tmp_path / "ddpguard-fault-a-rank1-21.txt").write_text(dead)
    (tmp_path / "ddpguard-fault-a-rank0-20.txt").write_text(survivor + note + error + ours)
    assert [k for k, _ in fault_notes(survivor + note + error)] == ["thread-error", "error"]
    assert side_collectives(survivor + note, MAIN) == [
        ("Thread-1 (report)", "all_reduce", f"{src}:22 in report")]
    rep = compose(read_logs(str(tmp_path), "L"))
    assert rep is not None
    d = rep["diagnosis"]
    assert d["cause"] == "second_thread" and d["culprits"] == [0], d
    assert f"{src}:22 in report" in rep["reason"]
    assert d["positions"]["0"]["user"].startswith(f"{src}:17 in train"), d["positions"]["0"]
    (tmp_path / "ddpguard-fault-a-rank0-20.txt").write_text(survivor + error + ours)
    assert compose(read_logs(str(tmp_path), "L"))["diagnosis"]["cause"] != "second_thread"



def test_a_peer_aborted_in_its_second_threads_collective_is_a_second_thread(tmp_path):
    """The survivor's report: the dead peer's last words put it in a collective its second
    thread issued; that, not a rank-conditional branch, is the title. And a launcher that
    holds the logs of only some of the ranks (one srun task per rank) composes nothing: the
    survivors' own launchers print the verdict."""
    from ddpguard.guard.diagnose import diagnose
    from ddpguard.guard.fault import HEADER
    from ddpguard.launch.postmortem import compose, read_logs

    reason = ("rank 1 died (it died of a fatal signal (Fatal Python error: Aborted) inside "
              "torch.distributed.all_reduce called from a second thread (not the training "
              "thread) at t.py:189 in _count_ranks: a collective the other ranks did not "
              "match is the usual cause), while rank 0 waited in all_reduce #26")
    recs = [{"rank": 0, "state": "running", "hb": {}, "stacks": None},
            {"rank": 1, "state": "dead", "hb": {}, "stacks": None}]
    d = diagnose(recs, {}, "peer_gone", reason, [1])
    assert d["cause"] == "second_thread", d
    d = diagnose(recs, {}, "peer_gone", reason.replace("called from a second thread (not "
                                                       "the training thread) at", "called at"),
                 [1])
    assert d["cause"] == "mismatch", d
    (tmp_path / "ddpguard-fault-a-rank1-21.txt").write_text(
        f"{HEADER} rank=1 world=2 pid=21 main=0x{MAIN:016x} launch=L\n"
        f"Fatal Python error: Aborted\n\nCurrent thread 0x{MAIN:016x} (most recent call "
        "first):\n  File \"/u/t.py\", line 17 in train\n")
    assert compose(read_logs(str(tmp_path), "L")) is None


def test_a_workers_error_arriving_during_the_crash_path_is_the_one_reported(tmp_path):
    # What CI saw under load: the worker died while sending a batch, the rank's read ended
    # with a connection reset, and torch's SIGCHLD handler raised the worker's own error at
    # the first call in the bootstrap's `except` clause, which ended the rank with a traceback
    # of ours and no report. Here a helper thread takes the SIGCHLD (the training thread
    # blocks it), so the rank's read fails with the handler still pending, and the handler
    # runs at the first call after the error left the script: in the bootstrap.
    script = tmp_path / "late_sigchld.py"
    script.write_text(
        "import os, signal, socket, threading, time\n"
        "def handler(signum, frame):\n"
        "    raise RuntimeError('DataLoader worker (pid 4242) is killed by signal: Killed. ')\n"
        "signal.signal(signal.SIGCHLD, handler)\n"
        "a, b = socket.socketpair()\n"
        "a.settimeout(1.0)\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), os.kill(os.getpid(), "
        "signal.SIGCHLD))).start()\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})\n"
        "a.recv(1)  # the batch that never comes\n")
    res = subprocess.run([sys.executable, "-m", "ddpguard.guard.bootstrap", str(script)],
                         cwd=tmp_path, env=child_env(), capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1, res.stderr
    said = [ln for ln in res.stderr.splitlines() if ln.startswith("ddpguard: rank")]
    assert said == ["ddpguard: rank ? crashed: RuntimeError: DataLoader worker (pid 4242) is "
                    "killed by signal: Killed.  at late_sigchld.py:9"], res.stderr
    assert "guard/bootstrap.py" not in res.stderr, res.stderr  # no traceback of ours


def test_a_workers_error_raised_at_the_bootstraps_own_call_is_reported(tmp_path):
    # The exact window CI hit: the handler ran at the bootstrap's call into the crash path
    # (here that call raises the worker's error once, as the handler does at its first line).
    script = tmp_path / "reset.py"
    script.write_text("raise ConnectionResetError(104, 'Connection reset by peer')\n")
    driver = (
        "import sys\n"
        "from ddpguard.guard import bootstrap, crash\n"
        "real, calls = crash.report_exception, []\n"
        "def first_call_interrupted(*a, **k):\n"
        "    calls.append(1)\n"
        "    if len(calls) == 1:\n"
        "        raise RuntimeError('DataLoader worker (pid 4242) is killed by signal: "
        "Killed. ')\n"
        "    return real(*a, **k)\n"
        "crash.report_exception = bootstrap.report_exception = first_call_interrupted\n"
        f"sys.exit(bootstrap.main([{str(script)!r}]))\n")
    res = subprocess.run([sys.executable, "-c", driver], cwd=tmp_path, env=child_env(),
                         capture_output=True, text=True, timeout=60)
    said = [ln for ln in res.stderr.splitlines() if ln.startswith("ddpguard: rank")]
    assert res.returncode == 1 and said == [
        "ddpguard: rank ? crashed: RuntimeError: DataLoader worker (pid 4242) is killed by "
        "signal: Killed.  at reset.py:1"], res.stderr


def test_a_collective_issued_under_a_rank_test_just_before_the_end_is_the_composed_cause(
        tmp_path):
    """torch.multiprocessing ends the survivor the moment gloo aborts its peer, before any
    guard can report; the two stacks then stand at the same later line (the next forward).
    Rank 0's log noted the collective it issued under a rank test a moment before (issued.py):
    that line is the cause. Twin: the same note long before the end (it was met) is not."""
    import time as _time

    from ddpguard.guard.fault import HEADER
    from ddpguard.launch.postmortem import compose, read_logs

    src = tmp_path / "train.py"
    src.write_text("x = 1\n" * 5 + "if rank == 0:\n    dist.broadcast_object_list(m)\n"
                   "out = model(xb)\n")
    dead = (f"{HEADER} rank=1 world=2 pid=41 main=0x{MAIN:016x} launch=R\n"
            f"Fatal Python error: Aborted\n\nCurrent thread 0x{MAIN:016x} (most recent call "
            f"first):\n  File \"{_C10D}/distributed_c10d.py\", line 3252 in broadcast\n"
            f"  File \"{src}\", line 8 in <module>\n")

    def ended(at: float) -> str:
        return (f"{HEADER} rank=0 world=2 pid=40 main=0x{MAIN:016x} launch=R\n"
                f"# ddpguard ranked: {at:.3f}|broadcast|{src}:7 in <module>\n"
                f"Current thread 0x{MAIN:016x} (most recent call first):\n"
                f"  File \"{_C10D}/distributed_c10d.py\", line 3252 in broadcast\n"
                f"  File \"{src}\", line 8 in <module>\n")

    (tmp_path / "ddpguard-fault-r-rank1-41.txt").write_text(dead)
    (tmp_path / "ddpguard-fault-r-rank0-40.txt").write_text(ended(_time.time() - 0.5))
    rep = compose(read_logs(str(tmp_path), "R"))
    assert rep is not None
    assert rep["diagnosis"]["cause"] == "conditional_collective", rep["diagnosis"]
    assert f"{src}:7" in rep["reason"] and "under a rank test" in rep["reason"], rep["reason"]
    (tmp_path / "ddpguard-fault-r-rank0-40.txt").write_text(ended(_time.time() - 600))
    rep = compose(read_logs(str(tmp_path), "R"))
    assert rep is not None and "under a rank test" not in rep["reason"], rep["reason"]
    # Twin: rank 1 noted the same line (a test every rank passes, `if local_rank != -1:`).
    (tmp_path / "ddpguard-fault-r-rank0-40.txt").write_text(ended(_time.time() - 0.5))
    (tmp_path / "ddpguard-fault-r-rank1-41.txt").write_text(dead.replace(
        "Fatal Python", f"# ddpguard ranked: {_time.time() - 9:.3f}|broadcast|{src}:7 in "
        "<module>\nFatal Python"))
    rep = compose(read_logs(str(tmp_path), "R"))
    assert rep is not None and "under a rank test" not in rep["reason"], rep["reason"]


def test_only_a_collective_issued_under_a_rank_test_is_noted(tmp_path):
    from ddpguard.guard.issued import IssueSites

    src = tmp_path / "train.py"
    src.write_text("if rank == 0:\n    dist.barrier()\ndist.all_reduce(t)\n")
    notes: list[tuple[str, str]] = []
    sites = IssueSites(note=lambda kind, text: notes.append((kind, text)))
    sites._note_ranked("barrier", f"{src}:2 in <module>")
    sites._note_ranked("all_reduce", f"{src}:3 in <module>")  # twin: every rank issues it
    assert [(k, t.split("|", 1)[1]) for k, t in notes] == [
        ("ranked", f"barrier|{src}:2 in <module>")], notes


def test_a_crashed_rank_without_stacks_stands_at_its_errors_line(tmp_path):
    from ddpguard.guard.diagnose import rank_position

    script = tmp_path / "train.py"
    script.write_text("import torch\nfor b in loader:\n    raise ValueError('bad batch')\n")
    hb = {"where": "train.py:2 in <module>  `for b in loader:`", "kind": "running"}
    crashed = {"rank": 1, "state": "crashed", "stacks": None, "hb": hb,
               "error": f"ValueError: bad batch at {script}:3"}
    pos = rank_position(crashed)  # type: ignore[arg-type]
    # Lightning catches the error and exits before any dump: the listing said "crashed at ?".
    assert pos["user_line"] == (str(script), 3), pos
    assert pos["user"].endswith(":3  `raise ValueError('bad batch')`"), pos
    # Twin: a rank killed with no error text keeps its last heartbeat's place.
    dead = {**crashed, "state": "dead", "error": None}
    assert rank_position(dead)["user"] == hb["where"]  # type: ignore[arg-type]


def test_a_loader_rebuilt_by_a_framework_keeps_the_users_making_line(tmp_path):
    from torch.utils.data import DataLoader, dataloader

    from ddpguard.guard import workers

    workers.note_loader_sites(dataloader)
    # Lightning's fit and accelerate's prepare rebuild the user's loader inside their own code
    # (here: a file under site-packages), before or after the group exists.
    lib = tmp_path / "site-packages" / "fw" / "fit.py"
    lib.parent.mkdir(parents=True)
    lib.write_text("def rebuild(dataloader, cls):\n"
                   "    return cls(dataloader.dataset, batch_size=2)\n")
    code: dict = {}
    exec(compile(lib.read_text(), str(lib), "exec"), code)
    user = DataLoader(list(range(8)), batch_size=4)  # the USER LOADER
    here = f"{__file__}:{sys._getframe().f_lineno - 1}"
    assert user._ddpguard_made_at == here
    rebuilt = code["rebuild"](user, DataLoader)
    assert rebuilt._ddpguard_made_at == here
    # Twin: a loader the library makes from nothing is placed at the user's call into it.
    fresh = code["rebuild"](type("D", (), {"dataset": [1, 2]})(), DataLoader)
    assert fresh._ddpguard_made_at == f"{__file__}:{sys._getframe().f_lineno - 1}"


def test_a_rank_killed_without_a_trace_is_shown_where_it_was_seen_last(tmp_path):
    """Under mp.spawn the parent ends the survivors at once when a rank is SIGKILLed, so no
    guard reads the dead rank's heartbeat: its fault log's seen line is all that says where
    it stood (corpus33i's tuning case said "died at ?")."""
    import faulthandler

    from ddpguard.guard.fault import FaultLog, fault_notes, fault_seen
    from ddpguard.launch.postmortem import compose, read_logs

    src = tmp_path / "train.py"
    src.write_text("x = 1\n" * 30)
    on = faulthandler.is_enabled()
    faulthandler.disable()  # pytest's own: the guard keeps a script's faulthandler
    log = FaultLog()
    try:
        path = log.start(str(tmp_path), "k", 1, 2, MAIN, "K")
        assert path is not None
        hb = {"where": f"{src}:7 in step  `x = 1`", "epoch": 2, "steps": 45, "steps_epoch": 5,
              "batches": 46, "t": 1.0}
        log.seen({**hb, "where": f"{src}:6 in step  `x = 1`"})
        log.seen(hb)
        log.note("thread-error", "a|b|c|d")  # notes go on after the rewritten line
        text = Path(path).read_text()
        killed = text
    finally:
        log.stop()
        if on:
            faulthandler.enable()
    assert fault_seen(killed) == {**hb, "t": 1.0}, killed[:800]
    assert fault_notes(killed) == [("thread-error", "a|b|c|d")]
    killed = killed.replace("# ddpguard thread-error: a|b|c|d\n", "")
    ended = _ended_by_sigterm(src)
    (tmp_path / "ddpguard-fault-k-rank1-31.txt").write_text(killed)
    (tmp_path / "ddpguard-fault-k-rank0-30.txt").write_text(ended)
    rep = compose(read_logs(str(tmp_path), "K"))
    assert rep is not None and rep["diagnosis"]["cause"] == "crashed_rank", rep
    pos = rep["diagnosis"]["positions"]["1"]
    assert pos["doing"] == "died with no stack; last seen" and f"{src}:7" in pos["user"], pos
    assert rep["ranks"][1]["hb"]["steps"] == 45
    # Twin: a rank that never moved after its guard started has an empty seen line: no place.
    fresh = killed.split("\n", 1)[0] + "\n# ddpguard seen: " + " " * 40 + "\n"
    (tmp_path / "ddpguard-fault-k-rank1-31.txt").write_text(fresh)
    rep = compose(read_logs(str(tmp_path), "K"))
    assert rep is not None and rep["diagnosis"]["positions"]["1"]["user"] == "?", rep
