"""make_loader: defaults, refusals, worker seeding, strict collate, and real gloo ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import computed_once
from torch.utils.data import Dataset, SequentialSampler

from ddpguard.data import JsonlDataset, NoneSampleError, make_loader, strict_collate, worker_seed
from ddpguard.testing import run_ranks


def jsonl(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(n)))
    return path


class Ids(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class NoneAt(Ids):
    def __getitem__(self, i: int) -> int | None:
        return None if i == 5 else i


class RandomDraw(Ids):
    """Returns (index, a draw from the worker's torch RNG, worker id)."""

    def __getitem__(self, i: int) -> tuple[int, int, int]:
        info = torch.utils.data.get_worker_info()
        return i, int(torch.randint(0, 2**30, ())), info.id if info else -1


def test_strict_collate_names_the_none_position():
    assert strict_collate([1, 2]).tolist() == [1, 2]
    with pytest.raises(NoneSampleError, match="position 1 of a batch of 3 is None"):
        strict_collate([1, None, 3])
    loader = make_loader(NoneAt(8), batch_size=4, shuffle=False, num_workers=0)
    with pytest.raises(NoneSampleError, match="position 1 of a batch of 4"):
        list(loader)


def test_refusals_are_clear():
    ds = Ids(10)
    with pytest.raises(ValueError, match="shuffle=True with a sampler"):
        make_loader(ds, batch_size=2, sampler=SequentialSampler(ds), shuffle=True)
    with pytest.raises(ValueError, match="shuffle=True with a sampler"):
        make_loader(ds, batch_sampler=[[0, 1]], shuffle=True)
    with pytest.raises(ValueError, match="needs batch_size"):
        make_loader(ds)
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        make_loader(ds, batch_size=0)
    with pytest.raises(ValueError, match="do not also pass"):
        make_loader(ds, batch_sampler=[[0, 1]], batch_size=2)
    with pytest.raises(ValueError, match="need num_workers > 0"):
        make_loader(ds, batch_size=2, num_workers=0, persistent_workers=True)
    with pytest.raises(ValueError, match="need num_workers > 0"):
        make_loader(ds, batch_size=2, num_workers=0, prefetch_factor=4)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pin_memory=True needs CUDA"):
            make_loader(ds, batch_size=2, pin_memory=True)


def test_defaults_without_a_process_group():
    ds = Ids(10)
    loader = make_loader(ds, batch_size=3, num_workers=0)
    assert loader.pin_memory is torch.cuda.is_available()
    first = torch.cat(list(loader)).tolist()
    assert sorted(first) == list(range(10)) and first != list(range(10))  # shuffled
    again = torch.cat(list(make_loader(ds, batch_size=3, num_workers=0))).tolist()
    assert again == first  # deterministic in the seed
    other = torch.cat(list(make_loader(ds, batch_size=3, num_workers=0, seed=1))).tolist()
    assert other != first
    plain = make_loader(ds, batch_size=4, shuffle=False, num_workers=0, drop_last=True)
    assert [b.tolist() for b in plain] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    workers = make_loader(ds, batch_size=2, num_workers=2, shuffle=False)
    assert workers.persistent_workers and workers.prefetch_factor == 2
    custom = make_loader(ds, batch_sampler=[[3, 1], [2]], num_workers=0)
    assert [b.tolist() for b in custom] == [[3, 1], [2]]


def test_worker_seed_is_pure_and_distinct_at_64_ranks():
    seeds = {worker_seed(7, e, r, w) for e in range(2) for r in range(64) for w in range(8)}
    assert len(seeds) == 2 * 64 * 8
    assert all(0 <= s < 2**63 for s in seeds)
    assert worker_seed(7, 1, 3, 2) == worker_seed(7, 1, 3, 2)
    assert worker_seed(7, 1, 3, 2) != worker_seed(8, 1, 3, 2)


def test_workers_are_seeded_from_seed_rank_and_worker_id(tmp_path):
    def draws(seed: int) -> dict[int, tuple[int, int]]:
        loader = make_loader(RandomDraw(8), batch_size=2, shuffle=False, num_workers=2,
                             seed=seed, persistent_workers=False)
        out = {}
        for idx, val, wid in loader:
            for i, v, w in zip(idx.tolist(), val.tolist(), wid.tolist(), strict=True):
                out[i] = (v, w)
        return out

    a, b, c = draws(0), draws(0), draws(1)
    assert a == b  # same seed: same draws, whatever the main process RNG state
    assert a != c
    by_worker = {w: v for v, w in a.values()}
    assert set(by_worker) == {0, 1}
    torch.manual_seed(0)
    expect = int(torch.randint(0, 2**30, ()))
    torch.manual_seed(worker_seed(0, 0, 0, 0))
    assert a[0][0] == int(torch.randint(0, 2**30, ())) and a[0][0] != expect


def test_jsonl_through_workers_sees_every_record_once(tmp_path):
    ds = JsonlDataset(jsonl(tmp_path / "w.jsonl", 103), transform=lambda r: r["i"])
    loader = make_loader(ds, batch_size=10, num_workers=2, multiprocessing_context="fork")
    got = torch.cat(list(loader)).tolist()
    assert sorted(got) == list(range(103))
    spawned = make_loader(JsonlDataset(tmp_path / "w.jsonl"), batch_size=50, num_workers=2,
                          multiprocessing_context="spawn", shuffle=False)
    assert torch.cat([b["i"] for b in spawned]).tolist() == list(range(103))


def _ranks_load(world, path: str, n: int) -> dict:
    ds = JsonlDataset(path)  # both ranks index concurrently: one builds, one waits
    loader = make_loader(ds, batch_size=4, num_workers=0, seed=3)
    ids = [b["i"].tolist() for b in loader]
    return {"batches": len(ids), "ids": [i for b in ids for i in b],
            "sampler": type(loader.sampler).__name__}


def _ranks_both(world, folder: str) -> dict:
    """This module's runs on one 2-rank group (a group start costs seconds per rank)."""
    return {"load": _ranks_load(world, f"{folder}/r.jsonl", 37),
            "explicit": _ranks_explicit_sampler(world, f"{folder}/e.jsonl")}


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory):
    def job(folder: Path) -> list[dict]:
        jsonl(folder / "r.jsonl", 37)
        jsonl(folder / "e.jsonl", 20)
        return run_ranks(_ranks_both, 2, args=(str(folder),), timeout=120)

    return computed_once(tmp_path_factory, "data-loader", job)


def test_two_ranks_get_an_even_sampler_and_equal_batches(two_rank_runs):
    n = 37
    r0, r1 = [r["load"] for r in two_rank_runs]
    assert r0["sampler"] == r1["sampler"] == "EvenSampler"
    assert r0["batches"] == r1["batches"]  # the property that keeps ranks in step
    assert set(r0["ids"]) | set(r1["ids"]) == set(range(n))


def _ranks_explicit_sampler(world, path: str) -> dict:
    from torch.utils.data.distributed import DistributedSampler

    ds = JsonlDataset(path)  # concurrent first use on both ranks: one builds, one waits
    sampler = DistributedSampler(ds, shuffle=False)
    loader = make_loader(ds, batch_size=5, sampler=sampler, num_workers=0)
    return {"rank": world.rank, "ids": [i for b in loader for i in b["i"].tolist()]}


def test_two_ranks_build_one_index_and_honour_an_explicit_sampler(two_rank_runs):
    r0, r1 = [r["explicit"] for r in two_rank_runs]
    assert r0["ids"] == list(range(0, 20, 2)) and r1["ids"] == list(range(1, 20, 2))
