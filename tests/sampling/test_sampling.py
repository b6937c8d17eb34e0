"""EvenSampler / TokenBatchSampler: rank arithmetic checked in one process, up to 64 ranks."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpguard.sampling import (
    EvenSampler,
    TokenBatchSampler,
    num_real_for_rank,
    per_rank_count,
    permute,
    plan_token_batches,
    rank_indices,
)

FAST = settings(max_examples=40, deadline=None)


@FAST
@given(n=st.integers(1, 3000), seed=st.integers(-(2**63), 2**64), epoch=st.integers(0, 10**6))
def test_permutation_is_a_bijection(n, seed, epoch):
    assert sorted(permute(np.arange(n), n, seed, epoch).tolist()) == list(range(n))


def test_permutation_differs_per_epoch_and_seed_and_is_deterministic():
    n = 10_000
    a, b = permute(np.arange(n), n, 0, 0), permute(np.arange(n), n, 0, 1)
    assert (a != b).mean() > 0.99
    assert (a != permute(np.arange(n), n, 1, 0)).mean() > 0.99
    assert np.array_equal(a, permute(np.arange(n), n, 0, 0))
    # Not close to the identity: positions move about n/3 on average for a random order.
    assert abs(np.abs(a - np.arange(n)).mean() / n - 1 / 3) < 0.02


@FAST
@given(n=st.integers(1, 500), world=st.integers(1, 64), seed=st.integers(0, 99),
       tail=st.sampled_from(["pad", "drop"]))
def test_epoch_covers_dataset_at_up_to_64_ranks(n, world, seed, tail):
    per_rank = [rank_indices(n, r, world, 3, seed, tail=tail) for r in range(world)]
    assert {len(p) for p in per_rank} == {per_rank_count(n, world, tail)}
    seen = Counter(i for p in per_rank for i in p.tolist())
    if tail == "drop":
        assert max(seen.values(), default=1) == 1
        assert n - len(seen) <= world - 1
    else:
        assert set(seen) == set(range(n))
        # Repeats are exactly the positions flagged as padding, which form each rank's suffix.
        real = [num_real_for_rank(n, r, world, tail) for r in range(world)]
        assert sum(real) == n
        assert Counter(i for r, p in enumerate(per_rank) for i in p[: real[r]].tolist()) == \
            Counter(range(n))


@FAST
@given(n=st.integers(1, 400), w1=st.integers(1, 16), w2=st.integers(1, 16),
       frac=st.floats(0, 1), tail=st.sampled_from(["pad", "drop"]))
def test_resume_on_another_world_size_loses_and_repeats_nothing(n, w1, w2, frac, tail):
    samplers = [EvenSampler(n, w1, r, seed=5, tail=tail) for r in range(w1)]
    used = int(len(samplers[0]) * frac)
    consumed: Counter[int] = Counter()
    for s in samplers:
        it = iter(s)
        got = [next(it) for _ in range(used)]
        consumed.update(got[: s.num_real])
        next(it, None)  # the DataLoader prefetched beyond what training used
    state = json.loads(json.dumps(samplers[-1].state_dict(consumed=used)))
    resumed = [EvenSampler(n, w2, r, seed=5, tail=tail) for r in range(w2)]
    for s in resumed:
        s.load_state_dict(state)
    assert len({len(s) for s in resumed}) == 1
    if resumed[0].epoch == 1:  # nothing of epoch 0 was left for w2 ranks
        assert resumed[0].start_position == 0
        assert n - sum(consumed.values()) <= max(w1, w2) - 1
        return
    for s in resumed:
        consumed.update(list(s)[: s.num_real])
    assert max(consumed.values(), default=1) == 1
    if tail == "pad":
        assert len(consumed) == n
    else:
        assert n - len(consumed) <= max(w1, w2) - 1


def test_epoch_advances_by_itself_and_set_epoch_wins():
    s = EvenSampler(100, 4, 1, seed=3)
    e0, e1 = list(s), list(s)
    assert e0 == rank_indices(100, 1, 4, 0, 3).tolist()
    assert e1 == rank_indices(100, 1, 4, 1, 3).tolist() and e0 != e1
    s.set_epoch(7)
    assert list(s) == rank_indices(100, 1, 4, 7, 3).tolist() and s.epoch == 7
    s.set_epoch(7)
    assert list(s) == rank_indices(100, 1, 4, 7, 3).tolist()
    assert s.epoch == 7 and (list(s), s.epoch)[1] == 8


def test_resume_then_normal_epochs_and_len():
    s = EvenSampler(103, 2, 0, seed=1)
    it = iter(s)
    for _ in range(10):
        next(it)
    state = s.state_dict()
    assert state["position"] == 20 and state["epoch"] == 0
    r = EvenSampler(103, 4, 3, seed=1)
    r.load_state_dict(state)
    assert len(r) == per_rank_count(103, 4, "pad", 20) == 21
    r.set_epoch(0)  # the usual loop calls set_epoch(start_epoch): the resume is kept
    part = list(r)
    assert part == rank_indices(103, 3, 4, 0, 1, start=20).tolist()
    assert len(r) == 21
    full = list(r)
    assert r.epoch == 1 and len(full) == len(r) == 26


def test_is_padding_and_num_real():
    s = EvenSampler(10, 4, 3, shuffle=False)
    assert list(s) == [3, 7, 1] and s.num_real == 2
    assert s.positions().tolist() == [3, 7, 11]
    assert s.is_padding(11) is True and s.is_padding(9) is False
    assert s.is_padding(s.positions()).tolist() == [False, False, True]
    tiny = [EvenSampler(2, 5, r, tail="pad") for r in range(5)]
    assert {len(t) for t in tiny} == {1} and sum(t.num_real for t in tiny) == 2


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"length": 0}, "length"),
        ({"length": 2.5}, "length"),
        ({"length": 10, "num_replicas": 2, "rank": 2}, "rank 2"),
        ({"length": 10, "tail": "wrap"}, "tail"),
        ({"length": 10, "num_replicas": 0, "rank": 0}, "num_replicas"),
    ],
)
def test_even_bad_input(kwargs, match):
    kwargs.setdefault("num_replicas", 1)
    kwargs.setdefault("rank", 0)
    with pytest.raises(ValueError, match=match):
        EvenSampler(**kwargs)


def test_even_state_from_another_dataset_or_seed_is_refused():
    state = EvenSampler(10, 1, 0, seed=1).state_dict()
    with pytest.raises(ValueError, match="length=10"):
        EvenSampler(11, 1, 0, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=1"):
        EvenSampler(10, 1, 0, seed=2).load_state_dict(state)


def test_world_size_from_defaults_without_process_group():
    s = EvenSampler(10)
    assert (s.num_replicas, s.rank) == (1, 0) and len(s) == 10


# ---- TokenBatchSampler ---------------------------------------------------------------------

def _lognormal(n, seed=0):
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(200), 0.8, n)), 1, 2048).astype(np.int64)


@FAST
@given(n=st.integers(1, 300), world=st.integers(1, 64), seed=st.integers(0, 50),
       max_tokens=st.integers(50, 3000), window=st.integers(1, 64),
       max_samples=st.one_of(st.none(), st.integers(1, 8)))
def test_token_batches_equal_per_rank_and_within_budget(n, world, seed, max_tokens, window,
                                                        max_samples):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 400, n)
    if max_tokens < lengths.min():
        max_tokens = int(lengths.min())
    samplers = [TokenBatchSampler(lengths, max_tokens, world, r, seed=seed, window=window,
                                  max_samples=max_samples) for r in range(world)]
    batches = [list(s) for s in samplers]
    assert len({len(b) for b in batches}) == 1 and len(batches[0]) == len(samplers[0]) >= 1
    seen: Counter[int] = Counter()
    for r, bs in enumerate(batches):
        for k, b in enumerate(bs):
            assert b and len(b) * lengths[b].max() <= max_tokens
            assert max_samples is None or len(b) <= max_samples
            if not samplers[r].is_padding_batch(k):
                seen.update(b)
    skipped = int((lengths > max_tokens).sum())
    assert samplers[0].skipped == skipped
    assert set(seen) == set(np.flatnonzero(lengths <= max_tokens).tolist())
    assert max(seen.values()) == 1
    kept = n - skipped
    if kept >= -(-samplers[0].plan().num_batches // world) * world:
        assert not samplers[0].plan().padding.any()


def test_token_plan_waste_and_speed_on_lognormal():
    lengths = _lognormal(200_000)
    plan = plan_token_batches(lengths, 16384, 8, 0, 0)
    assert plan.padding_waste < 0.05
    assert plan.num_batches % 8 == 0 and not plan.padding.any()
    again = plan_token_batches(lengths, 16384, 8, 0, 0)
    assert np.array_equal(plan.order, again.order)
    other = plan_token_batches(lengths, 16384, 8, 1, 0)
    assert not np.array_equal(plan.order, other.order)


def test_token_skips_and_max_length():
    lengths = [5, 50, 7, 100, 3]
    s = TokenBatchSampler(lengths, 60, 1, 0, max_length=40)
    assert s.skipped == 2
    assert sorted(i for b in s for i in b) == [0, 2, 4]


def test_token_epochs_and_resume_same_world_only():
    lengths = _lognormal(3000, 1)
    s = TokenBatchSampler(lengths, 4096, 2, 1, seed=9, window=256)
    e0 = list(s)
    it = iter(s)
    first = [next(it) for _ in range(5)]
    next(it)
    state = json.loads(json.dumps(s.state_dict(consumed=5)))
    assert state["epoch"] == 1 and state["batch_offset"] == 5
    r = TokenBatchSampler(lengths, 4096, 2, 1, seed=9, window=256)
    r.load_state_dict(state)
    rest = list(r)
    full = TokenBatchSampler(lengths, 4096, 2, 1, seed=9, window=256)
    full.set_epoch(1)
    assert first + rest == list(full) != e0
    assert len(list(r)) == len(r) and r.epoch == 2
    with pytest.raises(ValueError, match="num_replicas=2"):
        TokenBatchSampler(lengths, 4096, 4, 1, seed=9, window=256).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        TokenBatchSampler(lengths, 4096, 2, 1, seed=8, window=256).load_state_dict(state)
    with pytest.raises(ValueError, match="length"):
        TokenBatchSampler(lengths[:-1], 4096, 2, 1, seed=9).load_state_dict(state)


@pytest.mark.parametrize(
    "lengths, max_tokens, match",
    [
        ([], 10, "non-empty"),
        ([1, -2], 10, r"lengths\[1\] = -2"),
        ([1.5, 2], 10, "integers"),
        (["a"], 10, "integers"),
        ([20, 30], 10, "shortest sample"),
    ],
)
def test_token_bad_input(lengths, max_tokens, match):
    with pytest.raises(ValueError, match=match):
        TokenBatchSampler(lengths, max_tokens, 1, 0)


def test_token_rank_out_of_range():
    with pytest.raises(ValueError, match="rank 3"):
        TokenBatchSampler([1, 2], 10, 2, 3)
