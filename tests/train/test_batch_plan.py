"""Batch planning: exact splits, refusals with nearest valid choices, agreed OOM fallback."""

from __future__ import annotations

import pytest

from ddpguard.batch_plan import BatchPlan, find_micro_batch, scaled_lr


@pytest.mark.parametrize("g", [1, 8, 12, 64, 96, 256, 1000])
@pytest.mark.parametrize("w", [1, 2, 4, 8, 64])
def test_every_valid_plan_multiplies_back_exactly(g, w):
    if g % w:
        with pytest.raises(ValueError, match=f"global_batch_size={g} samples cannot be split"):
            BatchPlan(g, w)
        return
    per_rank = g // w
    for m in range(1, per_rank + 1):
        if per_rank % m == 0:
            p = BatchPlan(g, w, m)
            assert p.world_size * p.accumulation_steps * p.micro == g
        else:
            with pytest.raises(ValueError, match=f"micro_batch_size={m} does not divide"):
                BatchPlan(g, w, m)


def test_refusal_names_nearest_valid_choices():
    with pytest.raises(ValueError, match=r"nearest valid global batch sizes: 96, 104"):
        BatchPlan(100, 8)
    with pytest.raises(ValueError, match=r"valid micro-batch sizes up to 5: 1, 2, 4"):
        BatchPlan(64, 4, 5)


@pytest.mark.parametrize("bad", [0, -3, 2.5, "8", True])
def test_bad_numbers_are_named(bad):
    with pytest.raises(ValueError, match="global_batch_size must be a positive integer"):
        BatchPlan(bad)  # type: ignore[arg-type]


def test_fitting_smaller_and_other_world_sizes():
    p = BatchPlan.fitting(256, 4, max_micro_batch=24)
    assert (p.micro, p.accumulation_steps) == (16, 4)
    s = p.smaller()
    assert (s.micro, s.accumulation_steps, s.global_batch_size) == (8, 8, 256)
    with pytest.raises(ValueError, match="cannot shrink the micro-batch below 1"):
        BatchPlan(12, 1, 1).smaller()
    q = p.for_world_size(8)
    assert (q.world_size, q.micro, q.accumulation_steps) == (8, 16, 2)
    assert p.for_world_size(1).accumulation_steps == 16
    assert p.describe() \
        == "global batch 256 samples = 4 rank(s) x 4 accumulation step(s) x micro-batch 16"
    assert BatchPlan(4096, 2, 1024, unit="tokens").accumulation_steps == 2


def test_lr_rescaling_note():
    lr, note = scaled_lr(0.1, 256, 1024)
    assert lr == 0.1
    assert "linear rule lr=0.4" in note and "square-root rule lr=0.2" in note
    assert scaled_lr(0.1, 256, 1024, "linear")[0] == pytest.approx(0.4)
    assert scaled_lr(0.1, 256, 64, "sqrt")[0] == pytest.approx(0.05)
    with pytest.raises(ValueError, match="rule must be"):
        scaled_lr(0.1, 256, 64, "cubic")


def test_single_process_oom_search():
    import torch

    tried = []

    def probe(micro):
        tried.append(micro)
        if micro > 3:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    plan = find_micro_batch(BatchPlan(64, 1), probe)
    assert tried == [64, 32, 16, 8, 4, 2] and plan.micro == 2 and plan.accumulation_steps == 32


def test_non_oom_errors_propagate():
    def probe(micro):
        raise KeyError("bug in user code")

    with pytest.raises(KeyError):
        find_micro_batch(BatchPlan(8, 1), probe)


def _oom_only_on_rank1(world):
    import torch

    def probe(micro):
        if world.rank == 1 and micro > 4:
            raise torch.OutOfMemoryError("simulated limit on rank 1")

    return find_micro_batch(BatchPlan(32, world.world_size), probe).state_dict()


def test_ranks_agree_when_only_one_runs_out_of_memory():
    from ddpguard.testing import run_ranks

    a, b = run_ranks(_oom_only_on_rank1, 2, timeout=90)
    assert a == b and a["micro_batch_size"] == 4 and a["global_batch_size"] == 32


def test_start_plan_clamps_caps_and_searches():
    from ddpguard.batch_plan import start_plan

    # A micro-batch chosen for 1 rank (16) still works on 4 ranks (per-rank batch 4).
    assert start_plan(16, 4, micro_batch_size=16).state_dict()["micro_batch_size"] == 4
    with pytest.raises(ValueError, match="micro_batch_size=3 does not divide"):
        start_plan(16, 2, micro_batch_size=3)
    assert start_plan(48, 2, max_micro_batch=5).micro == 4  # largest divisor of 24 <= 5
    import torch

    def probe(micro):
        if micro > 3:
            raise torch.OutOfMemoryError("simulated")

    plan = start_plan(48, 2, probe=probe)
    assert (plan.micro, plan.accumulation_steps) == (3, 8)


def test_rescale_lr_scales_groups_and_scheduler(monkeypatch, tmp_path):
    import torch

    # torch sets TORCHINDUCTOR_CACHE_DIR on the first optimizer of a process; undo it after.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    from ddpguard.batch_plan import rescale_lr

    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [p], "lr": 0.1}], lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    note = rescale_lr(opt, 256, 1024, "sqrt", sched)
    assert "linear rule lr=0.4" in note and "square-root rule lr=0.2" in note
    assert "using sqrt -> lr=0.2" in note
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2)
    assert sched.base_lrs == [pytest.approx(0.2)]
    keep = torch.optim.SGD([p], lr=0.1)
    assert "using none -> lr=0.1" in rescale_lr(keep, 256, 1024)
    assert keep.param_groups[0]["lr"] == 0.1


def test_make_probe_runs_a_real_micro_batch_and_drops_gradients():
    import torch

    from ddpguard.batch_plan import make_probe

    data = [(torch.randn(3), torch.randn(())) for _ in range(5)]
    model = torch.nn.Linear(3, 1)
    seen = []

    def loss_fn(m, batch):
        x, y = batch
        seen.append(len(x))
        return (m(x)[:, 0] - y) ** 2

    probe = make_probe(model, data, loss_fn)
    probe(8)  # more than the dataset: wraps around
    assert seen == [8] and all(p.grad is None for p in model.parameters())
