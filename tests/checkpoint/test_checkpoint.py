"""Atomic checkpoints: round trip on real ranks, RNG per rank, bad input, kill during save."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import computed_once
from torch import nn

from ddpguard.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from ddpguard.metrics import LossWatch
from ddpguard.model import prepare_model
from ddpguard.testing import RankFailure, run_ranks
from ddpguard.world import World


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _record_writes(folder: str) -> list[str]:
    """Every file this process opens for writing, renames or removes under `folder` (an audit
    hook: it sees what torch.save and os.replace do, whoever calls them)."""
    writes: list[str] = []

    def hook(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[1], str) and set(args[1]) & set("wax+"):
            paths = [args[0]]
        elif event in ("os.rename", "os.remove"):
            paths = list(args[:2]) if event == "os.rename" else [args[0]]
        else:
            return
        mine = [os.fspath(p) for p in paths if isinstance(p, (str, os.PathLike))
                and os.fspath(p).startswith(folder)]
        if mine:
            writes.append(f"{event} {os.path.basename(mine[0])}")

    sys.addaudithook(hook)  # this rank's process ends with the test
    return writes


def _round_trip(world: World, folder: str) -> dict[str, object]:
    import random

    writes = _record_writes(folder)
    model = prepare_model(_net(), world)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    for step in range(3):
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        save_checkpoint(folder, world, model=model, optimizer=opt, scheduler=sched,
                        sampler_state={"epoch": 1, "consumed": 7 + step}, epoch=1, step=step,
                        keep_last=2, timeout=60)
    # What each RNG yields next, right after the last save.
    expect = [torch.rand(3).tolist(), float(np.random.rand()), random.random()]
    saved = [p.detach().clone() for p in model.parameters()]
    # Scramble everything, then load into fresh objects.
    torch.manual_seed(123 + world.rank)
    np.random.seed(5)
    random.seed(5)
    fresh = prepare_model(_net(seed=9), world)
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, 1, gamma=0.5)
    info = load_checkpoint(folder, world, model=fresh, optimizer=opt2, scheduler=sched2)
    got = [torch.rand(3).tolist(), float(np.random.rand()), random.random()]
    same = all(torch.equal(a, b) for a, b in zip(saved, fresh.parameters(), strict=True))
    return {"files": sorted(p.name for p in list_checkpoints(folder)), "same": same,
            "rng_ok": got == expect, "step": info["step"], "sampler": info["sampler"],
            "lr": opt2.param_groups[0]["lr"], "opt_state": len(opt2.state),
            "writes": list(writes), "keys": sorted(_net().state_dict())}


def _two_rank_runs(world: World, folder: str) -> dict[str, object]:
    """This module's runs on one 2-rank group (a group start costs seconds per rank). The round
    trip first: its audit hook stays for the process but records only under its own folder."""
    return {"round_trip": _round_trip(world, f"{folder}/rt"),
            "unwritable": _unwritable_on_ranks(world, f"{folder}/file/c"),
            "nan": _nan_on_rank1(world)}


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    def job(folder: Path) -> tuple[Path, list[dict]]:
        (folder / "rt").mkdir()
        (folder / "file").write_text("x")  # a file where a folder should be: unwritable
        return folder, run_ranks(_two_rank_runs, 2, args=(str(folder),), timeout=120)

    return computed_once(tmp_path_factory, "checkpoint", job)


def test_round_trip_on_two_ranks_keeps_last_two(two_rank_runs: tuple[Path, list[dict]]) -> None:
    tmp_path = two_rank_runs[0] / "rt"
    res = [r["round_trip"] for r in two_rank_runs[1]]
    for r in res:
        assert r["files"] == ["ckpt-00000001.pt", "ckpt-00000002.pt"]
        assert r["same"] and r["rng_ok"], r
        assert r["step"] == 2 and r["sampler"] == {"epoch": 1, "consumed": 9}
        assert r["lr"] == pytest.approx(0.1 * 0.5**3) and r["opt_state"] == 4
    # Everything saved loads with weights_only=True (no pickled classes).
    ckpt = torch.load(latest_checkpoint(tmp_path), weights_only=True)
    assert len(ckpt["rng"]) == 2 and ckpt["world_size"] == 2
    # The unwrapped module's keys, not the DDP wrapper's (`module.` prefixes).
    assert sorted(ckpt["model"]) == res[0]["keys"] and ckpt["model"]
    # Rank 0 wrote (3 temp files, 3 renames, 1 pruned file); rank 1 never touched the folder.
    assert res[1]["writes"] == []
    w0 = res[0]["writes"]
    assert sum(e.startswith("open ") for e in w0) == 3, w0
    assert sum(e.startswith("os.rename ") for e in w0) == 3, w0


def test_foreign_checkpoint_with_module_prefix(tmp_path: Path) -> None:
    src = _net(seed=3)
    torch.save({f"module.{k}": v for k, v in src.state_dict().items()}, tmp_path / "x.pt")
    dst = _net(seed=4)
    load_checkpoint(tmp_path / "x.pt", World(), model=dst)
    assert all(torch.equal(a, b) for a, b in zip(src.parameters(), dst.parameters(), strict=True))


def test_different_model_lists_keys(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "a.pt", World(), model=_net())
    other = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2), nn.Linear(2, 3))
    with pytest.raises(CheckpointError, match=r"2 missing key\(s\): 3.weight, 3.bias"):
        load_checkpoint(tmp_path / "a.pt", World(), model=other)
    wider = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
    with pytest.raises(CheckpointError, match="shape mismatch"):
        load_checkpoint(tmp_path / "a.pt", World(), model=wider)
    load_checkpoint(tmp_path / "a.pt", World(), model=other, strict=False)  # matching keys only


def test_truncated_and_missing(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, World(), model=_net(), step=5)
    f = latest_checkpoint(tmp_path)
    assert f is not None and f.name == "ckpt-00000005.pt"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(tmp_path, World(), model=_net())
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nope.pt", World(), model=_net())
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "empty", World(), model=_net())


def test_unwritable_folder(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CheckpointError, match="could not write checkpoint"):
        save_checkpoint(blocker / "ckpts", World(), model=_net())


def _as_unprivileged(check) -> str:  # type: ignore[no-untyped-def]
    """Run `check()` in a forked child that dropped root (permission bits do not stop root;
    tests often run as root) and return what it returned or raised, as text."""
    import pwd

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(read)
            if os.geteuid() == 0:
                nobody = pwd.getpwnam("nobody")
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
            try:
                out = f"returned {check()!r}"
            except Exception as exc:
                out = f"{type(exc).__name__}: {exc}"
            os.write(write, out.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        text = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text
    return text


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork to drop privileges")
def test_read_only_folder_and_unreadable_file_without_root() -> None:
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="ddpguard-ro-", dir="/tmp"))
    try:
        base.chmod(0o755)  # pytest's tmp_path is private to root: the child could not enter
        ro = base / "ro"
        ro.mkdir(mode=0o555)
        ro.chmod(0o555)
        secret = base / "secret.pt"
        save_checkpoint(secret, World(), model=_net())
        secret.chmod(0o000)
        out = _as_unprivileged(lambda: (os.geteuid() != 0,
                                        save_checkpoint(ro, World(), model=_net())))
        assert out.startswith("CheckpointError: rank 0 could not write checkpoint"), out
        assert "writable" in out and not list(ro.iterdir())
        out = _as_unprivileged(lambda: load_checkpoint(secret, World(), model=_net()))
        assert out == f"CheckpointError: rank 0: cannot read checkpoint {secret}: permission denied"
    finally:
        for p in (base / "ro", base / "secret.pt"):
            p.chmod(0o700)
        import shutil

        shutil.rmtree(base)


def _unwritable_on_ranks(world: World, folder: str) -> str:
    try:
        save_checkpoint(folder, world, model=prepare_model(_net(), world), timeout=30)
    except CheckpointError as exc:
        return str(exc)
    return "saved"


def test_write_failure_reaches_every_rank(two_rank_runs: tuple[Path, list[dict]]) -> None:
    msgs = [r["unwritable"] for r in two_rank_runs[1]]
    assert "could not write" in msgs[0] and msgs[1].startswith("rank 1: rank 0 could not write")


_SAVER = """
import sys, torch
from torch import nn
from ddpguard.checkpoint import save_checkpoint
from ddpguard.world import World
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(12)])  # ~12 MB per file
step = 0
while True:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(step))
    save_checkpoint(sys.argv[1], World(), model=model, step=step, keep_last=2)
    print(step, flush=True)
    step += 1
"""


# One process imports torch once and forks each writer (a process of its own, SIGKILLed by
# pid), instead of one `import torch` per writer; it reaps each writer before the next. Its
# writes are slowed so that the kills land mid-write far more often than not.
_ZYGOTE = _SAVER.split("torch.manual_seed(0)")[0] + """
import io, os, time
real_save = torch.save
def slow_save(obj, f):  # a slower disk (~0.2 s a file): most kills land mid-write
    buf = io.BytesIO()
    real_save(obj, buf)
    data = buf.getvalue()
    for i in range(0, len(data), 1 << 16):
        f.write(data[i:i + (1 << 16)])
        time.sleep(0.001)
torch.save = slow_save
for target in sys.stdin:
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        print("pid", os.getpid(), flush=True)
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(12)])  # ~12 MB per file
        step = 0
        while True:
            with torch.no_grad():
                for p in model.parameters():
                    p.fill_(float(step))
            save_checkpoint(target.strip(), World(), model=model, step=step, keep_last=2)
            print(step, flush=True)
            step += 1
    _, status = os.waitpid(pid, 0)
    print("exit", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_kill_during_save_leaves_loadable_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "ck"
    zygote = subprocess.Popen([sys.executable, "-c", _ZYGOTE], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert zygote.stdin is not None and zygote.stdout is not None
    try:
        for delay in (0.05, 0.13, 0.29):
            zygote.stdin.write(f"{target}\n")
            zygote.stdin.flush()
            word, pid = zygote.stdout.readline().split()
            assert word == "pid"
            zygote.stdout.readline()  # one complete checkpoint exists
            time.sleep(delay)       # then kill at an arbitrary point, usually mid-write
            os.kill(int(pid), signal.SIGKILL)  # our own grandchild, by pid
            while not (line := zygote.stdout.readline()).startswith("exit"):
                assert line  # the writer is reaped before the next one starts
            assert line.split() == ["exit", str(-signal.SIGKILL)]
            _check_after_kill(target)
    finally:
        zygote.kill()  # our own child, by pid
        zygote.wait(timeout=30)
        zygote.stdin.close()
        zygote.stdout.close()
    # The next save removes what the killed writer left.
    save_checkpoint(target, World(), model=_net(), step=10**6, keep_last=2)
    assert not [p for p in target.iterdir() if ".tmp" in p.name]


def _check_after_kill(target: Path) -> None:
    """What a writer killed at any point leaves in `target`."""
    model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(12)])
    info = load_checkpoint(target, World(), model=model)
    # The loaded file is whole: every parameter holds the value of the step it names.
    assert float(model[0].weight.detach()[0, 0]) == float(info["step"])
    # Only whole checkpoints under real names; at most the killed writer's temp file
    # (dot-named `.ckpt-N.pt.tmp@...`: a "*.pt" glob would never see it).
    names = sorted(p.name for p in target.iterdir())
    temps = [n for n in names if re.fullmatch(r"\.ckpt-\d{8}\.pt\.tmp@.+", n)]
    ckpts = [n for n in names if re.fullmatch(r"ckpt-\d{8}\.pt", n)]
    assert sorted(temps + ckpts) == names and len(temps) <= 1 and len(ckpts) <= 3, names


def _nan_on_rank1(world: World) -> str:
    watch = LossWatch(world, every=4)
    updates = 0  # counted here, not read from the watch's private state
    try:
        for step in range(12):
            bad = world.rank == 1 and step == 5
            updates += 1
            watch.update(torch.tensor(float("nan") if bad else 1.0), step)
        watch.flush()
    except FloatingPointError as exc:
        return f"{updates}: {exc}"
    return "no error"


def test_nan_loss_stops_every_rank_together(two_rank_runs: tuple[Path, list[dict]]) -> None:
    a, b = [r["nan"] for r in two_rank_runs[1]]
    # Both stop at the same check (after step 7, the second check) naming step 5 and rank 1.
    assert a.startswith("8: ") and b.startswith("8: ")
    assert "at step 5" in a and "first seen on rank 1" in a and "at step 5" in b


def test_rank_failure_type_is_exported() -> None:
    assert issubclass(RankFailure, AssertionError)
