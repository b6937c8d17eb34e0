"""prepare_model / unwrap / accumulate on real gloo ranks."""

from __future__ import annotations

import traceback
from typing import Any

import pytest
import torch
from helpers import computed_once
from torch import nn

from ddpguard.model import (
    UnusedParametersError,
    accumulate,
    accumulation_plan,
    prepare_model,
    to_device,
    unwrap,
    use_syncbn,
)
from ddpguard.precision import Precision, resolve_precision
from ddpguard.testing import run_ranks
from ddpguard.world import World


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(48, 6, generator=g), torch.randn(48, 1, generator=g)


def test_accumulation_plan_forces_sync_on_short_last_group() -> None:
    plans = [accumulation_plan(i, 4, 10) for i in range(10)]
    assert [p.sync for p in plans] == [False, False, False, True] * 2 + [False, True]
    assert [p.scale for p in plans[8:]] == [0.5, 0.5]
    assert all(p.scale == 0.25 for p in plans[:8])
    with pytest.raises(ValueError, match="every=0"):
        accumulation_plan(0, 0, 10)
    with pytest.raises(ValueError, match="outside an epoch"):
        accumulation_plan(10, 4, 10)


def test_single_process_returns_plain_model() -> None:
    net = _net()
    out = prepare_model(net, World())
    assert out is net and unwrap(out) is net
    assert isinstance(out[1], nn.BatchNorm1d)  # no SyncBatchNorm without a group


def _accum_vs_big_batch(world: World) -> dict[str, object]:
    x, y = _data()
    net = _net()
    net[1] = nn.Identity()  # BatchNorm statistics depend on the micro-batch; compare linear parts
    model = prepare_model(net, world)
    # This rank's 24 samples in 3 micro-batches of 8, one optimizer step.
    mine_x, mine_y = x[world.rank::2], y[world.rank::2]
    for i in range(3):
        with accumulate(model, i, every=3, epoch_length=3) as acc:
            loss = nn.functional.mse_loss(model(mine_x[i * 8:(i + 1) * 8]),
                                          mine_y[i * 8:(i + 1) * 8])
            (loss * acc.scale).backward()
        assert acc.sync == (i == 2)
    grads = [p.grad.clone() for p in unwrap(model).parameters()]
    # Reference: one process, the whole 48-sample batch at once.
    ref = _net()
    ref[1] = nn.Identity()
    nn.functional.mse_loss(ref(x), y).backward()
    diffs = [float((g - p.grad).abs().max()) for g, p in zip(grads, ref.parameters(), strict=True)]
    return {"max_diff": max(diffs), "ddp": type(model).__name__}


def test_accumulation_equals_one_large_batch(two_rank_checks: list[dict[str, Any]]) -> None:
    for r in [ranks["accum"] for ranks in two_rank_checks]:
        assert r["ddp"] == "DistributedDataParallel"
        assert r["max_diff"] < 1e-6, r


def _sync_counts(world: World, epoch_length: int, every: int) -> list[int]:
    """Gradient all-reduces DDP has issued after each micro-step of one epoch."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model = prepare_model(nn.Linear(6, 1), world)
    buckets: list[int] = [0]

    # No annotations: DDP compares them with dist.GradBucket, and this module's are strings.
    def counting(state, bucket):  # type: ignore[no-untyped-def]
        buckets[0] += 1
        return allreduce_hook(state, bucket)

    # The comm hook runs once per gradient bucket DDP all-reduces; a micro-step under no_sync
    # runs none. Averaging is linear, so gradients alone cannot tell one sync from k.
    model.register_comm_hook(None, counting)
    x, y = _data()
    after: list[int] = []
    for i in range(epoch_length):
        with accumulate(model, i, every=every, epoch_length=epoch_length) as acc:
            (nn.functional.mse_loss(model(x[i:i + 4]), y[i:i + 4]) * acc.scale).backward()
        after.append(buckets[0])
    return after


def test_one_gradient_sync_per_optimizer_step_and_at_epoch_end(
        two_rank_checks: list[dict[str, Any]]) -> None:
    # 10 micro-steps, groups of 4: syncs after micro-steps 3 and 7, and a forced one after 9
    # (the short last group). One bucket for this model, so one all-reduce per sync.
    for after in [ranks["syncs"] for ranks in two_rank_checks]:
        assert after == [0, 0, 0, 1, 1, 1, 1, 2, 2, 3]


def test_syncbatchnorm_decision() -> None:
    two = World(rank=0, world_size=2)
    gpu = World(rank=0, world_size=2, device=torch.device("cuda", 0))
    assert use_syncbn(_net(), gpu, "auto") is True
    assert use_syncbn(_net(), World(device=torch.device("cuda", 0)), "auto") is False  # 1 rank
    assert use_syncbn(nn.Linear(2, 2), gpu, "auto") is False  # no BatchNorm
    assert use_syncbn(_net(), two, "auto") is False  # CPU: torch has no SyncBatchNorm kernel
    with pytest.raises(ValueError, match="needs CUDA"):
        use_syncbn(_net(), two, True)
    with pytest.raises(ValueError, match="sync_batchnorm"):
        prepare_model(_net(), World(), sync_batchnorm="yes")


def _bn_cpu(world: World) -> str:
    model = prepare_model(_net(), world)
    x, _ = _data()
    model(x[:8]).sum().backward()
    return type(unwrap(model)[1]).__name__


def test_batchnorm_on_cpu_ranks_stays_and_trains(two_rank_checks: list[dict[str, Any]]) -> None:
    assert [ranks["bn"] for ranks in two_rank_checks] == ["BatchNorm1d", "BatchNorm1d"]


class _TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(4, 1)
        self.unused_head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _unused(world: World, find: bool) -> str:
    model = prepare_model(_TwoHeads(), world, find_unused_parameters=find)
    model(torch.randn(3, 4)).sum().backward()
    model(torch.randn(3, 4)).sum().backward()  # second step: the hook is gone either way
    return "ok"


def _raises_unused(world: World) -> str:
    """The traceback `_unused(world, False)` raises on this rank (the harness would report it)."""
    try:
        _unused(world, False)
    except UnusedParametersError:
        return traceback.format_exc()
    return "no error"


def _two_rank_checks(world: World) -> dict[str, Any]:
    """The multi-rank checks of this module on one group: DDP's first construction costs
    seconds per process, so one job instead of one per test. The unused-parameter error comes
    last: its DDP is left mid-reduction."""
    return {"accum": _accum_vs_big_batch(world), "syncs": _sync_counts(world, 10, 4),
            "bn": _bn_cpu(world), "unused_found": _unused(world, True),
            "unused_error": _raises_unused(world)}


@pytest.fixture(scope="module")
def two_rank_checks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return computed_once(tmp_path_factory, "train-model",
                         lambda _: run_ranks(_two_rank_checks, 2, timeout=120))


def test_unused_parameters_named_after_first_backward(
        two_rank_checks: list[dict[str, Any]]) -> None:
    for ranks in two_rank_checks:  # raised on every rank, as the harness reports it
        text = ranks["unused_error"]
        assert "UnusedParametersError" in text and "unused_head.weight" in text
        assert "find_unused_parameters=True" in text
        assert UnusedParametersError.__name__ in text
    assert [ranks["unused_found"] for ranks in two_rank_checks] == ["ok", "ok"]


def test_precision_defaults() -> None:
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == "off"
    assert resolve_precision("bf16", cpu) == "bf16"
    with pytest.raises(ValueError, match="fp16"):
        resolve_precision("fp16", cpu)
    with pytest.raises(ValueError, match="precision"):
        resolve_precision("fp8", cpu)
    p = Precision("bf16", cpu)
    lin = nn.Linear(4, 4)
    with p.autocast():
        out = lin(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16 and p.scaler is None


def test_to_device_moves_every_tensor_of_a_nested_batch() -> None:
    # The "meta" device stands in for a GPU: the same traversal, no GPU needed.
    from collections import UserDict, namedtuple

    pair = namedtuple("pair", "x y")
    meta = torch.device("meta")
    batch = {"ids": torch.ones(2, 3), "rest": [pair(torch.zeros(1), "label"), (torch.ones(1),)],
             "enc": UserDict({"mask": torch.ones(2)}), "n": 7}
    got = to_device(batch, meta)
    assert got["ids"].device == meta and got["n"] == 7
    assert isinstance(got["rest"], list) and isinstance(got["rest"][0], pair)
    assert got["rest"][0].x.device == meta and got["rest"][0].y == "label"
    assert isinstance(got["rest"][1], tuple) and got["rest"][1][0].device == meta
    assert isinstance(got["enc"], UserDict) and got["enc"]["mask"].device == meta
    assert batch["ids"].device.type == "cpu"  # the caller's batch is left as it was
    # On the CPU nothing is rebuilt or copied.
    assert to_device(batch, torch.device("cpu")) is batch


def test_to_device_keeps_container_types_and_lets_objects_move_themselves() -> None:
    import dataclasses
    from collections import defaultdict

    meta = torch.device("meta")

    @dataclasses.dataclass
    class Pair:
        x: torch.Tensor
        name: str

    class Encoding(dict):  # like a tokenizer's batch encoding: a dict with its own .to
        def to(self, device: torch.device) -> Encoding:
            out = Encoding({k: v.to(device) for k, v in self.items()})
            out.moved_itself = True  # type: ignore[attr-defined]
            return out

    class Fixed(tuple):  # built from positional fields, not from one iterable
        def __new__(cls, a: torch.Tensor, b: torch.Tensor) -> Fixed:
            return super().__new__(cls, (a, b))

    got = to_device(Pair(torch.ones(2), "p"), meta)
    assert isinstance(got, Pair) and got.x.device == meta and got.name == "p"
    dd = defaultdict(list, {"x": torch.ones(1)})
    got = to_device(dd, meta)
    assert isinstance(got, defaultdict) and got.default_factory is list
    assert got["x"].device == meta
    enc = Encoding({"ids": torch.ones(3)})
    got = to_device([enc], meta)[0]
    assert getattr(got, "moved_itself", False) and got["ids"].device == meta
    fixed = Fixed(torch.ones(1), torch.ones(1))
    assert to_device(fixed, meta) is fixed  # left as it is, never turned into a plain tuple
