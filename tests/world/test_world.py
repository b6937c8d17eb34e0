"""World.detect (pure, one process) and process-group set-up (real gloo processes)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from ddpguard.world import NCCL_DEFAULTS, World, detect, expand_nodelist, nccl_env_defaults

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}


def test_single_process_by_default():
    w = detect({})
    assert (w.rank, w.world_size, w.local_rank, w.launcher) == (0, 1, 0, "single")
    assert w.is_main and not w.distributed


def test_torchrun_variables():
    w = detect(TORCHRUN)
    assert (w.rank, w.world_size, w.local_rank, w.local_world_size) == (3, 8, 1, 4)
    assert (w.master_addr, w.master_port, w.launcher) == ("10.0.0.1", 29400, "torchrun")
    assert w.num_nodes == 2 and not w.is_main and not w.is_local_main
    assert not w.agent_store
    assert detect({**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True"}).agent_store


def test_torchrun_wins_over_slurm():
    w = detect({**TORCHRUN, "SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    assert w.launcher == "torchrun" and w.rank == 3


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"RANK": "0"}, "WORLD_SIZE unset"),
        ({"WORLD_SIZE": "2"}, "RANK unset"),
        ({**TORCHRUN, "RANK": "8"}, "RANK=8 is not below WORLD_SIZE=8"),
        ({**TORCHRUN, "RANK": "-1"}, "RANK=-1"),
        ({**TORCHRUN, "RANK": "two"}, "RANK='two' is not an integer"),
        ({**TORCHRUN, "WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE='0'"),
        ({**TORCHRUN, "LOCAL_RANK": "4"}, "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"),
        ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR and MASTER_PORT not set"),
        ({**TORCHRUN, "MASTER_PORT": "x"}, "MASTER_PORT='x'"),
        ({"SLURM_PROCID": "0"}, "SLURM_NTASKS is not"),
        ({"SLURM_PROCID": "2", "SLURM_NTASKS": "2"}, "SLURM_PROCID=2 is not below SLURM_NTASKS=2"),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, "SLURM_JOB_NODELIST"),
    ],
)
def test_bad_environment_names_the_variable(env, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        detect(env)


def test_slurm_variables():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_NODELIST": "gpu[07-08,11]",
           "SLURM_JOB_ID": "123456"}
    w = detect(env)
    assert (w.rank, w.world_size, w.local_rank, w.local_world_size) == (5, 8, 1, 4)
    assert w.master_addr == "gpu07" and w.launcher == "slurm"
    assert w.master_port == detect(env).master_port  # same job -> same port on every task
    assert detect({**env, "MASTER_ADDR": "head", "MASTER_PORT": "1234"}).master_port == 1234
    assert detect({**env, "SLURM_NTASKS_PER_NODE": "4(x2)"}).local_world_size == 4


def test_interactive_slurm_shell_is_single_process():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NAME": "bash"}
    assert detect(env).launcher == "single"


@pytest.mark.parametrize(
    "spec, hosts",
    [
        ("localhost", ["localhost"]),
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("a1,b[2-3]", ["a1", "b2", "b3"]),
        ("rack[1-2]-n[5-6]", ["rack1-n5", "rack1-n6", "rack2-n5", "rack2-n6"]),
        ("gpu[9-11]", ["gpu9", "gpu10", "gpu11"]),
        ("x[007-008],y", ["x007", "x008", "y"]),
    ],
)
def test_expand_nodelist(spec, hosts):
    assert expand_nodelist(spec) == hosts


@pytest.mark.parametrize("spec", ["node[01-04", "node]1[", "n[5-2]", "n[a-b]", ""])
def test_expand_nodelist_rejects_garbage(spec):
    with pytest.raises(ValueError, match="node list|range"):
        expand_nodelist(spec)


def test_world_validates_itself():
    with pytest.raises(ValueError, match="rank 2 is outside the world of size 2"):
        World(rank=2, world_size=2)
    with pytest.raises(ValueError, match="master_port"):
        World(master_port=0)


def test_print_only_on_rank_zero(capsys):
    World(rank=1, world_size=2, local_rank=1, local_world_size=2).print("quiet")
    World(rank=1, world_size=2, local_rank=1, local_world_size=2).print("loud", force=True)
    World().print("main", "line")
    assert capsys.readouterr().out == "[rank 1] loud\nmain line\n"


def test_single_process_init_and_double_shutdown(clean_env):
    import torch.distributed as dist

    import ddpguard as dg

    world = dg.init(backend="gloo")
    assert world.world_size == 1 and world.backend == "gloo" and not dist.is_initialized()
    dg.shutdown(world)
    dg.shutdown(world)


def test_nccl_defaults_unless_the_user_set_them():
    assert nccl_env_defaults({}) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
                                     "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"} == NCCL_DEFAULTS
    user = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    assert nccl_env_defaults(user) == {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    # The deprecated spelling is the user's choice too: torch would read ours first.
    assert nccl_env_defaults({"NCCL_ASYNC_ERROR_HANDLING": "0"}) == {
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    assert nccl_env_defaults({**NCCL_DEFAULTS, "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}) == {}


def test_nccl_defaults_read_the_real_process_environment(monkeypatch):
    # os.environ is what init passes; unlike a dict, it raises on a None key, which is how
    # every multi-rank NCCL set-up once failed (seen on a GPU, never on CPU CI).
    for name in [*NCCL_DEFAULTS, "NCCL_ASYNC_ERROR_HANDLING", "NCCL_DUMP_ON_TIMEOUT"]:
        monkeypatch.delenv(name, raising=False)
    assert nccl_env_defaults(os.environ) == NCCL_DEFAULTS
    monkeypatch.setenv("TORCH_NCCL_DUMP_ON_TIMEOUT", "0")
    assert nccl_env_defaults(os.environ) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}


def test_init_rejects_bad_timeouts(clean_env):
    import ddpguard as dg

    with pytest.raises(ValueError, match="init_timeout must be a positive duration, got -1"):
        dg.init(init_timeout=-1)


# ------------------------------------------------------------------ multi-process (real gloo)


def _guard_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name == "ddpguard-guard"]


def _allreduce_and_double_shutdown(world):
    import torch
    import torch.distributed as dist

    from ddpguard import guard
    from ddpguard.session import shutdown

    t = torch.tensor([world.rank + 1.0])
    dist.all_reduce(t)
    result = (world.rank, world.world_size, world.backend, str(world.device), t.item())
    running = (_guard_threads(), guard.active() is not None)
    shutdown(world)
    stopped = (_guard_threads(), guard.active() is not None, dist.is_initialized())
    shutdown(world)  # second call: no group left, must return at once
    return result, running, stopped


@pytest.mark.parametrize("n", [2, 4])
def test_group_forms_on_n_ranks(n):
    from ddpguard.testing import run_ranks

    out = run_ranks(_allreduce_and_double_shutdown, n, timeout=90)
    total = n * (n + 1) / 2
    assert [r[0] for r in out] == [(r, n, "gloo", "cpu", total) for r in range(n)]
    for _, running, stopped in out:
        assert running == (["ddpguard-guard"], True)  # init starts the guard by default
        assert stopped == ([], False, False)  # shutdown stops its thread and the group


def _rank1_never_joins(world, flag: str):
    import torch
    import torch.distributed as dist

    if world.rank == 1:
        # Stay away from the collective until rank 0 is done with it (or 60 s).
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.05)
        return None
    start = time.monotonic()
    try:
        dist.all_reduce(torch.zeros(1))
        outcome = "returned"
    except RuntimeError as exc:
        outcome = str(exc)
    elapsed = time.monotonic() - start
    open(flag, "w").close()
    return elapsed, outcome


def test_collective_timeout_of_init_applies(tmp_path):
    from ddpguard.testing import run_ranks

    # init_timeout stays long (60 s): only `timeout=` can end the wait after ~3 s.
    out = run_ranks(_rank1_never_joins, 2, args=(str(tmp_path / "done"),), timeout=90,
                    init_kwargs={"timeout": 3, "init_timeout": 60, "guard": False})
    elapsed, outcome = out[0]
    assert outcome != "returned"
    assert "timed out" in outcome.lower() or "timeout" in outcome.lower(), outcome
    assert 2.5 <= elapsed < 15, elapsed


def _raise_on_rank1(world):
    if world.rank == 1:
        raise RuntimeError("boom on purpose")
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.zeros(1))  # rank 0 blocks here: rank 1 never joins
    return "unreachable"


def test_harness_names_failed_and_blocked_ranks():
    from ddpguard.testing import RankFailure, run_ranks

    with pytest.raises(RankFailure) as info:
        run_ranks(_raise_on_rank1, 2, timeout=60, init_kwargs={"timeout": 30})
    text = str(info.value)
    assert "rank 1 raised" in text and "boom on purpose" in text
    # Rank 0 is named either way: gloo fails its all_reduce once rank 1 is gone, its guard
    # stops it (a crashed peer while it waits: proof), or the harness stops it after the grace
    # period, whichever comes first.
    assert ("rank 0 raised" in text or "rank 0 was stopped while blocked" in text
            or "rank 0 was stopped by the hang guard" in text), text


def _sleep_forever_on_rank0(world):
    if world.rank == 0:
        time.sleep(3600)
    return world.rank


def test_harness_names_hung_rank_with_stack():
    from ddpguard.testing import RankFailure, run_ranks

    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_ranks(_sleep_forever_on_rank0, 2, timeout=10)
    assert time.monotonic() - start < 40
    text = str(info.value)
    assert text.startswith("1 of 2 ranks failed")
    assert "rank 0 hung" in text and "_sleep_forever_on_rank0" in text
    assert "rank 1" not in text  # rank 1 finished: it is not blamed


HELPER = """
import sys, ddpguard as dg
world = dg.init(init_timeout=float(sys.argv[1]))
print("OK", world.rank, world.world_size, world.launcher, flush=True)
dg.shutdown(world)
"""


def _spawn(env_extra, timeout_s="20"):
    from helpers import child_env

    return subprocess.Popen([sys.executable, "-c", HELPER, timeout_s],
                            env=child_env(**env_extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(procs, timeout=90):
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return outs


def test_slurm_variables_alone_form_a_group():
    from ddpguard.testing import free_port

    port = str(free_port())
    procs = [_spawn({"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r),
                     "SLURM_JOB_NODELIST": "localhost", "MASTER_PORT": port}) for r in (0, 1)]
    outs = _finish(procs)
    for r, (code, out, err) in enumerate(outs):
        assert code == 0, err
        assert f"OK {r} 2 slurm" in out


def test_unreachable_master_fails_within_init_timeout():
    from ddpguard.testing import free_port

    start = time.monotonic()
    # Rank 1 of 2 pointing at a port where nobody listens: must give up after ~3 s.
    (code, out, err), = _finish([_spawn({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                                         "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                         "MASTER_PORT": str(free_port())}, "3")])
    assert code != 0
    assert time.monotonic() - start < 60
    assert "rank 1/2: process group set-up failed" in err
    assert "MASTER_ADDR:MASTER_PORT=127.0.0.1" in err


def test_port_in_use_is_named():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = str(busy.getsockname()[1])
        (code, out, err), = _finish([_spawn({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                                             "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                             "MASTER_PORT": port}, "3")])
    assert code != 0
    assert f"port {port} on 127.0.0.1 is already in use" in err, err


DEAD_PEER = """
import json, os, signal, sys, threading, time
import torch.distributed as dist
import ddpguard as dg

world = dg.init(init_timeout=30, timeout=30)
ready = sys.argv[1]
if world.rank == 0:
    # Only once rank 1's init has returned: dying during its set-up is another test.
    deadline = time.monotonic() + 30
    while not os.path.exists(ready) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGKILL)  # rank 0 hosts the store: the worst peer to lose
open(ready, "w").close()
time.sleep(1.5)
# gloo tears down at once even now; NCCL's teardown can block on a dead peer. Stand in for it
# with a destroy that never returns, so that only shutdown's own bound can end the call.
dist.destroy_process_group = lambda *a, **k: time.sleep(3600)
start = time.monotonic()
dg.shutdown(world, limit=2)
print(json.dumps({"elapsed": time.monotonic() - start,
                  "guard": [t.name for t in threading.enumerate() if t.name == "ddpguard-guard"]}),
      flush=True)
os._exit(0)  # the stand-in teardown thread is left behind on purpose
"""


def test_shutdown_is_bounded_after_a_peer_died(tmp_path):
    from helpers import child_env

    from ddpguard.testing import free_port, loopback_env

    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", DEAD_PEER, str(tmp_path / "ready")],
                              env=child_env(**loopback_env(r, 2, port)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    (code0, _, _), (code1, out1, err1) = _finish(procs, timeout=60)
    assert code0 == -9
    assert code1 == 0, err1[-3000:]
    report = json.loads(out1.strip().splitlines()[-1])
    assert report["elapsed"] < 6, report  # limit=2 plus the guard's final store write
    assert report["guard"] == []
    assert "did not return within 2 s" in err1


def test_timedelta_timeouts_accepted(clean_env):
    import ddpguard as dg

    world = dg.init(init_timeout=timedelta(seconds=5), timeout=timedelta(seconds=5))
    dg.shutdown(world)
