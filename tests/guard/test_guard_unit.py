"""Guard parts without launching jobs: config, argv wrapping, diagnosis on recorded stacks,
and the guard inside `ddpguard.init()` on real gloo ranks (started, stopped, no leaks)."""

from __future__ import annotations

import pytest

from ddpguard.guard.config import GuardConfig
from ddpguard.launch.argv import BOOTSTRAP, build_torchrun_argv, pop_our_options
from ddpguard.testing import run_ranks

FLAGS = {"--standalone", "-m", "--module", "--no-python"}


def test_config_validates_and_reads_the_environment():
    c = GuardConfig()
    assert (c.no_life, c.notice_after, c.stall_timeout) == (45.0, 60.0, None)
    with pytest.raises(ValueError, match="no_life"):
        GuardConfig(no_life=0)
    with pytest.raises(ValueError, match="settle=0.1 is shorter than heartbeat_interval=0.5"):
        GuardConfig(settle=0.1)
    env = {"DDPGUARD_NO_LIFE": "3", "DDPGUARD_STALL_TIMEOUT": "30", "DDPGUARD_LEDGER": "off"}
    c = GuardConfig.from_env(env)
    assert (c.no_life, c.stall_timeout, c.ledger) == (3.0, 30.0, False)
    with pytest.raises(ValueError, match="DDPGUARD_STALL_TIMEOUT='soon'"):
        GuardConfig.from_env({"DDPGUARD_STALL_TIMEOUT": "soon"})
    with pytest.raises(ValueError, match="DDPGUARD_LEDGER='maybe'"):
        GuardConfig.from_env({"DDPGUARD_LEDGER": "maybe"})


def test_run_wraps_script_in_bootstrap_unless_disabled():
    argv = build_torchrun_argv(["t.py", "--lr", "1"], gpu_count=0, flags=FLAGS)
    assert argv == ["--monitor-interval=1", "--nproc-per-node=2", "--standalone", "-m",
                    BOOTSTRAP, "t.py", "--lr", "1"]
    limited = build_torchrun_argv(["--stall-timeout", "30", "t.py"], gpu_count=0, flags=FLAGS)
    assert "--stall-timeout" not in limited and "30" not in limited
    assert pop_our_options(["--stall-timeout=30", "--nnodes", "2"]) == (
        ["--nnodes", "2"], {"DDPGUARD_STALL_TIMEOUT": "30"})
    with pytest.raises(ValueError, match="--stall-timeout='x'"):
        pop_our_options(["--stall-timeout", "x"])
    plain = build_torchrun_argv(["--no-guard", "t.py"], gpu_count=0, flags=FLAGS)
    assert plain == ["--nproc-per-node=2", "--standalone", "t.py"]
    assert build_torchrun_argv(["t.py"], gpu_count=0, flags=FLAGS, guard=False)[-1] == "t.py"
    mod = build_torchrun_argv(["-m", "pkg.train"], gpu_count=0, flags=FLAGS)
    assert mod[-4:] == ["-m", BOOTSTRAP, "-m", "pkg.train"]
    nopy = build_torchrun_argv(["--no-python", "echo"], gpu_count=0, flags=FLAGS)
    assert BOOTSTRAP not in nopy


def _guard_threads(world):
    """Names of live guard threads before and after shutdown (the harness's own shutdown
    would follow; calling it twice is allowed)."""
    import threading

    import ddpguard as dg
    from ddpguard.guard import active
    from ddpguard.guard.heartbeat import Heartbeat

    g = active()
    # Every key a real heartbeat carries is in the documented schema.
    unknown = sorted(set(g.heartbeat()) - set(Heartbeat.__annotations__)) if g else []
    before = [t.name for t in threading.enumerate() if t.name == "ddpguard-guard"]
    dg.shutdown(world)
    after = [t.name for t in threading.enumerate() if t.name == "ddpguard-guard"]
    return before, after, unknown


def test_init_starts_guard_and_shutdown_stops_it():
    assert run_ranks(_guard_threads, 2, timeout=120) == [(["ddpguard-guard"], [], [])] * 2
    off = run_ranks(_guard_threads, 2, timeout=120, init_kwargs={"guard": False})
    assert off == [([], [], [])] * 2


def test_set_epoch_warning_only_for_the_same_sampler_reused():
    import warnings

    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    from ddpguard.guard.progress import Progress

    ds = torch.utils.data.TensorDataset(torch.arange(8.0))

    def loader():
        return DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, 2, 0, shuffle=True))

    progress = Progress()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fresh sampler at the same line is not a repeat
        progress.loader_iter("train.py:10", loader())
        progress.loader_iter("train.py:10", loader())
    reused = loader()
    progress.loader_iter("train.py:20", reused)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        progress.loader_iter("train.py:20", reused)
    assert any("without set_epoch()" in str(w.message) for w in caught)


def test_report_keeps_the_last_word_of_a_rank_that_exited():
    """A rank that said it exited is silent because it is gone: the report shows it exited,
    not "not answering (process stopped or frozen?)"; its twin, a running rank gone silent,
    is shown as not answering."""
    from ddpguard.guard.assemble import assemble
    from ddpguard.guard.config import GuardConfig
    from ddpguard.guard.peers import PeerTable
    from ddpguard.guard.rules import Decision

    table = PeerTable(0, "h", 0.5, 10.0)
    table._seq[1] = (3, 0.0)  # rank 1's heartbeat last changed long ago
    for state, shown in [("exited", False), ("running", True)]:
        hb = {"rank": 1, "state": state, "host": "other", "pid": 1, "doing": "its loop"}
        rep = assemble(Decision("peer_gone", "r", (1,)), {1: hb}, {}, rank=0, world_size=2,
                       own={"rank": 0, "state": "running"}, table=table, run_id="x",
                       config=GuardConfig())
        one = rep["ranks"][1]
        assert one["state"] == state
        assert ("not answering" in str(one["hb"].get("doing"))) is shown, one


def test_a_one_batch_peek_before_set_epoch_is_no_repeated_epoch(tmp_path):
    # pytorch/examples' DDP tutorial: `next(iter(loader))` before `set_epoch` each epoch.
    # The peek sees the previous epoch's order (it is one batch, not an epoch); a loop by
    # hand at a line that is no loop head draws a second batch: that is an epoch repeated.
    import warnings

    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    from ddpguard.guard.progress import Progress

    script = tmp_path / "train.py"
    script.write_text("b_sz = len(next(iter(loader))[0])\nit = iter(loader)\n")
    ds = torch.utils.data.TensorDataset(torch.arange(8.0))
    loader = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, 2, 0, shuffle=True))
    progress = Progress()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for epoch in range(3):
            st = progress.loader_iter(f"{script}:1", loader)
            progress.batch(st)
            loader.sampler.set_epoch(epoch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            st = progress.loader_iter(f"{script}:2", loader)
            progress.batch(st)
            progress.batch(st)
    assert [str(w.message).count("without set_epoch()") for w in caught] == [1], caught
