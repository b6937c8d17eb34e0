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
    envs = [child_env(**loopback_env(r, 2, port), TORCH_NCCL_DUMP_ON_TIMEOUT="0")
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
