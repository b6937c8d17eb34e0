"""GPU-only paths: SyncBatchNorm on CUDA through prepare_model, fp16/bf16 autocast with the
GradScaler through `Precision`, NCCL set-up, pinned memory in make_loader.

They run where CUDA is present and are skipped, with the reason, everywhere else (CI is CPU).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from torch import nn

from ddpguard.model import prepare_model, unwrap
from ddpguard.precision import Precision, resolve_precision
from ddpguard.testing import run_ranks
from ddpguard.world import World

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (SyncBatchNorm, AMP, NCCL, pinned memory)")

CUDA = torch.device("cuda", 0)


def _syncbn_on_cuda(world: World) -> dict[str, object]:
    # The harness forms a gloo group (its collectives accept CUDA tensors); both ranks share
    # GPU 0, which NCCL would refuse. What is tested is prepare_model on a CUDA world.
    world = dataclasses.replace(world, device=CUDA)
    torch.manual_seed(0)
    model = prepare_model(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)), world)
    x = torch.linspace(-3, 5, 16 * 3).reshape(16, 3)
    model(x[world.rank::2].to(CUDA)).sum().backward()  # each rank half of the global batch
    inner = unwrap(model)
    with torch.no_grad():  # reference: running mean after one step over the whole batch
        expected = 0.1 * inner[0](x.to(CUDA)).mean(0)
    return {"bn": type(inner[1]).__name__, "device": str(next(inner.parameters()).device),
            "mean_error": float((inner[1].running_mean - expected).abs().max())}


def test_prepare_model_converts_batchnorm_to_syncbatchnorm_on_cuda() -> None:
    for r in run_ranks(_syncbn_on_cuda, 2, timeout=180):
        assert r["bn"] == "SyncBatchNorm" and r["device"] == "cuda:0"
        # Statistics of the global batch, not of this rank's half.
        assert r["mean_error"] < 1e-4, r


def _step(prec: Precision, lin: nn.Linear, opt: torch.optim.Optimizer,
          poison: bool = False) -> torch.Tensor:
    x = torch.ones(8, 4, device=CUDA)
    with prec.autocast():
        out = lin(x)
    prec.backward(out.float().pow(2).mean())
    if poison:
        lin.weight.grad[0, 0] = float("inf")  # as an fp16 overflow would leave it
    prec.unscale_(opt)
    prec.step(opt)
    opt.zero_grad(set_to_none=True)
    return out


def test_fp16_autocast_with_grad_scaler() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(4, 4).to(CUDA)
    ref = nn.Linear(4, 4).to(CUDA)
    ref.load_state_dict(lin.state_dict())
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    prec = Precision("fp16", CUDA)
    assert prec.scaler is not None
    scale = prec.scaler.get_scale()
    out = _step(prec, lin, opt)
    assert out.dtype == torch.float16
    # A healthy step: unscaled gradients, so the update equals plain fp32 SGD (fp16 tolerance).
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref(torch.ones(8, 4, device=CUDA)).pow(2).mean().backward()
    ref_opt.step()
    assert torch.allclose(lin.weight, ref.weight, atol=1e-2)
    # An inf gradient: the step is skipped and the scale backs off.
    before = lin.weight.detach().clone()
    _step(prec, lin, opt, poison=True)
    assert torch.equal(lin.weight, before)
    assert prec.scaler.get_scale() == scale / 2


def test_bf16_autocast_without_scaler_and_auto_choice() -> None:
    bf16 = torch.cuda.is_bf16_supported()
    assert resolve_precision("auto", CUDA) == ("bf16" if bf16 else "fp16")
    if not bf16:
        pytest.skip("this GPU has no bf16")
    prec = Precision("bf16", CUDA)
    lin = nn.Linear(4, 4).to(CUDA)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    before = lin.weight.detach().clone()
    out = _step(prec, lin, opt)
    assert out.dtype == torch.bfloat16 and prec.scaler is None
    assert not torch.equal(lin.weight, before)


def test_single_process_nccl_init_binds_the_gpu(clean_env) -> None:
    import torch.distributed as dist

    import ddpguard as dg

    world = dg.init(backend="nccl")
    try:
        assert (world.backend, world.device) == ("nccl", CUDA)
        assert not dist.is_initialized()  # one rank: no group to form
        model = prepare_model(nn.Linear(2, 2), world)
        assert next(model.parameters()).device == CUDA and not isinstance(
            model, nn.parallel.DistributedDataParallel)
    finally:
        dg.shutdown(world)


_NCCL_PAIR = """
import json, os, torch, torch.distributed as dist, ddpguard as dg
world = dg.init(backend="nccl", init_timeout=120, timeout=60)
t = torch.ones(1, device=world.device) * (world.rank + 1)
dist.all_reduce(t)
print(json.dumps({"sum": t.item(), "device": str(world.device),
                  "aeh": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING"),
                  "dump": os.environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT")}), flush=True)
dg.shutdown(world)
"""


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per rank: 2 GPUs")
def test_two_rank_nccl_group_sets_defaults_but_keeps_the_users() -> None:
    from helpers import child_env

    from ddpguard.testing import free_port, loopback_env

    port = free_port()
    envs = [child_env(gpus=True, **loopback_env(r, 2, port), TORCH_NCCL_DUMP_ON_TIMEOUT="0")
            for r in range(2)]
    for env in envs:  # ddpguard's default must come from ddpguard, not from this machine
        env.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING", None)
        env.pop("NCCL_ASYNC_ERROR_HANDLING", None)
    procs = [subprocess.Popen([sys.executable, "-c", _NCCL_PAIR], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for env in envs]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for r, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, err[-3000:]
        got = json.loads(out.strip().splitlines()[-1])
        assert got == {"sum": 3.0, "device": f"cuda:{r}", "aeh": "3", "dump": "0"}


def test_make_loader_pins_memory_on_cuda() -> None:
    from ddpguard.data import make_loader

    data = [torch.tensor([float(i)]) for i in range(8)]
    for workers in (0, 1):
        loader = make_loader(data, batch_size=4, num_workers=workers, shuffle=False,
                             persistent_workers=False if workers else None)
        batches = list(loader)
        assert loader.pin_memory and len(batches) == 2
        assert all(b.is_pinned() for b in batches)


def test_fit_moves_cpu_batches_to_the_gpu_and_evaluates_there(clean_env) -> None:
    # A dataset of CPU tensors and a loss_fn that never calls .to(): fit() places each batch
    # (pinned by make_loader) on the world's device, in training and in evaluation.
    import ddpguard as dg
    from ddpguard.train import FitConfig, fit

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    data = list(zip(x, (x.sum(1, keepdim=True) > 0).float(), strict=True))

    def loss_fn(module: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        xb, yb = batch
        assert xb.device == CUDA, xb.device
        return nn.functional.binary_cross_entropy_with_logits(module(xb), yb,
                                                              reduction="none").mean(1)

    world = dg.init(backend="nccl")
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        cfg = FitConfig(epochs=3, batch_size=32, num_workers=1, progress=False, precision="off")
        res = fit(model, data, loss_fn, lambda p: torch.optim.Adam(p, lr=0.02), config=cfg,
                  eval_data=data, world=world)
    finally:
        dg.shutdown(world)
    assert res.steps == 24 and next(model.parameters()).device == CUDA
    first, last = res.eval_loss[0][1], res.eval_loss[-1][1]
    assert last < first < 1.0, res.eval_loss


def _demo(tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    from helpers import child_env, run_cli

    out = tmp_path / "demo"
    res = run_cli("demo", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                  "--epochs", "1", "--max-steps", "30", *extra, timeout=400,
                  env=child_env(gpus=True))
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-3000:])
    return res, json.loads((out / "summary.json").read_text())


def test_demo_trains_on_the_gpus_with_nccl(tmp_path) -> None:
    _, summary = _demo(tmp_path)
    assert summary["backend"] == "nccl" and summary["world_size"] == torch.cuda.device_count()
    assert summary["steps"] == 30


def test_demo_with_more_ranks_than_gpus_runs_on_the_cpu(tmp_path) -> None:
    n = torch.cuda.device_count() + 1
    res, summary = _demo(tmp_path, "--nproc-per-node", str(n))
    assert "NCCL needs one GPU per rank" in res.stdout
    assert summary["backend"] == "gloo" and summary["world_size"] == n


def test_readback_returns_gpu_values_one_push_late() -> None:
    from ddpguard.readback import Readback

    rb = Readback()
    assert rb.push("a", torch.tensor([1.0, 2.0], device=CUDA)) == []
    assert rb.push("b", torch.tensor([3.0], device=CUDA)) == [("a", [1.0, 2.0])]
    assert len(rb) == 1 and rb.wait_all() == [("b", [3.0])] and len(rb) == 0


def test_nan_check_on_the_gpu_reads_a_check_late_and_flush_at_once() -> None:
    from ddpguard.metrics import LossWatch, NonFiniteLossError

    world = dataclasses.replace(World(), device=CUDA)
    watch = LossWatch(world, every=2)
    watch.update(torch.tensor(float("nan"), device=CUDA), 0)
    watch.update(torch.tensor(1.0, device=CUDA), 1)  # a check: its copy is still on the way
    watch.update(torch.tensor(1.0, device=CUDA), 2)
    with pytest.raises(NonFiniteLossError, match="at step 0"):
        watch.update(torch.tensor(1.0, device=CUDA), 3)  # the next check reads it
    watch = LossWatch(world, every=100)
    watch.update(torch.tensor(float("inf"), device=CUDA), 7)
    with pytest.raises(NonFiniteLossError, match="at step 7"):
        watch.flush()


def test_checkpoint_rng_state_starts_no_cuda_in_a_cpu_job() -> None:
    # A CPU job on a GPU machine: saving must not start CUDA in it; a CUDA job's state is kept.
    code = ("import torch; from ddpguard.checkpoint import rng_state\n"
            "a = len(rng_state()['cuda']); b = torch.cuda.is_initialized()\n"
            "torch.ones(1, device='cuda'); c = len(rng_state()['cuda'])\n"
            "print(a, b, c)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "False", str(torch.cuda.device_count())]


def test_nccl_nan_check_is_reduced_on_the_device_and_read_a_check_late() -> None:
    # The NCCL path of the periodic check: the key is computed and all-reduced on the GPU and
    # read one check later. One GPU gives a one-rank NCCL group; the watch is told the job has
    # 2 ranks so that the step * world_size + rank key is exercised too.
    import torch.distributed as dist

    from ddpguard.metrics import LossWatch, NonFiniteLossError

    torch.cuda.set_device(CUDA)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=CUDA)
    try:
        world = World(world_size=2, rank=1, backend="nccl", device=CUDA)
        watch = LossWatch(world, every=2)
        calls = 0
        with pytest.raises(NonFiniteLossError, match=r"at step 4 \(first seen on rank 1\)"):
            for step in range(12):
                calls += 1
                bad = step == 4
                watch.update(torch.tensor(float("nan") if bad else 1.0, device=CUDA), step)
        assert calls == 8  # the check after the window holding step 4, then one check late
    finally:
        dist.destroy_process_group()
