"""The report's title from the ranks' aligned collective sequences (guard/align.py), on
made-up records: each title with its near twin, the same facts but one, that must get another
title. The real 2-rank jobs of the four cases found on real code are in
tests/guard/test_guard_align_jobs.py."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

from ddpguard.guard.diagnose import diagnose
from ddpguard.guard.loops import inside_loop, left_at, skip_before, way_out
from ddpguard.guard.report import format_text
from ddpguard.guard.stacks import blocked_call

TORCH = "/x/site-packages/torch/"
SCRIPT = "/u/train.py"
# A training script: the loop at line 3, forward at 6, a local skip at 8, backward at 9.
SOURCE = [
    "import torch",                                        # 1
    "for epoch in range(3):",                              # 2
    "    for i, (xb, yb) in enumerate(loader):",           # 3
    "        if i % 100 == 0:",                            # 4
    "            dist.all_reduce(stats)",                  # 5
    "        out = model(xb)",                             # 6
    "        loss = loss_fn(out, yb)",                     # 7
    "        if not torch.isfinite(loss): continue",       # 8
    "        loss.backward()",                             # 9
    "        opt.step()",                                  # 10
    "    dist.barrier()",                                  # 11
    "    if rank == 0:",                                   # 12
    "        dist.all_reduce(stats)",                      # 13
]
SOURCES = {SCRIPT: SOURCE}

FWD = [(SCRIPT, 6, "<module>"), (f"{TORCH}nn/parallel/distributed.py", 1, "forward"),
       (f"{TORCH}nn/parallel/distributed.py", 2, "_sync_buffers"),
       (f"{TORCH}nn/parallel/distributed.py", 3, "_distributed_broadcast_coalesced")]
BWD = [(SCRIPT, 9, "<module>"), (f"{TORCH}autograd/graph.py", 5, "_engine_run_backward")]


def coll(line, name):
    return [(SCRIPT, line, "<module>"), (f"{TORCH}distributed/distributed_c10d.py", 1, name)]


def entry(seq, op="all_reduce", sizes=((65,),), dtype="Float"):
    return ["0", seq, op, [list(s) for s in sizes], [dtype] * len(sizes), False]


def seq_entry(seq, op, phase, batches, fwd, tfwd, bwd, thread="", sig=None, line=None):
    return {"g": "0", "seq": seq, "op": op, "sig": sig or op, "desc": f"{op} #{seq} (group 0)",
            "done": False, "phase": phase, "epoch": 0, "batches": batches, "fwd": fwd,
            "tfwd": tfwd, "bwd": bwd, "steps": bwd, "thread": thread, "line": line}


def rec(rank, frames, *, pending=(), batches=0, fwd=0, tfwd=None, bwd=0, state="running",
        quiet=0.0, sequence=(), loaders=None, codes=None):
    codes = codes or {}
    hb = {"pending": list(pending), "blocked": bool(pending), "batches": batches,
          "forwards": fwd, "train_forwards": fwd if tfwd is None else tfwd, "backwards": bwd,
          "steps": bwd, "epoch": 0, "quiet": quiet,
          "loaders": loaders if loaders is not None else
          {f"{SCRIPT}:3": {"epoch": 0, "batches": batches, "len": 32, "key": "k/0"}}}
    return {"rank": rank, "state": state, "error": None, "hb": hb, "sequence": list(sequence),
            "stacks": {"main": [{"file": f, "line": ln, "func": fn,
                                 "code": codes.get(ln, SOURCE[ln - 1].strip()
                                                   if f == SCRIPT and ln <= len(SOURCE) else "")}
                                for f, ln, fn in frames]} if frames else None}


def diag(recs, cause="mismatch", culprits=(0, 1)):
    return diagnose(recs, SOURCES, cause=cause, reason="r", culprits=list(culprits))


def said(text, d):
    """The explanation holds `text` (its first word is capitalised)."""
    return text.lower() in d["explanation"].lower()


# -- a step whose backward some ranks skipped ---------------------------------------------


def skipped(rank1_bwd):
    # Rank 0 waits in batch 11's gradient all-reduce; rank 1 is in batch 12's forward.
    return [rec(0, BWD, pending=[entry(39)], batches=11, fwd=11, bwd=11),
            rec(1, FWD, pending=[entry(39, "broadcast", ((16,),))], batches=12, fwd=12,
                bwd=rank1_bwd)]


def test_skipped_backward_names_the_rank_the_batch_and_the_line_it_left_at():
    d = diag(skipped(rank1_bwd=10))
    assert d["cause"] == "skipped_backward", d
    assert d["culprits"] == [1]
    assert said("rank 1 skipped the backward of batch 11", d)
    assert said(f"left the step at {SCRIPT}:8 `if not torch.isfinite(loss): continue`", d)
    assert "loss * 0" in d["fix"]


def test_twin_every_backward_run_is_not_a_skipped_backward():
    # The same two waits, but rank 1 ran every backward: the counters show no skip, and the
    # old guess from the buffer broadcast ("forward on some ranks") is not made either.
    d = diag(skipped(rank1_bwd=11))
    assert d["cause"] == "mismatch", d["cause"]


def test_twin_a_collective_inside_the_forward_of_the_same_batch_is_not_a_skipped_backward():
    # Lightning runs training_step inside DDP's forward: rank 0 waits in a barrier its model
    # code issued there, in batch 3's forward; rank 1 is in batch 3's gradient all-reduce.
    # Rank 0 has one backward fewer only because it has not reached it.
    inside = [(SCRIPT, 6, "<module>"), (f"{TORCH}nn/parallel/distributed.py", 1, "forward"),
              (SCRIPT, 13, "training_step"), (f"{TORCH}distributed/distributed_c10d.py", 1,
                                               "barrier")]
    recs = [rec(0, inside, pending=[entry(22, "barrier", ((1,),))], batches=3, fwd=3, bwd=2),
            rec(1, BWD, pending=[entry(22, sizes=((5,),))], batches=3, fwd=3, bwd=3)]
    d = diag(recs)
    assert d["cause"] != "skipped_backward", d


def test_twin_an_evaluation_forward_that_shifted_the_numbers_is_not_a_skipped_backward():
    # Rank 0 evaluated once through the wrapper (its buffer broadcast paired with rank 1's
    # next training forward); now rank 0's training forward of batch 3 meets rank 1's
    # backward of batch 3. The counters read "fewer backwards" on rank 0, but it is the
    # evaluation forward that took the numbers.
    recs = [rec(0, FWD, pending=[entry(12, "broadcast", ((16,),))], batches=3, fwd=4, tfwd=3,
                bwd=2),
            rec(1, BWD, pending=[entry(12)], batches=3, fwd=3, tfwd=3, bwd=3)]
    d = diag(recs)
    assert d["cause"] == "forward_on_some_ranks", d
    assert d["culprits"] == [0]


def test_left_at_needs_forward_before_backward_in_one_file():
    assert left_at(SOURCES, (SCRIPT, 6), (SCRIPT, 9)) == \
        f"{SCRIPT}:8 `if not torch.isfinite(loss): continue`"
    assert left_at(SOURCES, (SCRIPT, 9), (SCRIPT, 6)) is None
    assert left_at(SOURCES, (SCRIPT, 6), ("/u/other.py", 9)) is None


# -- a forward through the wrapper on some ranks only ------------------------------------


def test_forward_on_some_ranks_needs_an_evaluation_forward_on_the_waiting_rank():
    # Rank 0 evaluates through the wrapper (2 forwards not in training) and waits in the
    # forward's buffer broadcast; rank 1 trained on and waits in its backward.
    recs = [rec(0, FWD, pending=[entry(40, "broadcast", ((16,),))], batches=10, fwd=12,
                tfwd=10, bwd=10),
            rec(1, BWD, pending=[entry(40)], batches=11, fwd=11, tfwd=11, bwd=11)]
    d = diag(recs)
    assert d["cause"] == "forward_on_some_ranks", d
    assert d["culprits"] == [0]


def test_twin_a_training_forward_while_a_peer_left_its_loop_is_a_rank_that_left():
    # The case: rank 0 in its training forward's buffer broadcast (batch 7), rank 1
    # out of the loop after 7 of 32 batches, waiting in the barrier after it.
    recs = [rec(0, FWD, pending=[entry(25, "broadcast", ((16,),))], batches=7, fwd=7, bwd=6),
            rec(1, coll(11, "barrier"), pending=[entry(25, "barrier", ())], batches=7, fwd=6,
                bwd=6)]
    d = diag(recs)
    assert d["cause"] == "left_early", d
    assert d["culprits"] == [1]
    assert f"iterated at {SCRIPT}:3 ended after 7 of 32 batches" in d["explanation"]
    # The same rank still inside its loop (a collective at line 5) issued an extra one.
    recs[1] = rec(1, coll(5, "all_reduce"), pending=[entry(25, sizes=((4,),))], batches=7,
                  fwd=6, bwd=6)
    d = diag(recs)
    assert d["cause"] == "extra_collective", d
    assert f"{SCRIPT}:5" in d["explanation"] and d["culprits"] == [1]


def test_a_rank_that_broke_out_to_an_evaluation_loop_left_early():
    # Rank 1 `break`s after drawing its 5th batch and runs an evaluation loop (more batches
    # of another loader, a barrier of its own); rank 0 is in the same training pass, in the
    # backward of its 5th batch. The global batch counts say rank 1 is ahead; the pass it
    # left says it left early.
    val = f"{SCRIPT}:20"
    recs = [rec(0, BWD, pending=[entry(31)], batches=5, fwd=5, bwd=4,
                loaders={f"{SCRIPT}:3": {"epoch": 0, "batches": 5, "len": 10, "end": ""}}),
            rec(1, coll(11, "barrier"), pending=[entry(31, "barrier", ())], batches=7, fwd=6,
                bwd=4, loaders={f"{SCRIPT}:3": {"epoch": 0, "batches": 5, "len": 10,
                                                "end": "drop"},
                                val: {"epoch": 0, "batches": 2, "len": 10, "end": ""}})]
    d = diag(recs)
    assert d["cause"] == "left_early", d
    assert d["culprits"] == [1]
    assert f"iterated at {SCRIPT}:3 ended after 5 of 10 batches" in d["explanation"]
    # The twin: rank 0 ran its training pass to the end too: nobody is left in that pass.
    recs[0]["hb"]["loaders"][f"{SCRIPT}:3"]["end"] = "stop"
    assert diag(recs)["cause"] != "left_early"


def test_a_rank_that_exited_before_the_end_of_its_pass_left_early():
    recs = [rec(0, FWD, pending=[entry(25, "broadcast", ((16,),))], batches=7, fwd=7, bwd=6),
            rec(1, None, batches=6, fwd=6, bwd=6, state="exited")]
    d = diag(recs, cause="peer_gone", culprits=[1])
    assert d["cause"] == "left_early" and "ended after 6 of 32 batches" in d["explanation"]
    # It had finished its pass: nothing says it left early, the decision's title stays
    # (and the alignment adds nothing).
    recs[1]["hb"]["loaders"][f"{SCRIPT}:3"]["batches"] = 32
    d = diag(recs, cause="peer_gone", culprits=[1])
    assert d["cause"] == "left_early" and "ended after" not in d["explanation"]


# -- an extra collective on some ranks ---------------------------------------------------


def test_extra_collective_names_its_line_and_its_conditional_twin():
    # Rank 0 all-reduces statistics (line 5, a condition every rank computes alike but
    # rank 1 did not reach) while rank 1 is in the forward's buffer broadcast.
    recs = [rec(0, coll(5, "all_reduce"), pending=[entry(9, sizes=((4,),))], batches=5,
                fwd=4, bwd=4),
            rec(1, FWD, pending=[entry(9, "broadcast", ((16,),))], batches=5, fwd=5, bwd=4)]
    d = diag(recs)
    assert d["cause"] == "extra_collective", d
    assert said(f"rank 0 issued all_reduce #9 (group 0) 4 Float at {SCRIPT}:5", d)
    assert d["culprits"] == [0]
    # The same collective under `if rank == 0:` is the more specific title.
    recs[0] = rec(0, coll(13, "all_reduce"), pending=[entry(9, sizes=((4,),))], batches=5,
                  fwd=4, bwd=4, loaders={})
    assert diag(recs)["cause"] == "conditional_collective"


def test_rank_tests_as_real_scripts_spell_them_make_a_conditional_collective():
    # The tutorials' `gpu == 0` (the process index under mp.spawn), a trainer's
    # `self.global_rank`, `is_master()`; the twin: a test of something else.
    for test, cause in [("if (i + 1) % 10 == 0 and gpu == 0:", "conditional_collective"),
                        ("if self.global_rank == 0:", "conditional_collective"),
                        ("if is_master():", "conditional_collective"),
                        ("if self.trainer.is_global_zero:", "conditional_collective"),
                        ("if accelerator.process_index == 0:", "conditional_collective"),
                        ("if rank0:", "conditional_collective"),
                        ("if (i + 1) % 10 == 0:", "extra_collective"),
                        ("if torch.cuda.is_available():", "extra_collective")]:
        src = [*SOURCE[:3], f"        {test}", *SOURCE[4:]]
        recs = [rec(0, coll(5, "all_reduce"), pending=[entry(9, sizes=((4,),))], batches=5,
                    fwd=4, bwd=4, loaders={}),
                rec(1, FWD, pending=[entry(9, "broadcast", ((16,),))], batches=5, fwd=5,
                    bwd=4, loaders={})]
        d = diagnose(recs, {SCRIPT: src}, cause="mismatch", reason="r", culprits=[0, 1])
        assert d["cause"] == cause, (test, d["cause"])


def test_twin_two_collectives_of_the_loop_itself_are_a_plain_mismatch():
    # Both ranks wait in collectives their loops issued: nothing shows which one is extra.
    recs = [rec(0, coll(5, "all_reduce"), pending=[entry(9, sizes=((4,),))], batches=5,
                fwd=4, bwd=4),
            rec(1, coll(11, "barrier"), pending=[entry(9, "barrier", ())], batches=5, fwd=4,
                bwd=4, loaders={})]
    assert diag(recs)["cause"] == "mismatch"


def test_extra_collective_before_a_peer_died_in_the_transport():
    # Rank 0 broadcast an object on its own in batch 6 (line 13, under `if rank == 0:`);
    # gloo aborted rank 1 inside its forward's buffer broadcast of that number.
    steady = [seq_entry(s, op, ph, b, b, b, b - (ph != "backward"), sig=f"{op}-{ph}")
              for b in (4, 5) for s, op, ph in ((3 * b, "broadcast", "forward"),
                                                (3 * b + 1, "all_reduce", "backward"))]
    odd = seq_entry(22, "broadcast", "loop", 6, 5, 5, 5, sig="broadcast-1-Long",
                    line=f"{SCRIPT}:13 in <module>")
    recs = [rec(0, FWD, batches=6, fwd=6, bwd=5, sequence=[*steady, odd]),
            rec(1, FWD, batches=0, state="dead")]
    d = diag(recs, cause="peer_gone", culprits=[1])
    assert d["cause"] == "conditional_collective", d
    assert said(f"rank 0 issued broadcast #22 (group 0) at {SCRIPT}:13", d)
    # Twin: the same broadcast was issued at every batch (its loop's usual collective): the
    # survivor's sequence shows nothing extra, and the death is the title.
    usual = [*steady, *(seq_entry(3 * b + 2, "broadcast", "loop", b, b, b, b,
                                  sig="broadcast-1-Long") for b in (4, 5)), odd]
    recs[0]["sequence"] = sorted(usual, key=lambda e: e["seq"])
    assert diag(recs, cause="peer_gone", culprits=[1])["cause"] == "crashed_rank"


# -- a collective from a second thread ---------------------------------------------------


def test_second_thread_is_named_and_its_twin_from_the_training_thread_is_not():
    def recs(thread):
        return [rec(0, BWD, pending=[entry(8)], batches=3, fwd=3, bwd=3,
                    sequence=[seq_entry(7, "all_reduce", "backward", 3, 3, 3, 3, sig="a-65")]),
                rec(1, BWD, pending=[entry(8)], batches=3, fwd=3, bwd=3,
                    sequence=[seq_entry(7, "all_reduce", "loop", 3, 3, 3, 2, thread=thread,
                                        sig="a-1")])]

    d = diag(recs("metrics-logger"), cause="desync")
    assert d["cause"] == "second_thread", d
    assert said("rank 1's thread 'metrics-logger' issued all_reduce #7", d)
    assert d["culprits"] == [1]
    assert diag(recs(""), cause="desync")["cause"] == "desync"
    # The thread still waits in its collective: its own stack names its line (the entry has
    # none: the recorder's lines are read only when a peer died).
    two = recs("metrics-logger")
    two[1]["stacks"]["metrics-logger (77)"] = [
        {"file": f"{TORCH}../threading.py", "line": 1, "func": "run", "code": ""},
        {"file": SCRIPT, "line": 13, "func": "report", "code": "dist.all_reduce(stats)"},
        {"file": f"{TORCH}distributed/distributed_c10d.py", "line": 1, "func": "all_reduce",
         "code": ""}]
    assert said(f"issued all_reduce #7 (group 0) at {SCRIPT}:13 in report", diag(two, "desync"))


# -- a rank blocked outside torch --------------------------------------------------------

FLOCK = {3: "fcntl.flock(fh, fcntl.LOCK_EX)"}


def blocked(quiet, line=3, code=FLOCK):
    return [rec(0, coll(11, "barrier"), pending=[entry(4, "barrier", ())], loaders={}),
            rec(1, [(SCRIPT, line, "<module>")], quiet=quiet, loaders={}, codes=code)]


def test_blocked_outside_torch_is_said_and_shown_as_blocked_not_computing():
    d = diag(blocked(quiet=4.0), cause="no_life", culprits=[1])
    assert d["cause"] == "blocked_outside", d
    assert d["positions"]["1"]["doing"] == "blocked in fcntl.flock (no CPU for 4 s)"
    assert "rank 0 waits for it in barrier #4" in d["explanation"]
    text = format_text({"diagnosis": d, "reporter_rank": 0, "world_size": 2,
                        "event": "training stalled", "ranks": blocked(4.0)}, None)
    assert "rank 1: blocked in fcntl.flock" in text and "computing" not in text


def test_twins_a_spinning_loop_and_a_call_burning_cpu_are_not_blocked():
    # `while True:` calls nothing: a stall with no sign of life, shown as running code.
    d = diag(blocked(quiet=4.0, code={3: "while True:"}), cause="no_life", culprits=[1])
    assert d["cause"] == "no_life"
    assert d["positions"]["1"]["doing"].startswith("computing")
    # The same call, with life a moment ago (CPU inside it): computing, not blocked.
    d = diag(blocked(quiet=0.2), cause="no_life", culprits=[1])
    assert d["cause"] == "no_life" and d["positions"]["1"]["doing"].startswith("computing")


def test_twin_a_wait_for_a_stuck_child_process_is_its_stall_not_a_lock_between_ranks():
    import subprocess

    recs = blocked(quiet=4.0, code={3: "subprocess.run(['upload', path])"})
    recs[1]["stacks"]["main"] += [
        {"file": subprocess.__file__, "line": 1, "func": "wait", "code": "self._wait()"},
        {"file": subprocess.__file__, "line": 2, "func": "_try_wait",
         "code": "(pid, sts) = os.waitpid(self.pid, wait_flags)"}]
    d = diag(recs, cause="no_life", culprits=[1])
    assert d["cause"] == "no_life", d
    assert d["positions"]["1"]["doing"].startswith("blocked in subprocess.run -> os.waitpid")


def test_a_rank_forked_by_multiprocessing_blocked_on_a_lock_is_blocked_outside():
    # mp.start_processes(..., start_method="fork"): popen_fork.py started the rank and stays
    # at the outer end of its stack; that is not a wait for a child (twin just above).
    import multiprocessing.popen_fork as popen_fork
    import multiprocessing.process as mp_process

    recs = blocked(quiet=4.0)
    recs[1]["stacks"]["main"][:0] = [
        {"file": popen_fork.__file__, "line": 71, "func": "_launch",
         "code": "code = process_obj._bootstrap(parent_sentinel=child_r)"},
        {"file": mp_process.__file__, "line": 314, "func": "_bootstrap", "code": "self.run()"},
        {"file": f"{TORCH}multiprocessing/spawn.py", "line": 87, "func": "_wrap",
         "code": "fn(i, *args)"}]
    d = diag(recs, cause="no_life", culprits=[1])
    assert d["cause"] == "blocked_outside", d


def test_blocked_call_names_library_waits_from_the_users_line():
    q_file, t_file = queue.__file__, threading.__file__
    frames = [{"file": SCRIPT, "line": 3, "func": "<module>", "code": "item = q.get()"},
              {"file": q_file, "line": 171, "func": "get", "code": "self.not_empty.wait()"},
              {"file": t_file, "line": 327, "func": "wait", "code": "waiter.acquire()"}]
    assert blocked_call(frames) == "q.get -> waiter.acquire"
    assert blocked_call([{"file": SCRIPT, "line": 3, "func": "f", "code": "with lock:"}]) \
        == "lock.__enter__"
    assert blocked_call([{"file": SCRIPT, "line": 3, "func": "f", "code": "os.read(r, 1)"}]) \
        == "os.read"
    assert blocked_call([{"file": SCRIPT, "line": 3, "func": "f", "code": "n += 1"}]) is None
    sleep = [{"file": SCRIPT, "line": 3, "func": "f", "code": "time.sleep(5)"}]
    assert blocked_call(sleep) is None


def test_a_lock_that_polls_with_sleeps_is_a_wait_for_the_lock():
    # py-filelock tries a non-blocking flock, then sleeps: the rank waits for the lock.
    lib = "/x/site-packages/filelock/_api.py"
    frames = [{"file": SCRIPT, "line": 7, "func": "evaluate",
               "code": "with FileLock(path):"},
              {"file": lib, "line": 330, "func": "__enter__", "code": "self.acquire()"},
              {"file": lib, "line": 290, "func": "acquire", "code": "time.sleep(poll_interval)"}]
    assert blocked_call(frames) == "FileLock(path).__enter__ -> acquire (polling a lock)"
    # Under mp.spawn torch's own wrapper is above the user's line: no wait of torch's.
    spawned = [{"file": f"{TORCH}multiprocessing/spawn.py", "line": 87, "func": "_wrap",
                "code": "fn(i, *args)"}, *frames]
    assert blocked_call(spawned) == "FileLock(path).__enter__ -> acquire (polling a lock)"
    in_torch = {"file": f"{TORCH}distributed/distributed_c10d.py", "line": 1, "func": "barrier",
                "code": "work.wait()"}
    assert blocked_call([*spawned[:2], in_torch]) is None
    # Twin: a library that sleeps between retries of something else is not a lock.
    frames[-1] = {**frames[-1], "func": "retry"}
    assert blocked_call(frames) is None


def test_inside_loop_by_indentation():
    assert inside_loop(SOURCE, 3, 9)
    assert not inside_loop(SOURCE, 3, 11)
    assert not inside_loop(SOURCE, 3, 2)


def test_a_pending_entry_the_recorder_has_retired_is_not_where_a_rank_waits():
    # The recorder's status lags its entries: both ranks still list #38 (the forward's last
    # broadcast of batch 11, retired) before the collectives they really wait in.
    retired = ["0", 38, "broadcast", [[1]], ["Long"], True]
    recs = skipped(rank1_bwd=10)
    last = seq_entry(38, "broadcast", "forward", 11, 11, 11, 10)
    recs[0]["sequence"] = [{**last, "done": True}, seq_entry(39, "all_reduce", "backward", 11,
                                                             11, 11, 11)]
    recs[1]["sequence"] = [{**last, "done": True}, seq_entry(39, "broadcast", "forward", 12,
                                                             12, 12, 10)]
    for r in recs:
        r["hb"]["pending"].insert(0, retired)
    assert diag(recs)["cause"] == "skipped_backward"


def test_way_out_names_the_one_statement_that_leaves_the_loop():
    loop = ["for i, b in enumerate(loader):",     # 1
            "    if rank == 1 and i == 4:",       # 2
            "        break",                      # 3
            "    if bad(b): continue",            # 4 (stays in the loop)
            "    step(b)",                        # 5
            "evaluate()"]                         # 6
    assert way_out({"t.py": loop}, "t.py:1") == "t.py:3 `break`"
    # Two ways out: the one under the rank test; twins: two alike (the report does not
    # guess which), none, an unknown file.
    two = [*loop[:5], "    if done(): return", "evaluate()"]
    assert way_out({"t.py": two}, "t.py:1") == "t.py:3 `break`"
    two[1] = "    if i == 4:"
    assert way_out({"t.py": two}, "t.py:1") is None
    assert way_out({"t.py": SOURCE}, "t.py:3") is None
    assert way_out({}, "t.py:1") is None


def test_a_rank_that_skipped_a_backward_and_exited_is_named_with_the_loops_one_skip():
    """The blind trial's case: rank 1 `continue`d past one backward, ran on (its gradient
    all-reduces paired with rank 0's next ones) and exited at its end; its stack is gone, so
    the line comes from the loop around rank 0's backward: its one `continue` before it."""
    recs = [rec(0, BWD, pending=[entry(40)], batches=32, fwd=32, bwd=32),
            rec(1, None, batches=32, fwd=32, bwd=31, state="exited")]
    d = diag(recs, cause="peer_gone", culprits=[1])
    assert d["cause"] == "skipped_backward", d
    assert said(f"one way past the backward before {SCRIPT}:9: {SCRIPT}:8 "
                "`if not torch.isfinite(loss): continue`", d), d["explanation"]


def test_a_rank_that_returned_before_a_backward_and_exited_left_early():
    """corpus33e's NaN check: rank 1 `return`ed out of its step function before the backward
    (a local non-finite test) and exited; rank 0 waits in that backward. The twin above, a
    `continue` that stays in the loop, is a skipped backward."""
    source = list(SOURCE)
    source[7] = "        if not torch.isfinite(loss): return"
    recs = [rec(0, BWD, pending=[entry(40)], batches=32, fwd=32, bwd=32),
            rec(1, None, batches=32, fwd=32, bwd=31, state="exited")]
    d = diagnose(recs, {SCRIPT: source}, cause="peer_gone", reason="r", culprits=[1])
    assert d["cause"] == "left_early", d
    assert said(f"one way out before {SCRIPT}:9: {SCRIPT}:8 "
                "`if not torch.isfinite(loss): return`", d), d["explanation"]


def test_skip_before_needs_exactly_one_continue_of_the_loop_itself():
    assert skip_before(SOURCES, (SCRIPT, 9)) == \
        f"{SCRIPT}:8 `if not torch.isfinite(loss): continue`"
    # Twins: a `continue` of an inner loop is not the step's; two skips are not guessed
    # between; a backward outside any loop has none.
    inner = [*SOURCE[:7], "        for p in ps:", "            if p is None: continue",
             "        loss.backward()"]
    assert skip_before({SCRIPT: inner}, (SCRIPT, 10)) is None
    two = [*SOURCE[:6], "        if xb is None: continue", *SOURCE[6:]]
    assert skip_before({SCRIPT: two}, (SCRIPT, 10)) is None
    assert skip_before({SCRIPT: ["loss.backward()"]}, (SCRIPT, 1)) is None


def test_skip_before_takes_a_return_when_the_step_loop_has_no_continue():
    # A step function's loop left on a bad loss with `return`: its one way past the backward.
    ret = [*SOURCE]
    ret[7] = "        if torch.isinf(loss): return"
    assert skip_before({SCRIPT: ret}, (SCRIPT, 9)) == f"{SCRIPT}:8 `if torch.isinf(loss): return`"
    # Twins: a `continue` is still the one named over a `break`; two returns are not guessed
    # between; a return after the backward is no way past it.
    both = [*SOURCE[:6], "        if xb is None: break", *SOURCE[6:]]
    assert skip_before({SCRIPT: both}, (SCRIPT, 10)) == \
        f"{SCRIPT}:9 `if not torch.isfinite(loss): continue`"
    two = [*ret[:6], "        if xb is None: return", *ret[6:]]
    assert skip_before({SCRIPT: two}, (SCRIPT, 10)) is None
    after = [*SOURCE[:7], "        loss.backward()", "        if done: return"]
    assert skip_before({SCRIPT: after}, (SCRIPT, 8)) is None



def _batches(rank_extra, n=3):
    """Loop-phase all-reduces, one per batch; `rank_extra`: a 1-number all_reduce issued
    before batch n's (at line 13, under `if rank == 0:`)."""
    out, k = [], 0
    for b in range(1, n + 1):
        if rank_extra and b == n:
            k += 1
            out.append(seq_entry(k, "all_reduce", "loop", b, b, b, b - 1, sig="ar 1",
                                 line=f"{SCRIPT}:13 in <module>"))
        k += 1
        out.append(seq_entry(k, "all_reduce", "loop", b, b, b, b - 1, sig="ar 4",
                             line=f"{SCRIPT}:5 in <module>"))
    return out


def test_the_sequences_part_at_an_extra_collective_named_with_its_line():
    """gloo paired rank 0's extra one-number all_reduce with rank 1's usual one and let both
    go on: now each waits somewhere that says nothing. The first number where the sequences
    part, and which side is new to its loop, says it."""
    recs = [rec(0, coll(5, "all_reduce"), pending=[entry(5, sizes=((4,),))], batches=3,
                fwd=3, bwd=2, sequence=_batches(True)),
            rec(1, coll(5, "all_reduce"), pending=[entry(4, sizes=((4,),))], batches=3,
                fwd=3, bwd=2, sequence=_batches(False))]
    d = diag(recs, cause="deadlock")
    assert d["cause"] == "conditional_collective", d
    assert d["culprits"] == [0]
    assert said(f"part at number 3 (group 0): rank 0 issued all_reduce #3 (group 0) at "
                f"{SCRIPT}:13", d), d["explanation"]
    # Twin: the two differ at number 3, but both are each rank's usual collective (nothing
    # new to either loop): a plain mismatch, no extra named.
    both = _batches(False)
    other = [dict(e, sig="ar 8") for e in both]
    recs[0]["sequence"], recs[1]["sequence"] = both, other
    d = diag(recs, cause="deadlock")
    assert d["cause"] == "mismatch" and "part at number 1" in d["explanation"], d



def _same_op_from(line0):
    """Both ranks' barrier #3 paired, rank 0's issued at `line0`, rank 1's at line 11; at #4
    rank 0's next barrier meets rank 1's all_reduce."""
    head = _batches(False, n=2)
    r0 = head + [seq_entry(3, "barrier", "loop", 2, 2, 2, 2, sig="b",
                           line=f"{SCRIPT}:{line0} in <module>"),
                 seq_entry(4, "barrier", "loop", 2, 2, 2, 2, sig="b",
                           line=f"{SCRIPT}:11 in <module>")]
    r1 = head + [seq_entry(3, "barrier", "loop", 2, 2, 2, 2, sig="b",
                           line=f"{SCRIPT}:11 in <module>"),
                 seq_entry(4, "all_reduce", "loop", 2, 2, 2, 2, sig="ar 4",
                           line=f"{SCRIPT}:5 in <module>")]
    # (No loader passes: both wait in the epoch's end, as under Lightning's trainer.fit.)
    return [rec(0, coll(11, "barrier"), pending=[entry(4, "barrier", ())], batches=2, fwd=2,
                bwd=2, sequence=r0, loaders={}),
            rec(1, coll(5, "all_reduce"), pending=[entry(4, sizes=((4,),))], batches=2,
                fwd=2, bwd=2, sequence=r1, loaders={})]


def test_a_rank_tested_collective_that_paired_with_a_peers_own_is_named_by_its_line():
    """Rank 0's barrier under `if rank == 0:` completed with rank 1's barrier of another line
    (gloo pairs by number); the ranks then wait in different collectives, whose lines say
    nothing. The issuing lines of the paired ones, one under a rank test, name it."""
    d = diag(_same_op_from(13), cause="deadlock")
    assert d["cause"] == "conditional_collective", d
    assert d["culprits"] == [0]
    assert said(f"rank 0 issued barrier #3 (group 0) at {SCRIPT}:13", d), d["explanation"]
    # Twin: the same pairing from a line under no rank test: nothing says which rank added
    # it, so not this title.
    d = diag(_same_op_from(5), cause="deadlock")
    assert not said("under a rank test", d), d["explanation"]


def test_a_rank_that_broke_out_epochs_before_it_left_is_named_by_that_pass():
    """Rank 1 `break`s out of pass 2 of 6 at batch 5; the ranks then pair shifted steps
    until rank 1 runs out of passes and exits while rank 0 waits in its last backward. Its
    last pass ran to the end: the short pass it remembers is the evidence, and the loop's one
    way out is named. Twin: every rank has the same short pass (a loop capped on all ranks),
    no evidence."""
    loop = {f"{SCRIPT}:3": {"epoch": 5, "batches": 5, "len": 32, "key": "k/5", "end": "",
                            "short": None}}
    gone = {f"{SCRIPT}:3": {"epoch": 5, "batches": 32, "len": 32, "key": "k/5", "end": "stop",
                            "short": [1, 5, 32]}}
    src = [*SOURCE[:3], "        if rank == 1 and epoch == 1 and i == 5: break", *SOURCE[4:]]
    recs = [rec(0, BWD, pending=[entry(90)], batches=165, fwd=165, bwd=164, loaders=loop),
            rec(1, None, batches=165, fwd=164, bwd=164, state="exited", loaders=gone)]
    d = diagnose(recs, {SCRIPT: src}, cause="peer_gone", reason="r", culprits=[1])
    assert d["cause"] == "left_early", d
    assert said(f"its pass 2 over the DataLoader iterated at {SCRIPT}:3 ended after 5 of 32", d)
    assert said(f"way out: {SCRIPT}:4", d), d["explanation"]
    loop[f"{SCRIPT}:3"]["short"] = [1, 5, 32]
    d = diagnose(recs, {SCRIPT: src}, cause="peer_gone", reason="r", culprits=[1])
    assert "ended after 5 of 32" not in d["explanation"], d


def test_a_step_lightning_refused_to_skip_is_a_skipped_backward_with_its_return():
    """Lightning ends the rank whose training_step returned None under DDP: that rank
    skipped a step (plain DDP would hang); the one `return None` of training_step is named.
    Twin: any other crash stays a crash."""
    src = ["class M(L.LightningModule):",                        # 1
           "    def training_step(self, batch, i):",              # 2
           "        loss = self.loss(batch)",                     # 3
           "        if self.global_rank == 1 and i == 5:",        # 4
           "            return None",                             # 5
           "        return loss",                                 # 6
           "trainer.fit(M())"]                                    # 7
    lightning = ("MisconfigurationException: Skipping the `training_step` by returning None in "
                 "distributed training is not supported. It is recommended that you rewrite")
    recs = [rec(0, BWD, pending=[entry(9)], batches=6, fwd=6, bwd=6),
            rec(1, [(SCRIPT, 7, "<module>")], batches=6, fwd=6, bwd=5, state="crashed")]
    recs[1]["error"] = lightning
    d = diagnose(recs, {SCRIPT: src}, cause="peer_gone", reason="r", culprits=[1])
    assert d["cause"] == "skipped_backward" and d["culprits"] == [1], d
    assert said(f"the step returns None at {SCRIPT}:5", d), d["explanation"]
    recs[1]["error"] = "ValueError: bad record in batch 3"
    d = diagnose(recs, {SCRIPT: src}, cause="peer_gone", reason="r", culprits=[1])
    assert d["cause"] == "crashed_rank", d


def test_a_forward_every_rank_runs_next_is_not_the_cause_of_a_rank_tested_collective():
    """Rank 0 all-reduces a loss for its log under `if rank == 0:` (line 13, through a
    helper); rank 1 went on to the evaluation forward every rank runs next and waits in its
    buffer broadcast: the counters read like a forward on some ranks, the rank test says
    which side is extra (corpus33c's blind miss). Twin: rank 0's collective is its loop's
    own, under no rank test: the forward on rank 1 alone stays the cause."""
    helper = [("/u/utils.py", 7, "reduce_tensor"),
              (f"{TORCH}distributed/distributed_c10d.py", 1, "all_reduce")]
    recs = [rec(0, [(SCRIPT, 13, "<module>"), *helper], pending=[entry(83, sizes=((),))],
                batches=25, fwd=25, tfwd=25, bwd=25, loaders={}),
            rec(1, FWD, pending=[entry(83, "broadcast", ((96,),))], batches=26, fwd=26,
                tfwd=25, bwd=25, loaders={})]
    d = diag(recs)
    assert d["cause"] == "conditional_collective" and d["culprits"] == [0], d
    assert said(f"issued from {SCRIPT}:13, under a rank test", d), d["explanation"]
    recs[0] = rec(0, [(SCRIPT, 5, "<module>"), *helper], pending=[entry(83, sizes=((),))],
                  batches=25, fwd=25, tfwd=25, bwd=25, loaders={})
    assert diag(recs)["cause"] == "forward_on_some_ranks"


# -- a one-batch peek is no loop -------------------------------------------------------------

PEEK = "/u/peek.py"
PEEK_SOURCE = [
    "for epoch in range(8):",                              # 1
    "    b_sz = len(next(iter(loader))[0])",               # 2 the batch-size peek
    "    loader.sampler.set_epoch(epoch)",                 # 3
    "    for x, y in loader:",                             # 4
    "        loss = model(x)",                             # 5
    "        loss.backward()",                             # 6
    "    if rank == 0 and epoch == 1:",                    # 7
    "        dist.barrier()",                              # 8
]


def test_a_one_batch_peek_before_each_epoch_is_not_a_pass_left_early():
    # pytorch/examples' DDP tutorial peeks at one batch per epoch (line 2). Rank 0 alone then
    # waits in a barrier (line 8) while rank 1 is in the next epoch's forward: the peek's
    # pass (1 of 20 batches, dropped) is not a loop rank 0 left.
    def loaders(peek_epoch, loop_epoch, loop_batches, loop_end):
        return {f"{PEEK}:2": {"epoch": peek_epoch, "batches": 1, "len": 20, "end": "drop",
                              "key": f"k/{2 * peek_epoch}"},
                f"{PEEK}:4": {"epoch": loop_epoch, "batches": loop_batches, "len": 20,
                              "end": loop_end, "key": f"k/{2 * loop_epoch + 1}"}}

    fwd = [(PEEK, 5, "<module>")] + FWD[1:]
    barrier = [(PEEK, 8, "<module>"), (f"{TORCH}distributed/distributed_c10d.py", 1, "barrier")]
    recs = [rec(0, barrier, pending=[entry(81, "barrier", ())], batches=42, fwd=40, bwd=40,
                loaders=loaders(1, 1, 20, "stop")),
            rec(1, fwd, pending=[entry(81, "broadcast", ((16,),))], batches=44, fwd=41, bwd=40,
                loaders=loaders(2, 2, 1, ""))]
    for r in recs:
        for f in r["stacks"]["main"]:
            if f["file"] == PEEK:
                f["code"] = PEEK_SOURCE[f["line"] - 1].strip()
    d = diagnose(recs, {PEEK: PEEK_SOURCE}, cause="mismatch", reason="r", culprits=[0, 1])
    assert d["cause"] != "left_early", d
    assert d["culprits"] == [0] and f"{PEEK}:8" in d["explanation"], d
    # The twin: the same one batch drawn at a `for` that rank 0 left by `break` is a loop it
    # left early (while rank 1 is still in that pass).
    src = [*PEEK_SOURCE]
    src[1] = "    for b in loader: break"
    recs[0]["hb"]["loaders"][f"{PEEK}:4"].update(batches=1, end="drop")
    recs[1]["hb"]["loaders"][f"{PEEK}:4"].update(epoch=1, key="k/3", batches=2)
    d = diagnose(recs, {PEEK: src}, cause="mismatch", reason="r", culprits=[0, 1])
    assert d["cause"] == "left_early", d


# -- a forward with gradients on, on some ranks only ---------------------------------------

def test_an_extra_training_forward_on_one_rank_is_named_by_its_line():
    # Rank 0 alone ran one more forward through the wrapper (grad on, no backward: a look at
    # the predictions at line 7); its buffer broadcast shifted the sequences, so rank 0 waits
    # in the next forward's broadcast while rank 1 is in the backward's all-reduce.
    look = f"{SCRIPT}:7"
    recs = [rec(0, FWD, pending=[entry(50, "broadcast", ((16,),))], batches=22, fwd=23,
                bwd=21),
            rec(1, BWD, pending=[entry(50)], batches=22, fwd=22, bwd=22)]
    recs[0]["hb"]["forward_lines"] = {f"{SCRIPT}:6": 22, look: 1}
    recs[1]["hb"]["forward_lines"] = {f"{SCRIPT}:6": 22}
    d = diag(recs)
    assert d["cause"] == "forward_on_some_ranks" and d["culprits"] == [0], d
    assert said(f"rank 0 ran 1 forward through the wrapper at {look} and rank 1 0 forwards", d)
    # The twin: the same counters on a rank that skipped a backward (one forward per batch,
    # every forward at the loop's one line) is a skipped backward, not an extra forward.
    recs = skipped(rank1_bwd=10)
    recs[0]["hb"]["forward_lines"] = {f"{SCRIPT}:6": 11}
    recs[1]["hb"]["forward_lines"] = {f"{SCRIPT}:6": 12}
    assert diag(recs)["cause"] == "skipped_backward"
    # Two forwards per step (two views, one backward), a rank between them: the same rate.
    two = [rec(0, FWD, pending=[entry(40, "broadcast", ((16,),))], batches=11, fwd=22,
               bwd=10),
           rec(1, BWD, pending=[entry(40)], batches=10, fwd=20, bwd=10)]
    two[0]["hb"]["forward_lines"] = {f"{SCRIPT}:6": 11, f"{SCRIPT}:7": 11}
    two[1]["hb"]["forward_lines"] = {f"{SCRIPT}:6": 10, f"{SCRIPT}:7": 10}
    assert diag(two)["cause"] != "forward_on_some_ranks"


# -- a `while` around one-batch passes, left by `break` ------------------------------------

WHILE = "/u/two.py"
WHILE_SOURCE = [
    "while training:",                                     # 1
    "    for x, y in loader:",                             # 2 one batch per pass
    "        out = model(x)",                              # 3
    "        out.backward()",                              # 4
    "        it += 1",                                     # 5
    "        if dist.get_rank() == 1 and it == 100:",      # 6
    "            break",                                   # 7 the fault
    "        if it == 400:",                               # 8
    "            break",                                   # 9 every rank, at the end
    "dist.barrier()",                                      # 10
]


def test_a_rank_that_broke_out_of_one_batch_passes_left_early_at_its_rank_tested_break():
    barrier = [(WHILE, 10, "<module>"), (f"{TORCH}distributed/distributed_c10d.py", 1, "barrier")]
    bwd = [(WHILE, 4, "<module>"), (f"{TORCH}autograd/graph.py", 5, "_engine_run_backward")]
    recs = [rec(0, bwd, pending=[entry(211)], batches=101, fwd=101, bwd=101,
                loaders={f"{WHILE}:2": {"epoch": 100, "batches": 1, "len": 1, "end": "",
                                        "key": "k/100"}}),
            rec(1, barrier, pending=[entry(211, "barrier", ())], batches=100, fwd=100, bwd=100,
                loaders={f"{WHILE}:2": {"epoch": 99, "batches": 1, "len": 1, "end": "drop",
                                        "key": "k/99"}})]
    for r in recs:
        for f in r["stacks"]["main"]:
            if f["file"] == WHILE:
                f["code"] = WHILE_SOURCE[f["line"] - 1].strip()
    d = diagnose(recs, {WHILE: WHILE_SOURCE}, cause="mismatch", reason="r", culprits=[0, 1])
    assert d["cause"] == "left_early" and d["culprits"] == [1], d
    assert said(f"the loop's way out: {WHILE}:7 `break`", d), d["explanation"]
    # The twin: rank 0 is in the same (last) pass as rank 1 was: nobody went on to a later
    # pass, so the full pass rank 1 ended is not a loop it left.
    recs[0]["hb"]["loaders"][f"{WHILE}:2"].update(epoch=99, key="k/99")
    d = diagnose(recs, {WHILE: WHILE_SOURCE}, cause="mismatch", reason="r", culprits=[0, 1])
    assert d["cause"] != "left_early", d


def test_way_out_takes_the_one_exit_under_a_rank_test():
    assert way_out({WHILE: WHILE_SOURCE}, f"{WHILE}:2") == f"{WHILE}:7 `break`"
    # Without the rank test both exits are alike: the report does not guess.
    plain = [*WHILE_SOURCE]
    plain[5] = "        if it == 100:"
    assert way_out({WHILE: plain}, f"{WHILE}:2") is None


# -- two models and a second group: the rank that skipped a backward runs ahead ---------------

TWO = "/u/twomodels.py"
TWO_SOURCE = [
    "while training:",                                     # 1
    "    for x, y in loader:",                             # 2
    "        l_X = loss(model_X(x), y)",                   # 3
    "        l_X.backward()",                              # 4
    "        l_Y = loss(model_Y(x), y)",                   # 5
    "        if rank == 1 and it == 50: continue",         # 6 the fault
    "        l_Y.backward()",                              # 7
    "        dist.all_reduce(a, group=group)",             # 8
]


def _two_models(tfwd1, bwd1, tfwd0=102, bwd0=102):
    grp = [(TWO, 8, "<module>"), (f"{TORCH}distributed/distributed_c10d.py", 1, "all_reduce")]
    bwd = [(TWO, 4, "<module>"), (f"{TORCH}autograd/graph.py", 5, "_engine_run_backward")]
    recs = [rec(0, grp, pending=[entry(101, sizes=((),))], batches=51, fwd=tfwd0, bwd=bwd0),
            rec(1, bwd, pending=[entry(113)], batches=53, fwd=tfwd1, bwd=bwd1)]
    for r in recs:
        r["hb"]["loaders"] = {}
        for f in r["stacks"]["main"]:
            if f["file"] == TWO:
                f["code"] = TWO_SOURCE[f["line"] - 1].strip()
    return recs


def test_a_rank_that_skipped_one_of_two_backwards_and_ran_ahead_skipped_a_backward():
    d = diagnose(_two_models(105, 103), {TWO: TWO_SOURCE}, cause="deadlock", reason="r",
                 culprits=[0, 1])
    assert d["cause"] == "skipped_backward" and d["culprits"] == [1], d
    assert said(f"one way past a backward: {TWO}:6", d), d["explanation"]
    # Twins: no `continue` in the loop (nothing says where a backward was skipped); and a
    # program with two forwards per backward, whose deficit grows alike on every rank.
    plain = [*TWO_SOURCE]
    plain[5] = "        pass"
    d = diagnose(_two_models(105, 103), {TWO: plain}, cause="deadlock", reason="r",
                 culprits=[0, 1])
    assert d["cause"] != "skipped_backward", d
    d = diagnose(_two_models(106, 53, tfwd0=102, bwd0=51), {TWO: TWO_SOURCE}, cause="deadlock",
                 reason="r", culprits=[0, 1])
    assert d["cause"] != "skipped_backward", d


def test_a_rank_gloo_aborted_after_the_loop_left_it_early():
    # corpus33d's blind case: rank 1 `break`s (its last heartbeat still shows it in the
    # pass), meets an all-reduce after the loop (line 13), and gloo aborts it there against
    # rank 0's gradient all-reduce inside the loop (line 9): the break, not the mismatch.
    # (Rank 0 reports from its crash path: its all-reduce failed, nothing is pending.)
    recs = [rec(0, BWD, batches=7, fwd=7, bwd=7,
                loaders={f"{SCRIPT}:3": {"epoch": 0, "batches": 7, "len": 16, "end": ""}}),
            rec(1, coll(13, "all_reduce"), batches=4, fwd=4, bwd=4, state="dead",
                loaders={f"{SCRIPT}:3": {"epoch": 0, "batches": 4, "len": 16, "end": ""}})]
    d = diagnose(recs, SOURCES, cause="peer_gone", culprits=[1],
                 reason="rank 1 died (it died of a fatal signal inside torch.distributed."
                        "all_reduce: a collective the other ranks did not match is the usual "
                        "cause)")
    assert d["cause"] == "left_early" and d["culprits"] == [1], d
    assert said(f"it died at {SCRIPT}:13", d) and said("still in that loop (batch 7 of 16)", d)
    # A twin (corpus33g's blind case): the dead rank's last pass is one its peer has already
    # finished (the peer is in the next pass): it never began the peer's pass, it was behind
    # (a rank-0-only evaluation after its pass), so it did not leave that loop.
    recs[0]["hb"]["loaders"][f"{SCRIPT}:3"]["key"] = "k#0/2"
    recs[1]["hb"]["loaders"][f"{SCRIPT}:3"]["key"] = "k#0/1"
    d = diagnose(recs, SOURCES, cause="peer_gone", culprits=[1],
                 reason="rank 1 died (a collective the other ranks did not match is the usual "
                        "cause)")
    assert "left its training loop early" not in d["explanation"], d
    recs[1]["hb"]["loaders"][f"{SCRIPT}:3"]["key"] = "k#0/2"  # the same pass: it left it
    assert diagnose(recs, SOURCES, cause="peer_gone", culprits=[1],
                    reason="rank 1 died (a collective the other ranks did not match is the "
                           "usual cause)")["cause"] == "left_early"
    # The twin: it died inside the loop (a collective of the loop's own): a mismatch.
    recs[1]["stacks"]["main"][0]["line"] = 5
    d = diagnose(recs, SOURCES, cause="peer_gone", culprits=[1],
                 reason="rank 1 died (a collective the other ranks did not match is the usual "
                        "cause)")
    assert d["cause"] != "left_early", d


# -- an epoch loop one rank left on its own early stop ---------------------------------------

STOP = "/u/earlystop.py"
STOP_SOURCE = [
    "def worker(rank):",                                   # 1
    "    for epoch in range(6):",                          # 2
    "        for i, (x, y) in enumerate(loader):",         # 3
    "            train_step(x, y)",                        # 4
    "            if i >= max_steps: break",                # 5 (leaves the batch loop only)
    "        if rank == 0 and val_loss() > best:",         # 6
    "            break",                                   # 7 the fault: rank 0 alone
    "        dist.barrier()",                              # 8
    "    dist.destroy_process_group()",                    # 9
]


def _early_stop(waiter_line):
    barrier = [(STOP, waiter_line, "worker"),
               (f"{TORCH}distributed/distributed_c10d.py", 1, "barrier")]
    recs = [rec(0, None, batches=64, fwd=64, bwd=64, state="exited", loaders={}),
            rec(1, barrier, pending=[entry(104, "barrier", ())], batches=64, fwd=64, bwd=64,
                loaders={}, codes={waiter_line: STOP_SOURCE[waiter_line - 1].strip()})]
    # An exited rank has no stacks; its last heartbeat says where it was.
    recs[0]["hb"]["where"] = f"{STOP}:9 in worker  `dist.destroy_process_group()`"
    return recs


def test_a_rank_that_left_its_epoch_loop_and_exited_is_named_with_the_loops_way_out():
    d = diagnose(_early_stop(8), {STOP: STOP_SOURCE}, cause="peer_gone", reason="r",
                 culprits=[0])
    assert d["cause"] == "left_early" and d["culprits"] == [0], d
    assert said(f"left the loop at {STOP}:2 early", d), d["explanation"]
    # The batch loop's own `break` (line 5) leaves only that loop: the one way out is line 7.
    assert said(f"the loop's way out: {STOP}:7 `break`", d), d["explanation"]
    # The twin: the waiting rank is past the loop too (both left it): no loop was left early,
    # and no line is named for it.
    d = diagnose(_early_stop(9), {STOP: STOP_SOURCE}, cause="peer_gone", reason="r",
                 culprits=[0])
    assert "left the loop at" not in d["explanation"], d


def test_way_out_skips_a_break_of_an_inner_loop():
    assert way_out({STOP: STOP_SOURCE}, f"{STOP}:2") == f"{STOP}:7 `break`"
    assert way_out({STOP: STOP_SOURCE}, f"{STOP}:3") == f"{STOP}:5 `if i >= max_steps: break`"
    # A `return` in the inner loop leaves both: two ways out, under no rank test alike.
    ret = [*STOP_SOURCE]
    ret[4] = "            if i >= max_steps: return"
    ret[5] = "        if val_loss() > best:"
    assert way_out({STOP: ret}, f"{STOP}:2") is None


def test_a_rank_test_spelled_with_elif_guards_its_way_out():
    loop = ["for epoch in range(4):",                      # 1
            "    if agreed:",                              # 2
            "        if stop.item():",                     # 3
            "            break",                           # 4
            "    elif rank == 0 and patience == 0:",       # 5
            "        break",                               # 6
            "    dist.barrier()"]                          # 7
    assert way_out({"t.py": loop}, "t.py:1") == "t.py:6 `break`"
    loop[4] = "    elif patience == 0:"  # the twin: no rank test, two alike ways out
    assert way_out({"t.py": loop}, "t.py:1") is None


def test_a_peer_waiting_past_the_last_collective_of_a_leaving_rank_is_waiting_for_it():
    from ddpguard.guard.leaving import waiting_for

    peers = {0: {"state": "exited", "pending": []},
             1: {"state": "running", "pending": [entry(81)]}}
    assert [(r, last) for r, _, last in waiting_for(0, {"0": [80, 80]}, peers)] == [(1, 80)]
    # Twins: the peer waits in a collective this rank issued (it will complete); in a group
    # this rank is not in; a peer that left too.
    assert waiting_for(0, {"0": [81, 80]}, peers) == []
    assert waiting_for(0, {"1": [3, 3]}, peers) == []
    peers[1]["state"] = "exited"
    assert waiting_for(0, {"0": [80, 80]}, peers) == []


def test_a_metric_synced_by_lightning_names_the_self_log_only_one_rank_called():
    from ddpguard.guard.metric_sync import synced_log_on_some_ranks

    module = "/u/model.py"
    src = ["    def on_validation_epoch_end(self):",      # 1
           "        if self.trainer.is_global_zero:",    # 2
           "            self.log('acc', acc, sync_dist=True)",  # 3
           "        self.log('loss', loss, sync_dist=True)"]    # 4
    sync = [(f"{TORCH}x.py", 1, "fit"),
            ("/x/site-packages/lightning/pytorch/trainer/connectors/logger_connector/result.py",
             248, "compute"), (f"{TORCH}distributed/distributed_c10d.py", 1, "all_reduce")]
    recs = [rec(0, sync, pending=[entry(16)]), rec(1, coll(11, "barrier"),
                                                    pending=[entry(16, "barrier", ())])]
    recs[0]["hb"]["synced_logs"] = {f"{module}:3": 1, f"{module}:4": 1}
    recs[1]["hb"]["synced_logs"] = {f"{module}:4": 1}
    found = synced_log_on_some_ranks(recs, {module: src})
    assert found is not None and found.cause == "conditional_collective", found
    assert found.line == (module, 3) and found.culprits == (0,)
    # Twins: every rank logged both lines (no line is one rank's); the waiting rank is not in
    # Lightning's sync (its own collective has its line on the stack).
    recs[1]["hb"]["synced_logs"] = {f"{module}:3": 1, f"{module}:4": 1}
    assert synced_log_on_some_ranks(recs, {module: src}) is None
    recs[1]["hb"]["synced_logs"] = {f"{module}:4": 1}
    recs[0]["stacks"]["main"] = recs[0]["stacks"]["main"][:1] + recs[0]["stacks"]["main"][2:]
    assert synced_log_on_some_ranks(recs, {module: src}) is None


def test_a_forward_every_rank_runs_after_a_peer_exited_is_a_rank_that_left():
    from ddpguard.guard.findings import Finding
    from ddpguard.guard.passes import left_before_a_shared_forward

    main = "/u/main.py"
    src = ["def test(model):",                     # 1
           "    for x in loader:",                 # 2
           "        model(x)",                     # 3
           "train()",                              # 4
           "if rank == 1: sys.exit(0)",            # 5 the fault
           "test(model)"]                          # 6
    fwd = [(main, 6, "<module>"), (main, 3, "test"), *FWD[1:]]
    recs = [rec(0, fwd, pending=[entry(90, "broadcast", ((16,),))]),
            rec(1, None, state="exited")]
    recs[1]["hb"]["where"] = f"{main}:5 in <module>  `if rank == 1: sys.exit(0)`"
    found = Finding("forward_on_some_ranks", "r", (0,))
    got = left_before_a_shared_forward(found, recs, {main: src})
    assert got.cause == "left_early" and got.culprits == (1,) and got.line == (main, 5), got
    # Twin: the forward is reached under a rank test (rank 0 evaluates alone): it stays.
    src[5] = "if rank == 0: test(model)"
    assert left_before_a_shared_forward(found, recs, {main: src}) is found


def test_a_helper_collective_called_under_a_rank_test_names_the_call():
    from ddpguard.guard.conditional import or_conditional
    from ddpguard.guard.diagnose import rank_position
    from ddpguard.guard.findings import Finding

    helper, loop = "/u/metrics.py", "/u/train.py"
    sources = {helper: ["def global_mean(x):", "    dist.all_reduce(x)", "    return x"],
               loop: ["for b in loader:", "    step(b)", "    if rank == 0:",
                      "        print(global_mean(m))", "    metrics = global_mean(m)"]}
    stack = [(loop, 4, "<module>"), (helper, 2, "global_mean"),
             (f"{TORCH}distributed/distributed_c10d.py", 1, "all_reduce")]
    recs = [rec(0, stack, pending=[entry(83, sizes=((),))]),
            rec(1, [(loop, 2, "<module>"), *FWD[1:]], pending=[entry(83, "broadcast")])]
    for r in recs:
        for f in r["stacks"]["main"]:
            f["code"] = (sources.get(f["file"]) or [""] * 9)[f["line"] - 1].strip()
    pos = {r["rank"]: rank_position(r) for r in recs}
    found = Finding("extra_collective", "rank 0 issued all_reduce #83 at metrics.py:2", (0,),
                    (helper, 2))
    cause, named = or_conditional(found, recs, pos, sources)
    assert cause == "conditional_collective", cause
    assert f"the call under the rank test is {loop}:4 `print(global_mean(m))`" in named.text
    # Twin: the same helper called by every rank (line 5): no rank test, nothing added.
    recs[0]["stacks"]["main"][0].update(line=5, code="metrics = global_mean(m)")
    pos = {r["rank"]: rank_position(r) for r in recs}
    cause, named = or_conditional(found, recs, pos, sources)
    assert cause == "extra_collective" and named is found


def _returns_once(rank, epochs):
    for epoch in range(epochs):
        if rank == 1 and epoch == 2:
            return  # the EARLY RETURN
        print(epoch)
    return


def _returns_twice(rank):
    if rank == 1:
        return 1
    if rank == 2:
        return 2
    return 0


def _returns_in_a_helper(rank):
    def helper():
        return rank

    print(helper())


def test_a_spawned_functions_one_early_return_names_where_it_left():
    """mp.spawn's worker returned and its frame is gone: its one early return is named."""
    from ddpguard.guard.leaving import early_return_line

    src = Path(__file__).read_text().splitlines()
    mark = next(i + 1 for i, t in enumerate(src) if "# the EARLY RETURN" in t)
    assert early_return_line(_returns_once) == mark
    # Twins: two early returns say nothing certain; a nested function's return is its own.
    assert early_return_line(_returns_twice) is None
    assert early_return_line(_returns_in_a_helper) is None


def _ends_in_a_call(rank, epochs):
    for epoch in range(epochs):
        if rank == 1 and epoch == 2:
            break
    print("done")  # the LAST LINE


def _ends_in_a_loop(rank, epochs):
    for epoch in range(epochs):
        if rank == 1 and epoch == 2:
            break


def test_a_spawned_function_that_ran_to_its_end_names_its_last_line():
    """corpus33f's blind case: the worker `break`s out of its epoch loop and returns at its
    end; the last line it ran, after the loop, lets the report find the loop it left."""
    from ddpguard.guard.leaving import last_statement_line

    src = Path(__file__).read_text().splitlines()
    mark = next(i + 1 for i, t in enumerate(src) if "# the LAST LINE" in t)
    assert last_statement_line(_ends_in_a_call) == mark
    # The twin: a function that ends in its loop has no one last line.
    assert last_statement_line(_ends_in_a_loop) is None


def _extra_backward(rank0_tfwd):
    """corpus33f's blind case: rank 0 alone ran a forward and backward through the wrapper on
    one batch (line 13, under its rank test, with the model in eval mode), then trained on; its
    extra gradient all-reduce paired with rank 1's, and rank 1 finished and exited."""
    recs = [rec(0, BWD, pending=[entry(125)], batches=81, fwd=81, tfwd=rank0_tfwd, bwd=61),
            rec(1, None, batches=90, fwd=80, tfwd=60, bwd=60, state="exited")]
    recs[0]["hb"]["forward_lines"] = {f"{SCRIPT}:6": 80, f"{SCRIPT}:13": 1}
    recs[1]["hb"]["forward_lines"] = {f"{SCRIPT}:6": 80}
    return recs


def test_an_extra_forward_and_backward_on_one_rank_is_named_by_its_line_not_a_peers_skip():
    d = diag(_extra_backward(rank0_tfwd=60), cause="peer_gone", culprits=[1])
    assert d["cause"] == "forward_on_some_ranks" and d["culprits"] == [0], d
    assert said(f"rank 0 ran 1 forward through the wrapper at {SCRIPT}:13, a line rank 1 never "
                "ran, and 61 backwards to rank 1's 60", d), d["explanation"]


def test_twin_a_rank_behind_in_training_forwards_is_not_an_extra_forward_and_backward():
    # The same lines, but rank 0 also ran one training forward more: its surplus backward is
    # a training step (rank 1 is behind or skipped), not the extra forward's.
    d = diag(_extra_backward(rank0_tfwd=61), cause="peer_gone", culprits=[1])
    assert d["cause"] != "forward_on_some_ranks", d


def _ran_out(done):
    """Rank 1 ran out of its 7-batch pass (StopIteration) and exited; rank 0, at batch 8 of 8
    of the same pass, waits in the gradient all-reduce it issued during it."""
    key = "loader#0/0"
    short = {"epoch": 0, "batches": 7, "len": 7, "key": key, "at": f"{SCRIPT}:1",
             "end": "stop" if done else "drop", "seq0": {"0": 3},
             "done": [[key, 7, 7]] if done else [], "short": None}
    recs = [rec(0, BWD, pending=[entry(40)], batches=8, fwd=8, bwd=8,
                loaders={f"{SCRIPT}:3": {"epoch": 0, "batches": 8, "len": 8, "key": key,
                                         "at": f"{SCRIPT}:1", "end": "", "seq0": {"0": 3},
                                         "done": [], "short": None}}),
            rec(1, None, batches=7, fwd=7, bwd=7, state="exited",
                loaders={f"{SCRIPT}:3": short})]
    recs[0]["hb"]["blocked_for"] = 0.5
    return recs


def test_a_rank_that_ran_out_of_batches_and_decided_first_is_still_uneven_batches():
    """The rank that ran out may decide first as it leaves (it sees its peer wait in a
    collective it never issued); the loaders' proof still names the cause (a loaded 2-core
    run of the suite titled it "left early")."""
    d = diag(_ran_out(done=True), cause="peer_gone", culprits=[1])
    assert d["cause"] == "uneven_batches" and d["culprits"] == [1], d
    assert said("rank 1 ran out of batches", d) and said("rank 0: 8, rank 1: 7", d), d
    # The twin: its pass ended without StopIteration (a break): no proof of uneven loaders.
    assert diag(_ran_out(done=False), cause="peer_gone", culprits=[1])["cause"] != \
        "uneven_batches"


def test_the_recorders_stack_traces_are_read_only_for_lines_the_rank_did_not_note():
    """Symbolizing the recorder's stack traces imports torch._dynamo the first time (seconds,
    on every rank of a stopped job, once a slow stop made the test harness end a rank before
    its guard did): the lines the rank noted itself as it issued each collective are kept."""
    from ddpguard.guard.sequence import add_lines

    class Ledger:
        def __init__(self):
            self.asked = []

        def frames_for(self, wanted):
            self.asked.append(set(wanted))
            return {k: f"{SCRIPT}:5 in main" for k in wanted}

    noted = seq_entry(7, "all_reduce", "loop", 3, 3, 3, 3, line=f"{SCRIPT}:13 in main")
    ledger = Ledger()
    add_lines(ledger, [noted])
    assert ledger.asked == [] and noted["line"] == f"{SCRIPT}:13 in main"
    # The twin: an entry with no noted line is looked up, and gets the recorder's.
    bare = seq_entry(8, "all_reduce", "loop", 3, 3, 3, 3)
    add_lines(ledger, [noted, bare])
    assert ledger.asked == [{("0", 8)}] and bare["line"] == f"{SCRIPT}:5 in main"


def test_the_programs_lightning_module_files_are_read_for_its_training_step(monkeypatch):
    """corpus33g's blind case: rank 1's training_step returned None and Lightning ended it;
    no stack holds the module's file (Lightning calls training_step from its own code), so the
    report reads the program's LightningModule classes' files for the one `return None`."""
    import sys
    import types

    from ddpguard.guard.assemble import _lightning_module_files

    fake = types.ModuleType("lightning.pytorch")
    base = type("LightningModule", (), {})
    fake.LightningModule = base  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lightning.pytorch", fake)
    monkeypatch.delitem(sys.modules, "pytorch_lightning", raising=False)
    mine = type("Model", (base,), {"__module__": __name__})
    assert _lightning_module_files() == [__file__]
    # The twin: a subclass defined in an installed package is not the program's.
    mine.__module__ = "torch.nn"
    assert _lightning_module_files() == []


def _died_after_a_skip(state):
    """corpus33g's blind case: rank 1 `continue`d past one backward and ran on to the epoch's
    end, where gloo paired its metric all-reduce with rank 0's last gradient all-reduce and
    aborted it; rank 0's all-reduce failed with it, so rank 0 is seen in its backward but
    not waiting in any collective."""
    return [rec(0, BWD, batches=256, fwd=256, bwd=256),
            rec(1, None, batches=256, fwd=256, bwd=255, state=state)]


def test_a_rank_that_skipped_a_backward_and_died_in_the_shifted_collective_skipped_it():
    d = diag(_died_after_a_skip("dead"), cause="mismatch", culprits=[1])
    assert d["cause"] == "skipped_backward" and d["culprits"] == [1], d
    assert said(f"{SCRIPT}:8 `if not torch.isfinite(loss): continue`", d), d["explanation"]
    # The twin: a rank that crashed on its own error (in its forward: one backward fewer)
    # is told as a crash, not as a skip.
    assert diag(_died_after_a_skip("crashed"), cause="mismatch",
                culprits=[1])["cause"] != "skipped_backward"


CALLS = "/u/calls.py"
CALLS_SOURCE = [
    "def train(model):",                                   # 1
    "    for x in loader:",                                # 2
    "        loss = model(x)",                             # 3
    "        loss.backward()",                             # 4
    "def worker(rank):",                                   # 5
    "    for epoch in range(6):",                          # 6
    "        train(model)",                                # 7
    "        if rank == 0 and val() > best:",              # 8
    "            break",                                   # 9 the fault: rank 0 alone
    "    dist.destroy_process_group()",                    # 10
]


def test_a_rank_that_left_the_epoch_loop_while_its_peer_trains_in_a_called_function():
    """corpus33g's blind case: rank 1 waits in the backward inside train(), called from the
    epoch loop that rank 0 left by its rank-tested break; rank 0 exited after that loop. The
    waiting rank's caller line, in the loop's own function, finds the loop and its way out."""
    def recs(frames):
        out = [rec(0, None, batches=40, fwd=40, bwd=40, state="exited", loaders={}),
               rec(1, frames, pending=[entry(80)], batches=41, fwd=41, bwd=40, loaders={})]
        out[0]["hb"]["where"] = f"{CALLS}:10 in worker  `dist.destroy_process_group()`"
        return out

    inside = [(CALLS, 7, "worker"), (CALLS, 4, "train"),
              (f"{TORCH}autograd/graph.py", 5, "_engine_run_backward")]
    d = diagnose(recs(inside), {CALLS: CALLS_SOURCE}, cause="peer_gone", reason="r",
                 culprits=[0])
    assert d["cause"] == "left_early", d
    assert said(f"left the loop at {CALLS}:6 early", d), d["explanation"]
    assert said(f"the loop's way out: {CALLS}:9 `break`", d), d["explanation"]
    # The twin: no frame of the waiting rank in the function the rank left from.
    d = diagnose(recs(inside[1:]), {CALLS: CALLS_SOURCE}, cause="peer_gone", reason="r",
                 culprits=[0])
    assert "left the loop at" not in d["explanation"], d


def test_from_the_stacks_alone_a_rank_that_died_ahead_of_a_peers_backward_skipped_it():
    """corpus33g's blind case, composed from the fault logs (torchrun's agent ended rank 0
    before its guard reported: no counters): rank 1 died in a collective further on than
    rank 0's backward, and the loop has one `continue` before that backward."""
    def recs(line):
        out = [rec(0, BWD, loaders={}),
               rec(1, coll(line, "barrier" if line == 11 else "all_reduce"), state="dead",
                   loaders={})]
        for r in out:
            del r["hb"]["backwards"]  # a report composed from the logs has no counters
        return out

    d = diag(recs(11), cause="mismatch", culprits=[1])
    assert d["cause"] == "skipped_backward" and d["culprits"] == [1], d
    assert said(f"{SCRIPT}:8 `if not torch.isfinite(loss): continue`", d), d["explanation"]
    # The twin: the collective it died in sits under a rank test: that is the cause.
    assert diag(recs(13), cause="mismatch", culprits=[1])["cause"] != "skipped_backward"


# -- a transport error a rank unwinds is its peer's end, not its own error ----------------------


def _unwinding_after_a_side_thread(err):
    recs = [rec(0, coll(5, "all_reduce"), state="dead"),
            rec(1, BWD, pending=[entry(40)], batches=12, fwd=12, bwd=11)]
    recs[1]["unwinding"] = f"{err} (raised at {SCRIPT}:9 in <module>  `loss.backward()`)"
    return diag(recs, cause="second_thread", culprits=[1])


def test_a_peers_reset_unwound_through_finally_keeps_the_second_thread_title():
    # The whole job inside `try: ... finally: dist.destroy_process_group()`: the survivor's
    # training thread unwinds gloo's "Connection reset by peer" when a thread's collective
    # got its peer aborted (corpus33h's tuning case).
    d = _unwinding_after_a_side_thread(
        "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:31872: Connection reset by peer")
    assert d["cause"] == "second_thread", d


def test_twin_the_programs_own_error_unwound_through_finally_is_the_crash():
    d = _unwinding_after_a_side_thread("ValueError: corrupt batch")
    assert d["cause"] == "crashed_rank", d


# -- a rank that ran out, went past its loop and was aborted there ------------------------------


def _ran_out_then_aborted(short_len, rank1_line):
    def loaders(batches, length, end):
        return {f"{SCRIPT}:3": {"epoch": 0, "batches": batches, "len": length, "key": "k/0",
                                "at": f"{SCRIPT}:1", "end": end, "seq0": {}, "done": []}}
    # Rank 0 trains batch 15 of 16 (its pass left by the error its peer's end raised); rank 1,
    # whose last heartbeat came at batch 8 of its 14, died at line `rank1_line`.
    recs = [rec(0, BWD, batches=15, fwd=15, bwd=15, loaders=loaders(15, 16, "drop")),
            rec(1, coll(rank1_line, "barrier"), batches=8, state="dead",
                loaders=loaders(8, short_len, ""))]
    return diag(recs, cause="mismatch", culprits=[1])


def test_a_shorter_loader_whose_rank_left_the_loop_and_died_is_uneven_batches():
    # corpus33h's tuning case: the short rank's validation all_reduce met the long rank's
    # gradient all-reduce and gloo aborted it, before its heartbeat said it ran out.
    d = _ran_out_then_aborted(short_len=14, rank1_line=11)
    assert d["cause"] == "uneven_batches", d
    assert d["culprits"] == [1]
    assert "has 14 batches, rank 0's 16" in d["explanation"]


def test_twins_equal_loaders_or_a_rank_still_inside_the_loop_are_not_uneven():
    assert _ran_out_then_aborted(short_len=16, rank1_line=11)["cause"] != "uneven_batches"
    assert _ran_out_then_aborted(short_len=14, rank1_line=5)["cause"] != "uneven_batches"


def test_a_rank_killed_with_no_stack_is_last_seen_at_its_heartbeats_place_not_died_there():
    # SIGKILL leaves no dump: its place is its last heartbeat's, which it may have left since
    # (corpus33h: "died at" the previous step's backward, a line before its os.kill).
    recs = [rec(0, coll(11, "barrier"), pending=[entry(4, "barrier", ())]),
            rec(1, BWD, state="dead", batches=8, fwd=8, bwd=8)]
    recs[1]["stacks"] = None
    recs[1]["hb"]["where"] = f"{SCRIPT}:9 in <module>"
    d = diag(recs, cause="peer_gone", culprits=[1])
    assert d["positions"]["1"]["doing"] == "died with no stack; last seen", d["positions"]
    # Twin: a rank that died with a dump (its fault log's stack) died where that stack is.
    twin = [rec(0, coll(11, "barrier"), pending=[entry(4, "barrier", ())]),
            rec(1, BWD, state="dead", batches=8, fwd=8, bwd=8)]
    assert diag(twin, cause="peer_gone", culprits=[1])["positions"]["1"]["doing"] == "died"
