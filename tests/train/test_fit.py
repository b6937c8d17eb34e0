"""fit(): config validation, training on real ranks, and kill-and-resume under torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from helpers import child_env, computed_once
from torch import nn

from ddpguard.testing import run_ranks
from ddpguard.train import FitConfig, fit
from ddpguard.world import World


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="epochs"):
        FitConfig(epochs=0)
    with pytest.raises(ValueError, match="exactly one of batch_size"):
        FitConfig(batch_size=None)
    with pytest.raises(ValueError, match="exactly one of batch_size"):
        FitConfig(batch_size=4, max_tokens=100)
    with pytest.raises(ValueError, match="resume=True needs checkpoint_dir"):
        FitConfig(resume=True)
    with pytest.raises(ValueError, match="accumulate"):
        FitConfig(accumulate=0)
    with pytest.raises(ValueError, match="precision"):
        FitConfig(precision="half")


def test_global_batch_config_validation() -> None:
    FitConfig(global_batch_size=64, micro_batch_size=8, baseline_batch_size=256, lr_rule="sqrt")
    with pytest.raises(ValueError, match="global_batch_size must be a positive integer"):
        FitConfig(global_batch_size=0)
    with pytest.raises(ValueError, match="micro_batch_size=8 needs global_batch_size"):
        FitConfig(micro_batch_size=8)
    with pytest.raises(ValueError, match="accumulate=2 with global_batch_size=64"):
        FitConfig(global_batch_size=64, accumulate=2)
    with pytest.raises(ValueError, match="does not combine with max_tokens"):
        FitConfig(global_batch_size=64, batch_size=None, max_tokens=100)
    with pytest.raises(ValueError, match="lr_rule='linear' needs baseline_batch_size"):
        FitConfig(global_batch_size=64, lr_rule="linear")
    with pytest.raises(ValueError, match="lr_rule must be"):
        FitConfig(global_batch_size=64, lr_rule="cube")


class _Linear(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """y = x @ w + noise; the same on every rank."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.01 * torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _mse(module: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return (module(x)[:, 0] - y) ** 2


def _train(world: World, folder: str, resume: bool) -> dict[str, object]:
    torch.manual_seed(0)
    cfg = FitConfig(epochs=3, batch_size=8, accumulate=2, checkpoint_dir=folder,
                    checkpoint_every=5, resume=resume, log_csv=f"{folder}/log.csv",
                    progress=False, nan_check_every=3)
    res = fit(nn.Linear(4, 1), _Linear(203), _mse,
              lambda ps: torch.optim.SGD(ps, lr=0.05), config=cfg, eval_data=_Linear(61),
              world=world)
    return {"steps": res.steps, "eval": res.eval_loss, "samples": res.samples,
            "resumed": res.resumed_from}


def _two_rank_runs(world: World, folder: str) -> dict[str, object]:
    """This module's fit() runs on real ranks, one after the other on one group (a group start
    costs seconds per rank): train, then resume after the end, then the batch-plan run, then
    the NaN run last (it stops fit with an error)."""
    import torch.distributed as dist

    train = _train(world, folder, False)
    dist.barrier()
    # The folder as the first run left it, before the resume writes to it again.
    train["files"] = sorted(p.name for p in Path(folder).glob("ckpt-*.pt"))
    train["log_rows"] = (Path(folder) / "log.csv").read_text().splitlines()
    dist.barrier()
    return {"train": train, "resume": _train(world, folder, True),
            "lr": _lr_and_syncs(world), "nan": _nan_on_rank1(world)}


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    def job(folder: Path) -> tuple[Path, list[dict]]:
        return folder, run_ranks(_two_rank_runs, 2, args=(str(folder),), timeout=180)

    return computed_once(tmp_path_factory, "train-fit", job)


def test_fit_trains_evaluates_checkpoints_and_resumes(
        two_rank_runs: tuple[Path, list[dict]]) -> None:
    _, ranks = two_rank_runs
    a, b = [r["train"] for r in ranks]
    # 203 samples -> 102 per rank (one padding duplicate), batches of 8 -> 13 micro-batches,
    # accumulate 2 -> 7 optimizer steps per epoch (the short last group still syncs).
    assert a["steps"] == b["steps"] == 21
    assert a["eval"] == b["eval"]
    ev = [loss for _, loss in a["eval"]]
    assert ev[-1] < ev[0] * 0.5
    assert a["samples"] == 3 * 102
    names = a["files"]  # as the first run left the folder
    assert names == ["ckpt-00000020.pt", "ckpt-00000021.pt"]  # keep_last=2
    rows = a["log_rows"]
    assert rows[0].startswith("kind,epoch,step") and len(rows) == 1 + 21 + 3
    # Resume after the end: nothing left to do, the step count is kept.
    c, _ = [r["resume"] for r in ranks]
    assert c["steps"] == 21 and c["resumed"].endswith("ckpt-00000021.pt")


def _lr_and_syncs(world: World) -> dict[str, object]:
    """fit() with a global batch of 16 over 2 ranks in micro-batches of 4 (2 accumulation
    steps), lr_rule="linear" from a baseline of 4 (factor 4), and a decaying scheduler. Records
    the learning rate each optimizer step used and DDP's gradient all-reduces per micro-batch."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    syncs = [0]
    hooked: list[object] = []
    lrs: list[float] = []
    after: list[int] = []

    def counting(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects str annotations
        syncs[0] += 1
        return allreduce_hook(state, bucket)

    def loss_fn(module: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if not hooked:  # the DDP wrapper fit built: count its gradient all-reduces
            module.register_comm_hook(None, counting)  # type: ignore[operator]
            hooked.append(module)
        return _mse(module, batch)

    def on_batch(epoch: int, step: int, batch: object) -> None:
        after.append(syncs[0])
        lrs.append(opt.param_groups[0]["lr"])  # what the next optimizer.step() will use

    cfg = FitConfig(epochs=1, global_batch_size=16, micro_batch_size=4, baseline_batch_size=4,
                    lr_rule="linear", progress=False, shuffle=False)
    res = fit(net, _Linear(64), loss_fn, opt, config=cfg, scheduler=sched, world=world,
              on_batch=on_batch)
    return {"steps": res.steps, "after": after, "lrs": lrs, "wrapped": type(hooked[0]).__name__}


def test_fit_rescales_lr_in_optimizer_and_scheduler_and_syncs_once_per_step(
        two_rank_runs: tuple[Path, list[dict]]) -> None:
    for r in [ranks["lr"] for ranks in two_rank_runs[1]]:
        assert r["wrapped"] == "DistributedDataParallel"
        # 64 samples, 32 per rank, micro-batches of 4: 8 micro-batches, 4 optimizer steps; DDP
        # all-reduces (one bucket) only on the second micro-batch of each step.
        assert r["steps"] == 4
        assert r["after"] == [0, 1, 1, 2, 2, 3, 3, 4]
        # lr 0.01 x (16 / 4) = 0.04, then the scheduler decays from the rescaled base.
        used = r["lrs"][1::2]
        assert used == pytest.approx([0.04, 0.02, 0.04 / 3, 0.01]), r["lrs"]


def _nan_on_rank1(world: World) -> dict[str, object]:
    from ddpguard.metrics import NonFiniteLossError

    calls = [0]

    def loss_fn(module: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        calls[0] += 1
        loss = _mse(module, batch)
        if world.rank == 1 and calls[0] == 3:  # step 2 (0-based) goes bad on rank 1 only
            loss = loss * float("nan")
        return loss

    # Checked every 4 steps: by then the NaN has reached rank 0's weights through the gradient
    # all-reduce, and the report must still name rank 1, where it started.
    cfg = FitConfig(epochs=2, batch_size=4, nan_check_every=4, progress=False)
    try:
        fit(nn.Linear(4, 1), _Linear(64), loss_fn, lambda ps: torch.optim.SGD(ps, lr=0.01),
            config=cfg, world=world)
    except NonFiniteLossError as exc:
        return {"error": str(exc), "calls": calls[0]}
    return {"error": None, "calls": calls[0]}


def test_nan_on_one_rank_stops_every_rank_together(
        two_rank_runs: tuple[Path, list[dict]]) -> None:
    r0, r1 = [ranks["nan"] for ranks in two_rank_runs[1]]
    for r in (r0, r1):
        assert r["error"] is not None, "fit finished all 16 steps despite a NaN loss"
        assert "at step 2 (first seen on rank 1)" in r["error"], r["error"]
    # Both stop at the first check after it, long before the 16 steps of 2 epochs.
    assert r0["calls"] == r1["calls"] == 4


_KILLED_SCRIPT = r'''
import json, os, signal, sys
import torch
from torch import nn
from ddpguard.train import FitConfig, fit

out = sys.argv[1]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
rank = int(os.environ["RANK"])
torch.set_num_threads(1)

class Ids(torch.utils.data.Dataset):
    def __len__(self):
        return 200
    def __getitem__(self, i):
        return torch.tensor([float(i)])

ledger = open(f"{out}/ledger-{rank}-{attempt}.jsonl", "a")

def on_batch(epoch, step, batch):
    ledger.write(json.dumps([epoch, step, [int(v) for v in batch[:, 0]]]) + "\n")
    ledger.flush()
    if attempt == 0 and rank == 1 and epoch == 1 and step >= 20:
        os.kill(os.getpid(), signal.SIGKILL)  # mid-epoch, two steps after a checkpoint

def loss_fn(module, batch):
    return (module(batch / 200.0)[:, 0] - 1.0) ** 2

import ddpguard
# The restarted attempt re-forms its group on the agent's surviving store (keys per attempt).
world = ddpguard.init(init_timeout=60, timeout=60)
torch.manual_seed(0)
cfg = FitConfig(epochs=3, batch_size=8, num_workers=1, checkpoint_dir=f"{out}/ck",
                checkpoint_every=3, resume=True, progress=False, keep_last=5)
res = fit(nn.Linear(1, 1), Ids(), loss_fn, lambda p: torch.optim.SGD(p, lr=0.1), config=cfg,
          on_batch=on_batch, world=world)
ddpguard.shutdown(world)
json.dump({"resumed": res.resumed_from, "steps": res.steps},
          open(f"{out}/result-{rank}-{attempt}.json", "w"))
'''


def test_sigkill_mid_epoch_then_resume_consumes_every_sample_once(tmp_path: Path) -> None:
    script = tmp_path / "train_killed.py"
    script.write_text(_KILLED_SCRIPT)
    # A new session so that on a timeout the whole tree (agent and ranks) is stopped, by its id.
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--max-restarts=1", "--monitor-interval=0.5", str(script), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(),
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail("torchrun with a killed rank did not finish in 240 s:\n" + stderr[-5000:])
    assert proc.returncode == 0, stdout[-3000:] + stderr[-5000:]
    results = [json.loads((tmp_path / f"result-{r}-1.json").read_text()) for r in range(2)]
    assert not (tmp_path / "result-1-0.json").exists()  # attempt 0 really was killed
    resumed = Path(results[0]["resumed"]).name
    assert resumed == "ckpt-00000018.pt", resumed  # the last checkpoint before the kill
    resume_step = int(resumed[5:13])
    assert all(r["steps"] == 3 * 13 for r in results)  # 200/2 = 100 per rank, 13 batches
    per_epoch: dict[int, Counter[int]] = {0: Counter(), 1: Counter(), 2: Counter()}
    for rank in range(2):
        for attempt in range(2):
            path = tmp_path / f"ledger-{rank}-{attempt}.jsonl"
            for line in path.read_text().splitlines():
                epoch, step, ids = json.loads(line)
                # Work of the killed attempt after the checkpoint it resumes from is redone.
                if attempt == 0 and step >= resume_step:
                    continue
                per_epoch[epoch].update(ids)
    for epoch, seen in per_epoch.items():
        assert sorted(seen) == list(range(200)), f"epoch {epoch}: missing or extra samples"
        repeated = [k for k, v in seen.items() if v > 1]
        assert not repeated, f"epoch {epoch}: repeated {repeated[:10]}"
