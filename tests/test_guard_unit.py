"""Guard parts without launching jobs: config, argv wrapping, diagnosis on recorded stacks,
and the guard inside `ddpguard.init()` on real gloo ranks (started, stopped, no leaks)."""

from __future__ import annotations

import pytest

from ddpguard.commands.run import BOOTSTRAP, build_torchrun_argv
from ddpguard.guard.config import GuardConfig
from ddpguard.guard.diagnose import diagnose
from ddpguard.testing import run_ranks

FLAGS = {"--standalone", "-m", "--module", "--no-python"}
TORCH = "/x/site-packages/torch/"


def test_config_adapts_and_validates():
    c = GuardConfig(stall_floor=5, stall_ceiling=100, stall_factor=10)
    assert c.timeout_for(0.01) == 5
    assert c.timeout_for(3.0) == 30
    assert c.timeout_for(60.0) == 100
    assert GuardConfig(stall_timeout=7).timeout_for(60) == 7
    with pytest.raises(ValueError, match="stall_floor"):
        GuardConfig(stall_floor=0)
    with pytest.raises(ValueError, match="stall_ceiling=1"):
        GuardConfig(stall_floor=5, stall_ceiling=1)
    assert GuardConfig.from_env({"DDPGUARD_STALL_FLOOR": "3"}).stall_floor == 3
    with pytest.raises(ValueError, match="DDPGUARD_STALL_TIMEOUT='soon'"):
        GuardConfig.from_env({"DDPGUARD_STALL_TIMEOUT": "soon"})


def test_run_wraps_script_in_bootstrap_unless_disabled():
    argv = build_torchrun_argv(["t.py", "--lr", "1"], gpu_count=0, flags=FLAGS)
    assert argv == ["--nproc-per-node=2", "--standalone", "-m", BOOTSTRAP, "t.py", "--lr", "1"]
    plain = build_torchrun_argv(["--no-guard", "t.py"], gpu_count=0, flags=FLAGS)
    assert plain == ["--nproc-per-node=2", "--standalone", "t.py"]
    assert build_torchrun_argv(["t.py"], gpu_count=0, flags=FLAGS, guard=False)[-1] == "t.py"
    mod = build_torchrun_argv(["-m", "pkg.train"], gpu_count=0, flags=FLAGS)
    assert mod[-4:] == ["-m", BOOTSTRAP, "-m", "pkg.train"]
    nopy = build_torchrun_argv(["--no-python", "echo"], gpu_count=0, flags=FLAGS)
    assert BOOTSTRAP not in nopy


def _frames(*spec):
    return [{"file": f, "line": ln, "func": fn, "code": ""} for f, ln, fn in spec]


def _rec(rank, frames, state="running", **hb):
    base = {"epoch": 0, "steps": 3, "steps_epoch": 3, "batches": 3, "epoch_batches": 3,
            "epoch_len": 4, "steps_per_epoch": [], "epoch_offset": 0}
    base.update(hb)
    return {"rank": rank, "state": state, "hb": base, "stacks": {"main": frames}}


BARRIER = (f"{TORCH}distributed/distributed_c10d.py", 10, "barrier")
BACKWARD = (f"{TORCH}autograd/graph.py", 5, "_engine_run_backward")


def test_diagnose_conditional_barrier_names_the_line():
    src = ["for e in range(2):", "    train()", "    if rank == 0:", "        dist.barrier()"]
    recs = [_rec(0, _frames(("/u/t.py", 4, "<module>"), BARRIER)),
            _rec(1, _frames(("/u/t.py", 2, "<module>"), ("/u/t.py", 20, "train"), BACKWARD))]
    d = diagnose(recs, {"/u/t.py": src})
    assert d["cause"] == "conditional_collective"
    assert "/u/t.py:4" in d["explanation"] and d["culprits"] == [0]


def test_diagnose_left_early_with_uneven_counts():
    recs = [_rec(0, _frames(("/u/t.py", 9, "<module>"),
                            (f"{TORCH}distributed/distributed_c10d.py", 1,
                             "destroy_process_group")), steps_epoch=3),
            _rec(1, _frames(("/u/t.py", 5, "<module>"), BACKWARD), steps_epoch=4)]
    d = diagnose(recs)
    assert d["cause"] == "uneven_batches"
    assert "rank 0 is in torch.distributed.destroy_process_group" in d["explanation"]


def test_diagnose_crashed_and_unknown():
    recs = [_rec(0, _frames(("/u/t.py", 5, "<module>"), BACKWARD)),
            {"rank": 1, "state": "dead", "hb": {}, "stacks": None, "error": None}]
    d = diagnose(recs)
    assert d["cause"] == "crashed_rank" and d["culprits"] == [1]
    assert "rank 1 died" in d["explanation"] and "/u/t.py:5" in d["explanation"]
    same = [_rec(r, _frames(("/u/t.py", 5, "<module>"), BACKWARD)) for r in range(2)]
    assert diagnose(same)["cause"] == "unknown"


def _guarded(world):
    from ddpguard import guard

    g = guard.active()
    return g is not None and g._thread is not None and g._thread.is_alive()


def test_init_starts_guard_and_shutdown_stops_it():
    assert run_ranks(_guarded, 2, timeout=120) == [True, True]
    assert run_ranks(_guarded, 2, timeout=120, init_kwargs={"guard": False}) == [False, False]


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
