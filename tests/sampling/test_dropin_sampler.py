"""ddpguard.DistributedSampler against torch's DistributedSampler, in one process, many shapes."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from torch.utils.data import DataLoader
from torch.utils.data import DistributedSampler as TorchSampler

import ddpguard as dg
from ddpguard.sampling import DistributedSampler, EvenSampler
from ddpguard.testing import loopback_env

SHAPES = [(n, w) for n in (1, 2, 3, 7, 10, 64, 101, 1003) for w in (1, 2, 3, 4, 8, 13)]


def _both(n: int, w: int, r: int, **kw: object) -> tuple[list[int], list[int], object, object]:
    ds = range(n)
    ours, theirs = DistributedSampler(ds, w, r, **kw), TorchSampler(ds, w, r, **kw)  # type: ignore
    return list(ours), list(theirs), ours, theirs


def test_import_line_is_the_only_change() -> None:
    assert dg.DistributedSampler is DistributedSampler
    s = dg.DistributedSampler(range(10), num_replicas=2, rank=1, shuffle=True, seed=0,
                              drop_last=False)
    assert len(DataLoader(range(10), batch_size=2, sampler=s)) == 3


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n, w", SHAPES)
def test_counts_len_and_coverage_match_torch(n: int, w: int, drop_last: bool) -> None:
    ours_all: Counter[int] = Counter()
    theirs_all: Counter[int] = Counter()
    for r in range(w):
        ours, theirs, o, t = _both(n, w, r, shuffle=True, seed=5, drop_last=drop_last)
        assert len(ours) == len(theirs) == len(o) == len(t)  # type: ignore[arg-type]
        assert (o.num_samples, o.total_size) == (t.num_samples, t.total_size)  # type: ignore
        ours_all.update(ours)
        theirs_all.update(theirs)
    # Same coverage: every sample once (drop_last=False: plus the first indices repeated),
    # so the multiset of how often each index appears is the same.
    assert sorted(ours_all.values()) == sorted(theirs_all.values())
    assert len(ours_all) == len(theirs_all)
    if not drop_last:
        assert set(ours_all) == set(range(n))


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n, w", SHAPES)
def test_unshuffled_is_identical_to_torch(n: int, w: int, drop_last: bool) -> None:
    for r in range(w):
        ours, theirs, _, _ = _both(n, w, r, shuffle=False, drop_last=drop_last)
        assert ours == theirs


def test_padding_repeats_the_epochs_first_indices_like_torch() -> None:
    # n=3 on 8 ranks: padding (5) exceeds n, torch repeats the list as often as needed.
    n, w = 3, 8
    ours = [list(DistributedSampler(range(n), w, r, seed=2)) for r in range(w)]
    first = [ours[r][0] for r in range(n)]  # positions 0..n-1 are the epoch's order
    for r in range(w):
        assert ours[r] == [first[r % n]]


def test_empty_dataset_like_torch() -> None:
    for drop_last in (False, True):
        s = DistributedSampler([], 2, 1, drop_last=drop_last)
        t = TorchSampler([], 2, 1, drop_last=drop_last)  # type: ignore[arg-type]
        assert len(s) == len(t) == 0 and list(s) == list(t) == []


@pytest.mark.parametrize("kw, match", [
    ({"num_replicas": 2, "rank": 2}, "Invalid rank 2"),
    ({"num_replicas": 2, "rank": -1}, "Invalid rank -1"),
    ({"num_replicas": 0, "rank": 0}, "num_replicas"),
    ({"num_replicas": 2, "rank": 0, "seed": 1.5}, "seed"),
])
def test_bad_rank_and_world_size_raise_value_error(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DistributedSampler(range(10), **kw)
    if "seed" not in kw and kw["num_replicas"]:
        with pytest.raises(ValueError, match="Invalid rank"):  # torch says the same
            TorchSampler(range(10), **kw)  # type: ignore[arg-type]


def test_world_from_launcher_variables_before_init(clean_env) -> None:
    s = DistributedSampler(range(10))
    assert (s.num_replicas, s.rank) == (1, 0)  # a plain `python script.py`
    for k, v in loopback_env(2, 4, 29500).items():
        clean_env.setenv(k, v)
    s = DistributedSampler(range(10))
    assert (s.num_replicas, s.rank, len(s)) == (4, 2, 3)


def test_epoch_advances_by_itself_and_set_epoch_wins() -> None:
    s = DistributedSampler(range(50), 2, 0, seed=1)
    e0, e1 = list(s), list(s)
    assert e0 != e1 and s.epoch == 1
    s.set_epoch(0)
    assert list(s) == e0
    s.set_epoch(0)
    assert list(s) == e0  # torch's loop `set_epoch(epoch)` every epoch behaves as in torch
    s.epoch = 1  # some scripts assign the attribute
    assert list(s) == e1


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n, w1, w2, used", [
    (1003, 4, 4, 100), (1003, 4, 2, 37), (1003, 2, 3, 250), (101, 3, 8, 5), (64, 8, 1, 3),
    (7, 2, 4, 3),
])
def test_interrupted_and_resumed_equals_uninterrupted(n, w1, w2, used, drop_last) -> None:
    epoch = 3
    whole = []  # the uninterrupted epoch on w1 ranks, real samples only
    whole_ranks: list[list[int]] = []
    before = []
    states = set()
    for r in range(w1):
        s = DistributedSampler(range(n), w1, r, seed=9, drop_last=drop_last)
        s.set_epoch(epoch)
        full = list(s)
        whole_ranks.append(full)
        whole += full[: s.num_real]
        s.set_epoch(epoch)
        it = iter(s)
        before += [next(it) for _ in range(used)]
        next(it, None)  # prefetched by a DataLoader, never trained on
        state = s.state_dict(consumed=used)
        states.add(json.dumps(state, sort_keys=True))  # JSON-able, the same on every rank
    assert len(states) == 1
    state = json.loads(states.pop())
    assert state["version"] == 1 and state["kind"] == "DistributedSampler"
    after = []
    for r in range(w2):
        s = DistributedSampler(range(n), w2, r, seed=9, drop_last=drop_last)
        s.load_state_dict(state)
        start_epoch = s.epoch  # the next epoch when this one was used up
        assert start_epoch == epoch + (used == len(whole_ranks[0]))
        if start_epoch == epoch:
            s.set_epoch(start_epoch)  # the usual loop: keeps the resume point
            after += list(s)[: s.num_real]
    got = Counter(before + after)
    if w1 == w2:
        assert got == Counter(whole)  # exactly the uninterrupted epoch
    assert max(got.values()) == 1  # nothing repeated
    if drop_last:
        assert n - sum(got.values()) < max(w1, w2)
    else:
        assert set(got) == set(range(n))  # nothing lost


def test_same_world_resume_continues_each_ranks_sequence() -> None:
    n, w, used = 1003, 4, 40
    for r in range(w):
        s = DistributedSampler(range(n), w, r, seed=4)
        full = list(s)
        s.set_epoch(0)
        it = iter(s)
        for _ in range(used):
            next(it)
        t = DistributedSampler(range(n), w, r, seed=4)
        t.load_state_dict(s.state_dict())
        assert len(t) == len(full) - used
        assert list(t) == full[used:]
        nxt = list(t)
        assert len(nxt) == len(t) == len(full) and nxt != full  # the next epoch: whole, new


def test_state_is_interchangeable_with_even_sampler_and_checked() -> None:
    s = DistributedSampler(range(20), 2, 0, seed=3)
    e = EvenSampler(20, 2, 0, seed=3)
    e.load_state_dict(s.state_dict())
    s.load_state_dict(e.state_dict())
    with pytest.raises(ValueError, match="length=20"):
        DistributedSampler(range(21), 2, 0, seed=3).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="DistributedSampler state"):
        s.load_state_dict({"kind": "Other", "version": 1})


def test_memory_is_constant_at_any_length() -> None:
    import tracemalloc

    tracemalloc.start()
    try:
        s = DistributedSampler(range(10**12), 8, 3, seed=1)
        it = iter(s)
        first = [next(it) for _ in range(1000)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(s) == 125_000_000_000 and len(set(first)) == 1000
    assert peak < 64 * 2**20  # one chunk of 65,536 indices, not 10**12
