"""Loaders of different lengths: a notice, and a stop only on proof that a rank which ran out
leaves another waiting in a collective it will never join. The proof as a pure function over
made-up heartbeats at up to 1,024 ranks, the hooks that feed it on a real DataLoader, and real
2-rank programs that handle unequal inputs themselves (torch's Join with DDP, with a
ZeroRedundancyOptimizer, with a Joinable of their own; a loop agreeing on when to stop)."""

from __future__ import annotations

import pytest
from helpers import ROOT, child_env, guard_run, run_cli

from ddpguard.guard.diagnose import diagnose
from ddpguard.guard.lengths import notice_text
from ddpguard.guard.rules import decide
from ddpguard.guard.uneven import counts_text, uneven_proof

KW = {"grace": 1.0, "no_life": 45.0, "hard_limit": None, "fallback_deadlock": 15.0}
KEY = "a1b2c3#0/1"  # the loader's creation chain, which creation, which pass
FOR = "/job/train.py:40"
MADE = "/job/train.py:31"


def entry(seq, op="all_reduce", sizes=((49,),), group="0"):
    return [group, seq, op, [list(s) for s in sizes], ["Float"] * len(sizes), False]


LAST = entry(25)  # the pass's last gradient all_reduce


def in_pass(rank, *, length=8, batches=8, seq0=10, pending=(LAST,), blocked=True,
            blocked_for=5.0):
    """A rank in the pass KEY, at `batches`, blocked in `pending` (issued after seq0)."""
    return {"rank": rank, "state": "running", "gone": False, "blocked": blocked,
            "blocked_for": blocked_for if blocked else 0.0, "pending": list(pending),
            "quiet": blocked_for if blocked else 0.1, "doing": "running Python code",
            "where": f"train.py:{44 + rank}",
            "loaders": {FOR: {"key": KEY, "len": length, "batches": batches, "at": MADE,
                              "end": "", "seq0": {"0": seq0} if seq0 is not None else {},
                              "done": []}}}


def ran_out(rank, *, length=7, batches=7, gone=True, pending=(), next_pass=False):
    """A rank whose pass KEY ended by StopIteration after `batches`; gone (exited) or alive."""
    cur_key = KEY[:-1] + "2" if next_pass else KEY
    v = {"rank": rank, "state": "exited" if gone else "running", "gone": gone,
         "state_text": "exited (left the job or destroyed its process group)" if gone else "",
         "blocked": bool(pending) and not gone, "blocked_for": 5.0 if pending else 0.0,
         "pending": list(pending), "quiet": 0.1, "doing": "running Python code",
         "where": f"train.py:{60 + rank}",
         "loaders": {FOR: {"key": cur_key, "len": length, "batches": 1 if next_pass else batches,
                           "at": MADE, "end": "" if next_pass else "stop", "seq0": {"0": 30},
                           "done": [[KEY, length, batches]]}}}
    return v


@pytest.mark.parametrize("world", [2, 8, 64, 1024])
def test_a_rank_that_ran_out_and_left_is_proof(world):
    # The last rank's shard is one batch short: it ran out, started no other collective and
    # left; every other rank waits in the pass's last gradient all_reduce.
    views = {r: in_pass(r) for r in range(world - 1)}
    views[world - 1] = ran_out(world - 1)
    d = decide(views, world, **KW)
    assert d is not None and d.cause == "uneven_batches" and d.proof
    assert d.culprits == (world - 1,)
    assert "created at /job/train.py:31 (`for` at /job/train.py:40)" in d.reason
    assert "after 7 batches" in d.reason and "all_reduce #25" in d.reason
    counts = (f"rank {world - 2}: 8, rank {world - 1}: 7" if world <= 8
              else f"8 on ranks 0-{world - 2}; 7 on rank {world - 1}")
    assert counts in d.reason, d.reason
    if world > 8:
        # Half the ranks ran out and left: all culprits, the reason stays one line.
        for r in range(world // 2, world):
            views[r] = ran_out(r)
        d = decide(views, world, **KW)
        assert d is not None and d.culprits == tuple(range(world // 2, world))
        assert f"(so did ranks {world // 2 + 1}-{world - 1})" in d.reason, d.reason
        assert f"7 on ranks {world // 2}-{world - 1}" in d.reason and len(d.reason) < 800
    # Not before the grace period: a rank that just left may be a peer seen late.
    for r in range(world - 1):
        views[r]["blocked_for"] = 0.5
    assert decide(views, world, **KW) is None
    # The report carries the cause the proof named.
    recs = [{"rank": r, "state": "running", "hb": views[r], "stacks": None} for r in (0,)]
    assert diagnose(recs, cause=d.cause, reason=d.reason, culprits=list(d.culprits))[
        "cause"] == "uneven_batches"


def test_a_rank_that_ran_out_into_its_next_pass_and_then_left_is_proof():
    # Two epochs of a plain loop: rank 1 starts its next pass while rank 0 finishes the last
    # batch of the previous one (their all_reduces pair one step apart), then runs out again
    # and leaves. The pass rank 0 waits in is the one rank 1 ended: its `done` keeps it.
    views = {0: in_pass(0, batches=5), 1: ran_out(1, next_pass=True)}
    d = decide(views, 2, **KW)
    assert d is not None and d.cause == "uneven_batches" and d.culprits == (1,)
    assert "at batch 5 of 8" in d.reason


def test_join_and_agreement_loops_are_never_proof():
    # Rank 1 ran out and is working (Join's shadow loop between two collectives, or closing
    # its files before its agreement all_reduce): it may yet join, however long rank 0 waits.
    views = {0: in_pass(0, blocked_for=3600.0), 1: ran_out(1, gone=False)}
    assert decide(views, 2, **KW) is None
    # Both in the agreement all_reduce (the same op and size at the same number): slow, fine.
    views[1] = ran_out(1, gone=False, pending=[entry(25)])
    assert decide(views, 2, **KW) is None
    # Rank 1 in Join's shadow of rank 0's all_reduce while rank 0 computes its step.
    views = {0: in_pass(0, blocked=False), 1: ran_out(1, gone=False, pending=[entry(25)])}
    assert decide(views, 2, **KW) is None


def test_what_the_proof_needs_besides_a_rank_that_ran_out():
    def cause(views):
        d = decide(views, 2, **KW)
        return d.cause if d else None

    # Equal lengths: rank 1 skipped a collective, it did not run out of batches.
    assert cause({0: in_pass(0), 1: ran_out(1, length=8, batches=8)}) == "peer_gone"
    # Rank 0 waits in a collective issued before the pass began (seq0 past it).
    assert cause({0: in_pass(0, seq0=25), 1: ran_out(1)}) == "peer_gone"
    # Rank 1 left its pass by `break`, not by running out: no ended pass to compare.
    v1 = ran_out(1)
    v1["loaders"][FOR].update(end="drop", done=[])
    assert cause({0: in_pass(0), 1: v1}) == "peer_gone"
    # Rank 0 itself left the pass by `break`: what it waits in is not the loop's.
    v0 = in_pass(0)
    v0["loaders"][FOR]["end"] = "drop"
    assert cause({0: v0, 1: ran_out(1)}) == "peer_gone"
    # Rank 1 ran out, then crashed or died: its own end is the cause, not the lengths.
    v1 = ran_out(1)
    v1.update(state="crashed", state_text="crashed (ValueError: bad record)")
    assert cause({0: in_pass(0), 1: v1}) == "peer_gone"
    v1.update(state="running", state_text="died (process 7 is gone)")
    assert cause({0: in_pass(0), 1: v1}) == "peer_gone"
    # ... but one that died in a barrier which could never pair with rank 0's all_reduce (gloo
    # aborts it) still shows that it ran out and could not join; one that crashed there does
    # not (its error is the cause to name).
    v1 = ran_out(1, gone=False, pending=[entry(25, "barrier", ())])
    v1.update(gone=True, state_text="died (process 7 is gone)")
    assert cause({0: in_pass(0), 1: v1}) == "uneven_batches"
    v1.update(state="crashed", state_text="crashed (RuntimeError: size mismatch)")
    assert cause({0: in_pass(0), 1: v1}) == "peer_gone"
    # Another loader's pass (another creation or pass number): nothing to compare.
    v1 = ran_out(1)
    v1["loaders"][FOR]["done"] = [["ffff#0/1", 7, 7]]
    assert cause({0: in_pass(0), 1: v1}) == "peer_gone"


def test_a_rank_that_ran_out_blocked_where_it_cannot_pair_is_proof():
    # Rank 1 ran out and waits in a barrier under the same number as rank 0's all_reduce.
    views = {0: in_pass(0), 1: ran_out(1, gone=False, pending=[entry(25, "barrier", ())])}
    d = decide(views, 2, **KW)
    assert d is not None and d.cause == "uneven_batches" and d.culprits == (1,)
    assert "waits in barrier #25" in d.reason
    # Rank 1 waits in another group that rank 0 belongs to and is not in: neither moves.
    views[1] = ran_out(1, gone=False, pending=[entry(3, group="1")])
    d = decide(views, 2, **{**KW, "members": {"1": [0, 1]}})
    assert d is not None and d.cause == "uneven_batches"
    # ... but a group without rank 0 can be released by its other members: no proof here.
    views = {0: in_pass(0), 1: ran_out(1, gone=False, pending=[entry(3, group="1")]),
             2: in_pass(2, blocked=False)}
    assert uneven_proof(views, 3, grace=1.0, members={"1": [1, 2]}) is None


def test_without_the_ledger_or_a_length():
    # No flight recorder: no pending entries and no ledger position; a rank that ran out and
    # left while the other waits after drawing a batch of the pass is still proof.
    views = {0: in_pass(0, pending=(), seq0=None), 1: ran_out(1)}
    assert uneven_proof(views, 2, grace=1.0) is not None
    views[0]["loaders"][FOR]["batches"] = 0
    assert uneven_proof(views, 2, grace=1.0) is None
    # Without the ledger nothing says what a blocked rank waits in: only a gone one is proof
    # (the stack fallback's own deadlock rule takes its time).
    views = {0: in_pass(0, pending=(), seq0=None), 1: ran_out(1, gone=False)}
    views[1].update(blocked=True, blocked_for=60.0)
    assert uneven_proof(views, 2, grace=1.0) is None
    # A loader without a length (an IterableDataset): the batches drawn decide.
    views = {0: in_pass(0, length=None, batches=5), 1: ran_out(1, length=None, batches=4)}
    assert uneven_proof(views, 2, grace=1.0) is not None
    views[0]["loaders"][FOR]["batches"] = 4
    assert uneven_proof(views, 2, grace=1.0) is None


def test_counts_and_notice_text():
    assert counts_text([8, 7]) == "rank 0: 8, rank 1: 7"
    big = [8] * 1024
    big[5] = big[700] = 7
    assert counts_text(big) == "8 on ranks 0-4, 6-699, 701-1023; 7 on ranks 5, 700"
    text = notice_text(FOR, MADE, [8, 7])
    assert text.startswith("ddpguard: notice: the DataLoader (created at /job/train.py:31, "
                           "iterated at /job/train.py:40)")
    assert "rank 0: 8, rank 1: 7" in text and "Not a stop by itself" in text
    for way in ("EvenSampler", "drop_last=True", "Join"):
        assert way in text


def test_hooks_mark_how_each_pass_ended():
    import torch.utils.data as tud

    from ddpguard.guard.hooks import install_hooks, uninstall_hooks
    from ddpguard.guard.progress import Progress

    prog = Progress()
    install_hooks(prog)
    try:
        loader = tud.DataLoader(list(range(10)), batch_size=3)
        for _ in loader:
            pass
        (site, st), = prog.loaders.items()
        assert st.end == "stop" and st.done == [[st.key, 4, 4]]
        assert st.at is not None and st.at.endswith(f"test_guard_uneven.py:{_line('tud.Data')}")
        for i, _ in enumerate(loader):
            if i == 1:
                break
        st = prog.loaders[next(s for s in prog.loaders if s != site)]
        assert st.end == "drop" and st.batches == 2 and st.done == []
        # next(it, None), as agreement loops write it, still sees the end of the pass.
        it = iter(loader)
        while next(it, None) is not None:
            pass
        st = prog.snapshot()["loaders"]
        assert [v["end"] for v in st.values()] == ["stop", "drop", "stop"]
    finally:
        uninstall_hooks(prog)


def _line(snippet: str) -> int:
    lines = (ROOT / "tests" / "guard" / "test_guard_uneven.py").read_text().splitlines()
    found = [i + 1 for i, t in enumerate(lines) if snippet in t and "_line(" not in t]
    assert len(found) == 1, found
    return found[0]


SCRIPT = "tests/guard/scripts/uneven_scenarios.py"


@pytest.mark.slow
@pytest.mark.timeout(170)
def test_programs_that_handle_unequal_loaders_run_to_the_end(tmp_path):
    cases = ["join_ddp", "join_zero", "join_custom", "agree"]
    res = run_cli(*guard_run(), SCRIPT, "--case", ",".join(cases),
                  timeout=150, env=child_env(DDPGUARD_REPORT_DIR=str(tmp_path)))
    assert res.returncode == 0, res.stderr[-4000:]
    for case in cases:
        for rank in (0, 1):
            assert f"rank {rank}: phase {case} done" in res.stdout, res.stdout[-2000:]
    assert "stopped" not in res.stderr and not list(tmp_path.glob("*.json")), res.stderr[-3000:]
    # One notice per loader, said once for the job, naming where it was made and iterated.
    lines = (ROOT / SCRIPT).read_text().splitlines()
    notices = [ln for ln in res.stderr.splitlines() if ln.startswith("ddpguard: notice:")]
    assert len(notices) == len(cases), notices
    for case in cases:
        made = next(i + 1 for i, t in enumerate(lines) if f"# {case} loader" in t)
        assert any(f"created at {SCRIPT}:{made}," in n and "(rank 0: 8, rank 1: 6)" in n
                   for n in notices), (case, notices)
