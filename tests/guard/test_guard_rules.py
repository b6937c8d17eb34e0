"""The guard's decisions as pure functions over made-up heartbeats, in one process, up to 1,024
ranks: when it must stop (proof, or no sign of life) and, above all, when it must not."""

from __future__ import annotations

import time

import pytest

from ddpguard.guard.diagnose import diagnose
from ddpguard.guard.lanes import MAX_SEGMENTS, Lanes
from ddpguard.guard.ledger import compact, cross_wait, desync, pending_mismatch, signature
from ddpguard.guard.rules import decide, notice_due

KW = {"grace": 1.0, "no_life": 45.0, "hard_limit": None, "fallback_deadlock": 15.0}


def entry(seq, op="all_reduce", sizes=((12,),), dtype="Float", group="0", done=False):
    return [group, seq, op, [list(s) for s in sizes], [dtype] * len(sizes), done]


def view(rank, *, blocked=False, pending=(), quiet=0.0, blocked_for=None, gone=False,
         state="running", doing="running Python code"):
    return {"rank": rank, "blocked": blocked, "pending": list(pending), "quiet": quiet,
            "blocked_for": (blocked_for if blocked_for is not None else (5.0 if blocked else 0)),
            "gone": gone, "state": state, "state_text": state, "doing": doing,
            "where": f"train.py:{10 + rank}"}


def test_flight_recorder_entries_compact_and_compare():
    raw = {"process_group": ("0", "default_pg"), "collective_seq_id": 907,
           "profiling_name": "gloo:broadcast", "input_sizes": [[4]], "input_dtypes": ["Float"],
           "retired": False, "is_p2p": False}
    assert compact(raw) == ["0", 907, "broadcast", [[4]], ["Float"], False]
    assert compact({**raw, "is_p2p": True}) is None
    # gather/scatter sizes legitimately differ between ranks: only the op must agree.
    assert signature(entry(1, "gather", ((4,),))) == signature(entry(1, "gather", ((8,),)))
    assert signature(entry(1, "all_reduce", ((4,),))) != signature(entry(1, "all_reduce", ((5,),)))


@pytest.mark.parametrize("world", [2, 8, 64, 1024])
def test_healthy_waits_are_never_stopped(world):
    # Every rank but rank 0 waits in the same all_reduce; rank 0 works (evaluation,
    # checkpoint) and shows life: however long the wait, keep going.
    views = {0: view(0, quiet=0.3)}
    views.update({r: view(r, blocked=True, pending=[entry(57)], blocked_for=3600.0, quiet=3600)
                  for r in range(1, world)})
    assert decide(views, world, **KW) is None
    # Nobody waits: a rank that shows no life for an hour is its own business.
    views = {r: view(r, quiet=3600.0 if r == 0 else 0.1) for r in range(world)}
    assert decide(views, world, **KW) is None
    # All in the same collective, briefly: normal.
    views = {r: view(r, blocked=True, pending=[entry(9)], blocked_for=2.0, quiet=2.0)
             for r in range(world)}
    assert decide(views, world, **KW) is None
    # A rank that exited while nobody waits on it (rank 0 saves after the others left).
    views = {0: view(0, quiet=0.1)}
    views.update({r: view(r, gone=True, state="exited") for r in range(1, world)})
    assert decide(views, world, **KW) is None


@pytest.mark.parametrize("world", [2, 8, 64, 1024])
def test_mismatched_collectives_are_proof(world):
    views = {r: view(r, blocked=True, pending=[entry(4)]) for r in range(world)}
    views[world - 1] = view(world - 1, blocked=True, pending=[entry(4, "barrier", ())])
    d = decide(views, world, **KW)
    assert d is not None and d.cause == "mismatch" and d.proof
    assert set(d.culprits) == {0, world - 1} or world - 1 in d.culprits
    assert "barrier #4" in d.reason and "all_reduce #4" in d.reason
    # Same op, different sizes, on two ranks only (the others still working): proof too.
    views = {r: view(r, quiet=0.1) for r in range(world)}
    views[0] = view(0, blocked=True, pending=[entry(8, sizes=((4,),))])
    views[1] = view(1, blocked=True, pending=[entry(8, sizes=((5,),))])
    d = decide(views, world, **KW)
    assert d is not None and d.cause == "mismatch" and set(d.culprits) == {0, 1}


def test_cross_wait_needs_every_rank_blocked_on_unmatched_collectives():
    # Rank 0 in group 1, rank 1 in group 0: each waits for the other forever.
    pend = {0: [entry(3, group="1")], 1: [entry(5, group="0")]}
    assert cross_wait(pend, {}, 2) is not None
    # Same collective everywhere: slow, not stuck.
    assert cross_wait({0: [entry(5)], 1: [entry(5)]}, {}, 2) is None
    # One rank not blocked: not proven.
    assert cross_wait({0: [entry(5)]}, {}, 2) is None
    views = {0: view(0, blocked=True, pending=pend[0]), 1: view(1, blocked=True, pending=pend[1])}
    d = decide(views, 2, **KW)
    assert d is not None and d.cause == "deadlock"


def test_gone_peer_while_waiting_is_proof_after_grace():
    views = {0: view(0, blocked=True, pending=[entry(30)], blocked_for=0.5),
             1: view(1, gone=True, state="died")}
    assert decide(views, 2, **KW) is None  # within the grace period
    views[0]["blocked_for"] = 1.5
    d = decide(views, 2, **KW)
    assert d is not None and d.cause == "peer_gone" and d.culprits == (1,)
    assert "all_reduce #30" in d.reason


def test_no_life_stall_and_hard_limit():
    views = {0: view(0, blocked=True, pending=[entry(12)], blocked_for=50.0, quiet=50.0),
             1: view(1, quiet=44.0, doing="running Python code")}
    assert decide(views, 2, **KW) is None
    views[1]["quiet"] = 46.0
    d = decide(views, 2, **KW)
    assert d is not None and d.cause == "no_life" and d.culprits == (1,) and not d.proof
    # The user's hard limit stops even a working rank.
    views[1]["quiet"] = 0.2
    d = decide(views, 2, **{**KW, "hard_limit": 30.0})
    assert d is not None and d.cause == "hard_limit" and d.culprits == (1,)


def test_fallback_without_ledger_is_slower_but_still_proof():
    views = {r: view(r, blocked=True, pending=(), blocked_for=10.0, quiet=10.0) for r in (0, 1)}
    assert decide(views, 2, **KW) is None
    for v in views.values():
        v["blocked_for"] = 16.0
    d = decide(views, 2, **KW)
    assert d is not None and d.cause == "deadlock" and "flight recorder" in d.reason


def test_desync_finds_the_first_differing_collective():
    a = [entry(s, "broadcast", ((4,),)) for s in range(10, 14)]
    b = [entry(s, "broadcast", ((4,),)) for s in range(12, 16)]
    assert desync({0: a, 1: b}) is None
    b[1] = entry(13, "broadcast", ((5056,),), dtype="Byte", done=True)
    found = desync({0: a, 1: b})
    assert found is not None and found[2][1] == 13 and found[3][3] == [[5056]]
    assert pending_mismatch({0: [entry(3)], 1: [entry(3)]}) is None


def test_notices_grow_and_lanes_stay_bounded():
    assert [notice_due(w, 60, 0) for w in (59, 61)] == [False, True]
    assert notice_due(119, 60, 1) is False and notice_due(121, 60, 1) is True
    lanes = Lanes()
    for i in range(3 * MAX_SEGMENTS):
        lanes.add(float(i), "computing" if i % 2 else "collective", f"all_reduce #{i}")
    assert len(lanes.segments) <= MAX_SEGMENTS
    assert lanes.segments[-1][1] == float(3 * MAX_SEGMENTS - 1)
    # A wait recognised at 12.0 that began at 11.0 is drawn from 11.0.
    lanes = Lanes()
    lanes.add(10.0, "computing", "x")
    lanes.add(12.0, "collective", "all_reduce #3", since=11.0)
    assert lanes.segments == [[10.0, 11.0, "computing", "x"],
                              [11.0, 12.0, "collective", "all_reduce #3"]]


def _rec(rank, frames, pending=(), state="running", blocked=True):
    return {"rank": rank, "state": state, "error": None,
            "hb": {"pending": list(pending), "blocked": blocked},
            "stacks": {"main": [{"file": f, "line": ln, "func": fn, "code": ""}
                                for f, ln, fn in frames]}}


TORCH = "/x/site-packages/torch/"


def test_diagnosis_names_buffer_broadcast_only_when_one_is_pending():
    fwd = [("/u/t.py", 7, "<module>"), (f"{TORCH}nn/parallel/distributed.py", 1, "forward"),
           (f"{TORCH}nn/parallel/distributed.py", 2, "_sync_buffers"),
           (f"{TORCH}distributed/distributed_c10d.py", 3, "broadcast")]
    bwd = [("/u/t.py", 9, "<module>"), (f"{TORCH}autograd/graph.py", 5, "_engine_run_backward")]
    recs = [_rec(0, fwd, [entry(20, "broadcast", ((4,),))]), _rec(1, bwd, [entry(20)])]
    d = diagnose(recs, cause="mismatch", reason="r")
    assert d["cause"] == "forward_on_some_ranks"
    # nanoGPT: a forward through DDP on rank 0 with no buffers, nothing pending there.
    recs = [_rec(0, fwd[:2], (), blocked=False), _rec(1, bwd, [entry(20)])]
    d = diagnose(recs, cause="no_life", reason="r", culprits=[0])
    assert d["cause"] == "no_life"
    assert "waiting in all_reduce #20" in d["positions"]["1"]["doing"]


def test_diagnosis_conditional_collective_and_peer_states():
    src = ["for e in range(2):", "    train()", "    if rank == 0:", "        dist.barrier()"]
    barrier = [("/u/t.py", 4, "<module>"), (f"{TORCH}distributed/distributed_c10d.py", 1,
                                             "barrier")]
    bwd = [("/u/t.py", 2, "<module>"), (f"{TORCH}autograd/graph.py", 5, "_engine_run_backward")]
    recs = [_rec(0, barrier, [entry(8, "barrier", ())]), _rec(1, bwd, [entry(8)])]
    d = diagnose(recs, {"/u/t.py": src}, cause="mismatch", reason="r", culprits=[0, 1])
    assert d["cause"] == "conditional_collective"
    recs = [_rec(0, bwd, [entry(8)]), {"rank": 1, "state": "exited", "hb": {}, "stacks": None}]
    assert diagnose(recs, cause="peer_gone", culprits=[1])["cause"] == "left_early"
    recs[1]["state"] = "dead"
    assert diagnose(recs, cause="peer_gone", culprits=[1])["cause"] == "crashed_rank"


def test_conditional_collective_seen_through_a_wait_helper():
    # `if rank == 0: finish(dist.barrier(async_op=True))` with `def finish(w): w.wait()`, and
    # no issuing line recorded (the match by creation time can miss under load): the wait's
    # own line is in the helper, the line that matters is its caller's.
    src = ["def finish(w):", "    w.wait()", "for e in range(2):", "    train()",
           "    if rank == 0:", "        finish(dist.barrier(async_op=True))"]
    wait = [("/u/t.py", 6, "<module>"), ("/u/t.py", 2, "finish"),
            (f"{TORCH}distributed/distributed_c10d.py", 1, "wait")]
    bwd = [("/u/t.py", 4, "<module>"), (f"{TORCH}autograd/graph.py", 5, "_engine_run_backward")]
    recs = [_rec(0, wait, [entry(8, "barrier", ())]), _rec(1, bwd, [entry(8)])]
    d = diagnose(recs, {"/u/t.py": src}, cause="mismatch", reason="r", culprits=[0, 1])
    assert d["cause"] == "conditional_collective"
    # Both ranks in the same helper call, outside any rank test: a plain mismatch.
    src[4] = "    if epoch == 0:"
    d = diagnose(recs, {"/u/t.py": src}, cause="mismatch", reason="r", culprits=[0, 1])
    assert d["cause"] == "mismatch"


def test_a_peer_that_left_outranks_the_buffer_broadcast_guess():
    # Rank 0 returned early from train(); rank 1 waits in DDP's buffer broadcast. The title
    # is the strongest evidence: rank 0 left, not "forward on some ranks only".
    fwd = [("/u/t.py", 7, "<module>"), (f"{TORCH}nn/parallel/distributed.py", 1, "forward"),
           (f"{TORCH}nn/parallel/distributed.py", 2, "_sync_buffers"),
           (f"{TORCH}distributed/distributed_c10d.py", 3, "broadcast")]
    recs = [{"rank": 0, "state": "exited", "hb": {}, "stacks": None},
            _rec(1, fwd, [entry(20, "broadcast", ((4,),))])]
    d = diagnose(recs, cause="peer_gone", reason="r", culprits=[0])
    assert d["cause"] == "left_early", d["cause"]
    # The same wait with the module in eval mode: rank 1 evaluates through the wrapper on its
    # own (rank 0 had finished), and that is the title.
    recs[1]["ddp_training"] = False
    d = diagnose(recs, cause="peer_gone", reason="r", culprits=[0])
    assert d["cause"] == "forward_on_some_ranks", d["cause"]


def test_bucket_rebuild_broadcast_is_not_a_buffer_broadcast():
    # Rank 0 all-reduces a metric under `if rank == 0:`; rank 1 went on to its next training
    # forward, where DDP broadcasts rebuilt bucket sizes (no buffers involved).
    src = ["for step in range(9):", "    loss = train_step()", "    if rank == 0:",
           "        dist.all_reduce(loss)"]
    ar = [("/u/t.py", 4, "<module>"), (f"{TORCH}distributed/distributed_c10d.py", 1,
                                        "all_reduce")]
    rebuild = [("/u/t.py", 2, "<module>"), (f"{TORCH}nn/parallel/distributed.py", 1, "forward"),
               (f"{TORCH}nn/parallel/distributed.py", 2, "_pre_forward")]
    recs = [_rec(0, ar, [entry(9, sizes=((),))]),
            _rec(1, rebuild, [entry(9, "broadcast", ((14,),), dtype="Int")])]
    d = diagnose(recs, {"/u/t.py": src}, cause="mismatch", reason="r", culprits=[0, 1])
    assert d["cause"] == "conditional_collective", d["cause"]


def test_oom_killer_count_is_read_from_the_cgroup(tmp_path):
    from ddpguard.guard.procs import oom_kills

    v2 = tmp_path / "memory.events"
    v2.write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n")
    assert oom_kills((str(v2),)) == 2
    v1 = tmp_path / "memory.oom_control"
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert oom_kills((str(tmp_path / "absent"), str(v1))) == 5
    assert oom_kills((str(tmp_path / "absent"),)) is None


def test_descendants_and_kill_tree_touch_only_what_is_below(tmp_path):
    import subprocess
    import sys

    from ddpguard.guard.procs import descendants, kill_tree, pid_alive

    # A child that starts a grandchild, both sleeping: both are found and ended, by pid.
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)']); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while len(descendants(p.pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        below = descendants(p.pid)
        assert len(below) == 1
        killed = kill_tree(p.pid, include_self=True)
        assert set(killed) == {p.pid, *below}
        p.wait(10)
        assert not any(pid_alive(x) for x in below)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_peer_aborted_inside_a_collective_is_a_mismatch():
    recs = [{"rank": 0, "state": "dead", "hb": {}, "stacks": None},
            _rec(1, [("/u/t.py", 9, "<module>")], [entry(5)])]
    reason = ("rank 0 died (process 7 is gone) (it died of a fatal signal (Fatal Python error: "
              "Aborted) inside torch.distributed.all_reduce called at t.py:8 in <module>: a "
              "collective the other ranks did not match is the usual cause), while rank 1 "
              "waited in all_reduce #5")
    assert diagnose(recs, cause="peer_gone", reason=reason, culprits=[0])["cause"] == "mismatch"
    assert diagnose(recs, cause="peer_gone", reason="rank 0 died", culprits=[0])["cause"] == \
        "crashed_rank"
