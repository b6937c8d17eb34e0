"""The guard's protocol and its readers of waits, in one process: the linear per-tick exchange
and judge takeover against a real TCPStore, what counts as waiting for an issued collective,
set-up waits the flight recorder does not list, NCCL entry states, and a dead rank's last
words."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from ddpguard.guard.board import CONTROL, TAKEOVER, Board
from ddpguard.guard.fault import last_words
from ddpguard.guard.ledger import compact, describe_entry, started_on_device, waiting_on_peers
from ddpguard.guard.rules import decide
from ddpguard.guard.stacks import activity, stands_in_collective
from ddpguard.guard.store import Counter, GuardStore
from ddpguard.guard.waiting import setup_entry, setup_wait, waiting_call

KW = {"grace": 1.0, "no_life": 45.0, "hard_limit": None, "fallback_deadlock": 15.0}


@pytest.fixture
def tcp_store():
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=5))
    yield store
    del store


def _members(store, world, counter):
    out = []
    for r in range(world):
        gs = GuardStore(store, "t/", counter)
        b = Board(gs, r, world, 0.05)
        b.create()
        gs.set(f"hb/{r}", {"rank": r})
        b.watch_from()
        out.append((gs, b))
    return out


@pytest.mark.parametrize("world", [4, 64])
def test_requests_per_tick_grow_linearly(tcp_store, world):
    counter = Counter()
    members = _members(tcp_store, world, counter)
    counter.requests = 0
    judges = 0
    for r, (gs, b) in enumerate(members):
        gs.set(f"hb/{r}", {"rank": r, "seq": 1})
        b.poll()
        if b.judging():
            judges += 1
            assert len(b.heartbeats()) == world
            b.publish()
    # Every rank: its heartbeat and one read of the control keys; the judge: one check, one
    # read of every heartbeat and its board. Never a read per peer.
    assert judges == 1
    assert counter.requests == 2 * world + 3


def test_next_rank_takes_over_a_silent_judge_and_the_judge_steps_down(tcp_store):
    counter = Counter()
    (g0, b0), (g1, b1), (g2, b2) = _members(tcp_store, 3, counter)
    b0.publish()
    for b in (b1, b2):
        b.poll()
        assert not b.judging()
    time.sleep(TAKEOVER * 0.05 * 1.5)  # rank 0's board stops changing
    for b in (b1, b2):
        b.poll()
    assert b1.judging() and not b2.judging()  # rank 2 waits twice as long
    b1.publish()
    b0.poll()  # rank 0 comes back, sees rank 1's board, and steps down
    assert not b0.judging() and b0.judge == 1
    b2.poll()
    assert not b2.judging()


def test_control_keys_exist_empty_until_set(tcp_store):
    gs = GuardStore(tcp_store, "c/")
    Board(gs, 0, 2, 0.5).create()
    assert gs.get_existing(CONTROL) == {}
    gs.first("trigger", {"by": 1})
    assert gs.get_existing(CONTROL) == {"trigger": {"by": 1}}
    assert gs.first("trigger", {"by": 0}) == {"by": 1}  # the first one wins


def test_partial_reads_only_when_asked(tcp_store):
    gs = GuardStore(tcp_store, "p/")
    gs.set("a", 1)
    assert gs.get_many(["a", "b"], partial=False) == {}
    assert gs.get_many(["a", "b"]) == {"a": 1}


# -- waiting for an issued collective ----------------------------------------------------------

class _Work:
    """Stands in for torch's Work: wait() blocks inside C (a lock), like gloo's."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.wait = self.lock.acquire
        self.done = False

    def is_completed(self) -> bool:
        return self.done


def _user_waits(work):
    work.wait()


def _user_polls(work):
    while not work.is_completed():
        pass


def _user_computes(stop):
    x = 0
    while not stop.is_set():
        x = sum(range(1000)) + x


def _frame_of(thread):
    import sys

    for _ in range(200):
        f = sys._current_frames().get(thread.ident)
        if f is not None and f.f_code.co_name.startswith("_user"):
            return f
        time.sleep(0.005)
    raise AssertionError("thread never reached its function")


def test_a_thread_in_work_wait_or_a_poll_loop_is_waiting():
    w = _Work()
    t = threading.Thread(target=_user_waits, args=(w,), daemon=True)
    t.start()
    try:
        assert waiting_call(_frame_of(t)) == "wait"
    finally:
        w.lock.release()
        t.join(5)
    w2 = _Work()
    t2 = threading.Thread(target=_user_polls, args=(w2,), daemon=True)
    t2.start()
    try:
        seen = {waiting_call(_frame_of(t2)) for _ in range(20)}
        assert seen == {"is_completed"}, seen  # at the call or at the loop's back-edge
    finally:
        w2.done = True
        t2.join(5)
    stop = threading.Event()
    t3 = threading.Thread(target=_user_computes, args=(stop,), daemon=True)
    t3.start()
    try:
        assert waiting_call(_frame_of(t3)) is None
    finally:
        stop.set()
        t3.join(5)


def test_group_set_up_waits_are_entries_the_rules_can_compare():
    frames = [{"file": "/x/train.py", "func": "<module>"},
              {"file": "/site-packages/torch/distributed/c10d_logger.py", "func": "wrapper"},
              {"file": "/site-packages/torch/distributed/distributed_c10d.py",
               "func": "new_group"},
              {"file": "/site-packages/torch/distributed/distributed_c10d.py",
               "func": "_new_process_group_helper"}]
    assert setup_wait(frames) == "new_group"
    assert setup_wait(frames[:2]) is None
    ng = setup_entry("new_group")
    assert describe_entry(ng) == "new_group (process-group set-up)"
    ar = ["0", 7, "all_reduce", [[4]], ["Float"], False]

    def v(rank, pend):
        return {"rank": rank, "blocked": True, "pending": [pend], "quiet": 3.0,
                "blocked_for": 3.0, "gone": False, "state": "running", "where": "t.py:1"}

    # Rank 0 forms a group nobody else forms while rank 1 waits in an all_reduce: proof.
    d = decide({0: v(0, ng), 1: v(1, ar)}, 2, **KW)
    assert d is not None and d.proof and "new_group (process-group set-up)" in d.reason
    # Both in the same set-up call: slow, not stuck.
    assert decide({0: v(0, ng), 1: v(1, ng)}, 2, **KW) is None
    # Members of a subgroup still connecting while the non-members already wait in an
    # all_reduce that includes them: not proof (the members will get there).
    views = {0: v(0, ng), 1: v(1, ng), 2: v(2, ar), 3: v(3, ar)}
    assert decide(views, 4, **KW) is None
    # Set-up waits never line up as a "mismatch" (they have no sequence number).
    mb = setup_entry("monitored_barrier")
    assert decide({0: v(0, ng), 1: v(1, mb), 2: v(2, ng)}, 4, **KW) is None


def test_nccl_entry_states_and_started_collectives():
    raw = {"process_group": ("0", "default_pg"), "collective_seq_id": 12,
           "profiling_name": "nccl:all_reduce", "input_sizes": [[1024]],
           "input_dtypes": ["Float"], "retired": False, "is_p2p": False, "state": "started"}
    e = compact(raw)
    assert e == ["0", 12, "all_reduce", [[1024]], ["Float"], False, "started"]
    assert describe_entry(e).endswith("[started]")
    # gloo leaves every entry 'scheduled': no state is kept.
    assert len(compact({**raw, "profiling_name": "gloo:all_reduce"}) or []) == 6
    status = {"0": (12, 11)}
    assert waiting_on_peers(status, {"0": -1})       # starts not tracked: enqueued counts
    assert waiting_on_peers(status, {"0": 12})       # the device started it: waits for peers
    assert not waiting_on_peers(status, {"0": 11})   # still busy before it: not waiting
    assert not waiting_on_peers({"0": (12, 12)}, {"0": 12})
    # The device's own word: only where starts are tracked (NCCL), never on gloo.
    assert started_on_device(status, {"0": 12})
    assert not started_on_device(status, {"0": 11})      # the device is busy before it
    assert not started_on_device(status, {"0": -1})      # gloo: the stack must say it
    assert not started_on_device({"0": (12, 12)}, {"0": 12})


def test_a_pending_collective_is_a_wait_only_where_the_thread_stands_in_one():
    """The flight recorder can list a gloo collective as pending long after the training
    thread moved on: CI saw rank 1 in the DataLoader, and a loaded machine rank 0 reading a
    socket after DDP's last gradient all-reduce, both taken for a cross-wait."""
    main = {"file": "/x/train.py", "func": "main", "line": 9}
    loader = [main, {"file": "/site/torch/utils/data/dataloader.py", "func": "__next__",
                     "line": 1}]
    socket_read = [main, {"file": "/usr/lib/python3.11/socket.py", "func": "readinto",
                          "line": 706}]
    in_bcast = [main, {"file": "/site/torch/distributed/distributed_c10d.py",
                       "func": "broadcast", "line": 1}]
    other_op = [main, {"file": "/site/torch/distributed/_functional_collectives.py",
                       "func": "wait_tensor", "line": 1}]
    backward = [main, {"file": "/site/torch/_tensor.py", "func": "backward", "line": 1}]
    assert activity(loader)[0] == "dataloader"
    for frames in (loader, socket_read):
        assert not stands_in_collective(True, activity(frames)[0], frames, None)
    for frames in (in_bcast, other_op, backward):
        assert stands_in_collective(True, activity(frames)[0], frames, None), frames
    # an NCCL collective waited for from the user's code: `work.wait()`, `loss.item()`
    assert stands_in_collective(True, "running", [main], "wait")
    assert not stands_in_collective(False, activity(in_bcast)[0], in_bcast, "wait")


def test_last_words_of_an_aborted_rank(tmp_path):
    main = 0x7F20E7A78B80
    log = tmp_path / "fault.txt"
    log.write_text(
        "Fatal Python error: Aborted\n\n"
        "Thread 0x00007f20e0000000 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n\n'
        "Thread 0x00007f20e7a78b80 (most recent call first):\n"
        '  File "/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce\n'
        '  File "/work/job/train.py", line 188 in <module>\n')
    text = last_words(str(log), main)
    assert "Fatal Python error: Aborted" in text and "/work/job/train.py:188 in <module>" in text
    assert "inside torch.distributed.all_reduce" in text and "did not match" in text, text
    # A helper's line comes with its caller's.
    helper = log.read_text().replace(
        '  File "/work/job/train.py", line 188 in <module>\n',
        '  File "/work/job/meter.py", line 501 in all_reduce\n'
        '  File "/work/job/train.py", line 300 in validate\n')
    log.write_text(helper)
    assert ("/work/job/meter.py:501 in all_reduce, called from /work/job/train.py:300 in "
            "validate") in last_words(str(log), main)
    # Outside a collective: only where it was.
    log.write_text(log.read_text().replace("line 3252 in all_reduce", "line 3252 in helper"))
    assert "did not match" not in last_words(str(log), main)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert last_words(str(empty), main) == "" and last_words(None, main) == ""


def test_collectives_are_matched_to_the_line_that_issued_them(monkeypatch):
    import torch
    import torch.distributed as dist

    from ddpguard.guard.issued import IssueSites
    from ddpguard.guard.ledger import Ledger, ensure_recorder_env
    from ddpguard.testing import free_port

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    env: dict[str, str] = {}
    ensure_recorder_env(env)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    sites = IssueSites()
    sites.install()
    try:
        dist.all_reduce(torch.ones(3))  # synchronous, issued here
        work = dist.all_reduce(torch.ones(4), async_op=True)  # asynchronous, issued here
        work.wait()
        assert len(sites.sites) == 2
        ledger = Ledger()
        last = max(e[1] for e in ledger.entries())
        created = ledger.created_ns({("0", last), ("0", last - 1)})
        me = threading.get_ident()
        for seq, snippet in ((last, "# asynchronous, issued here"),
                             (last - 1, "# synchronous, issued here")):
            where = sites.site_for(created[("0", seq)], me)
            assert where is not None and where.endswith(
                "test_guard_protocol.py:" + str(_line_of(snippet)) +
                " in test_collectives_are_matched_to_the_line_that_issued_them"), where
        # Another thread's entry is never matched to this thread's call.
        assert sites.site_for(created[("0", last)], me + 1) is None
    finally:
        sites.uninstall()
        dist.destroy_process_group()
    assert not hasattr(dist.all_reduce, "__ddpguard_wrapped__")


def _line_of(snippet: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i + 1 for i, t in enumerate(lines) if snippet in t and "_line_of" not in t)


def test_an_unwinding_note_counts_only_for_the_collective_a_rank_died_in():
    from ddpguard.guard.unwinding import from_notes as _unwinding

    raised = "ValueError: bad (raised at t.py:3 in f)"
    assert _unwinding([("error", "x"), ("unwinding", raised)]) == raised
    # Twin: that collective completed (the rank went on): nothing to say.
    assert _unwinding([("unwinding", raised), ("unwinding", "-")]) is None
    assert _unwinding([]) is None
