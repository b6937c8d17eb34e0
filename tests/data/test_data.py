"""JsonlDataset and its offset index: real files, real processes, real locks."""

from __future__ import annotations

import fcntl
import io
import json
import multiprocessing as mp
import os
import pickle
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from ddpguard.cli import main as cli_main
from ddpguard.data import (
    DatasetError,
    JsonlDataset,
    RecordError,
    StaleIndexError,
    build_lengths,
    build_offsets,
)
from ddpguard.data import index as idx
from ddpguard.data.jsonl import LENGTHS_SUFFIX, OFFSETS_SUFFIX
from ddpguard.data.scan import scan_offsets
from tests.helpers import run_cli


def write_lines(path: Path, lines: list[str], *, trailing_newline: bool = True) -> Path:
    path.write_bytes(("\n".join(lines) + ("\n" if trailing_newline else "")).encode())
    return path


def reference_offsets(data: bytes) -> list[int]:
    """Python reference: start of each non-blank line, then the file size."""
    out, pos = [], 0
    for line in data.split(b"\n"):
        if line.strip():
            out.append(pos)
        pos += len(line) + 1
    return [*out, len(data)]


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1 << 20])
@pytest.mark.parametrize("threads", [1, 3])
def test_scan_matches_reference_across_chunk_boundaries(tmp_path, chunk, threads):
    rng = random.Random(chunk)
    parts = []
    for i in range(300):
        kind = rng.random()
        if kind < 0.1:
            parts.append(rng.choice(["", " ", "\r", "  \t "]))  # blank lines are not records
        else:
            parts.append(json.dumps({"i": i, "t": "x" * rng.randint(0, 40)}) +
                         ("\r" if kind > 0.9 else ""))
    for trailing in (True, False):
        p = write_lines(tmp_path / f"f{trailing}.jsonl", parts, trailing_newline=trailing)
        data = p.read_bytes()
        out = io.BytesIO()
        n = scan_offsets(p, out, len(data), chunk_bytes=chunk, threads=threads)
        got = np.frombuffer(out.getvalue(), dtype="<i8").tolist()
        assert got == reference_offsets(data)
        assert n == len(got) - 1


def test_scan_refuses_a_file_that_changes_size(tmp_path):
    p = write_lines(tmp_path / "w.jsonl", [json.dumps({"i": i}) for i in range(1000)])
    size = p.stat().st_size
    with pytest.raises(idx.DatasetError, match=r"w\.jsonl: changed while being indexed"):
        scan_offsets(p, io.BytesIO(), size + 100, chunk_bytes=256)  # shorter than recorded
    with pytest.raises(idx.DatasetError, match=r"size was 10, now"):
        scan_offsets(p, io.BytesIO(), 10, chunk_bytes=256)  # grew after the stat


def test_records_blank_lines_crlf_and_no_trailing_newline(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'\n{"a": 1}\n\n  \n{"a": 2}\r\n{"a": 3}')
    ds = JsonlDataset(p)
    assert len(ds) == 3
    assert [ds[i]["a"] for i in range(3)] == [1, 2, 3]
    assert ds[-1] == {"a": 3}
    with pytest.raises(IndexError, match="out of range"):
        ds[3]
    assert (tmp_path / ("a.jsonl" + OFFSETS_SUFFIX)).exists()


def test_multi_file_and_glob_concatenate_in_order(tmp_path):
    for f in range(3):
        write_lines(tmp_path / f"part{f}.jsonl",
                    [json.dumps({"f": f, "j": j}) for j in range(f + 2)])
    ds = JsonlDataset(str(tmp_path / "part*.jsonl"))
    want = [(f, j) for f in range(3) for j in range(f + 2)]
    assert len(ds) == len(want)
    assert [(ds[i]["f"], ds[i]["j"]) for i in range(len(ds))] == want
    assert ds.locate(2) == (1, 0)
    same = JsonlDataset([tmp_path / "part0.jsonl", str(tmp_path / "part[12].jsonl")])
    assert [same[i] for i in range(len(same))] == [ds[i] for i in range(len(ds))]


def test_index_reused_then_rebuilt_when_stale(tmp_path):
    p = write_lines(tmp_path / "a.jsonl", ['{"v": 1}', '{"v": 2}'])
    _, off, built = build_offsets(p)
    assert built and len(off) == 3
    _, _, built = build_offsets(p)
    assert not built  # valid index: reused, not rescanned
    write_lines(p, ['{"v": 1}', '{"v": 2}', '{"v": 3}'])
    _, off, built = build_offsets(p)
    assert built and len(off) == 4
    os.utime(p, ns=(1, 1))  # same content, other mtime: still stale, never trusted
    assert build_offsets(p)[2]


def test_index_copied_from_another_file_is_refused_then_rebuilt(tmp_path):
    a = write_lines(tmp_path / "a.jsonl", ['{"v": 1}', '{"v": 2}'])
    b = write_lines(tmp_path / "b.jsonl", ['{"w": 1}', '{"w": 2}'])
    os.utime(b, ns=(a.stat().st_atime_ns, a.stat().st_mtime_ns))  # same size and mtime
    where_a, _, _ = build_offsets(a)
    copy = tmp_path / ("b.jsonl" + OFFSETS_SUFFIX)
    copy.write_bytes(where_a.read_bytes())
    st = b.stat()
    want = idx.expected_header(b, st, magic=idx.OFFSETS_MAGIC, dtype="<i8", key="offsets")
    with pytest.raises(StaleIndexError, match=r"b\.jsonl\.idx.*src_name"):
        idx.open_array(copy, want)
    assert JsonlDataset(b)[0] == {"w": 1}  # the dataset rebuilds it instead of trusting it
    (tmp_path / "junk.idx").write_bytes(b"x" * 200)
    with pytest.raises(StaleIndexError, match="not a ddpguard index"):
        idx.read_header(tmp_path / "junk.idx")


def test_file_changed_after_indexing_is_an_error_naming_it(tmp_path):
    p = write_lines(tmp_path / "a.jsonl", ['{"v": 1}', '{"v": 2}', '{"v": 3}'])
    ds = JsonlDataset(p)
    assert ds[1] == {"v": 2}
    p.write_bytes(b'{"x":[1, 2, 3, 4, 5, 6]}\n')
    with pytest.raises(DatasetError, match=r"a\.jsonl: changed after it was indexed"):
        ds[2]
    with pytest.raises(DatasetError, match="changed after it was indexed"):
        pickle.loads(pickle.dumps(ds))  # a worker starting now refuses too


def test_bad_inputs_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        JsonlDataset(tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError, match="matches no file"):
        JsonlDataset(str(tmp_path / "*.nothing"))
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(DatasetError, match=r"empty\.jsonl: file is empty"):
        JsonlDataset(tmp_path / "empty.jsonl")
    (tmp_path / "blank.jsonl").write_bytes(b"\n \n\r\n")
    with pytest.raises(DatasetError, match=r"blank\.jsonl: holds only blank lines"):
        JsonlDataset(tmp_path / "blank.jsonl")
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError, match=r"d: is a directory"):
        JsonlDataset(tmp_path / "d")
    import gzip
    (tmp_path / "z.jsonl.gz").write_bytes(gzip.compress(b'{"a": 1}\n'))
    with pytest.raises(DatasetError, match="gzip-compressed; only plain-text"):
        JsonlDataset(tmp_path / "z.jsonl.gz")
    with pytest.raises(ValueError, match="on_error"):
        JsonlDataset(tmp_path / "blank.jsonl", on_error="ignore")


def test_malformed_record_raise_names_file_line_and_bytes(tmp_path):
    p = write_lines(tmp_path / "bad.jsonl", ['{"v": 0}', "", '{"v": 1}', '{"v": oops}', "[1, 2]"])
    ds = JsonlDataset(p)
    with pytest.raises(RecordError, match=r"bad\.jsonl, line 4 \(record 2\): malformed JSON.*"
                                          r"first bytes: b'\{\"v\": oops\}"):
        ds[2]
    with pytest.raises(RecordError, match=r"line 5 \(record 3\): valid JSON but a list"):
        ds[3]
    assert JsonlDataset(p, require_object=False, on_error="skip")[3] == [1, 2]


def test_transform_failure_names_file_and_line(tmp_path):
    p = write_lines(tmp_path / "t.jsonl", ['{"text": "a"}', '{"other": 1}'])
    ds = JsonlDataset(p, transform=lambda r: r["text"].upper())
    assert ds[0] == "A"
    with pytest.raises(DatasetError, match=r"t\.jsonl, line 2 \(record 1\): transform.*KeyError"):
        ds[1]


def test_skip_replaces_deterministically_and_counts(tmp_path):
    lines = [json.dumps({"v": i}) if i % 4 else "{bad" for i in range(12)]
    lines[11] = "not json"  # last record wraps around to the first good one
    p = write_lines(tmp_path / "s.jsonl", lines)
    a, b = JsonlDataset(p, on_error="skip"), JsonlDataset(p, on_error="skip")
    got = [a[i] for i in range(len(a))]
    assert got == [b[i] for i in reversed(range(len(b)))][::-1]  # order of access irrelevant
    assert got[0] == {"v": 1} and got[4] == {"v": 5} and got[11] == {"v": 1}
    assert a.skipped_count == 4 and b.skipped_count == 4
    assert all(r is not None for r in got)


def test_lengths_sidecar_field_and_callable(tmp_path):
    recs = [{"text": "a" * n, "toks": list(range(n % 5))} for n in (3, 0, 7, 12)]
    p = write_lines(tmp_path / "l.jsonl", [json.dumps(r) for r in recs] + ["", "{bad"])
    ds = JsonlDataset(p, length_key="text", on_error="skip")
    assert isinstance(ds.lengths, np.memmap) and ds.lengths.dtype == np.int32
    assert ds.lengths.tolist() == [3, 0, 7, 12, 0]  # malformed record: length 0
    assert (tmp_path / ("l.jsonl" + LENGTHS_SUFFIX)).exists()
    ds2 = JsonlDataset(p, length_key=lambda r: len(r["toks"]), on_error="skip")
    assert ds2.lengths.tolist() == [3, 0, 2, 2, 0]  # other key: sidecar rebuilt, not reused
    _, off, _ = build_offsets(p)
    _, _, built = build_lengths(p, off, "text")
    assert built  # the callable's sidecar replaced the field one
    with pytest.raises(DatasetError, match="no length sidecar"):
        _ = JsonlDataset(p, on_error="skip").lengths
    with pytest.raises(DatasetError, match=r"l\.jsonl: record 0 has no usable length"):
        build_lengths(p, off, "missing_field", force=True)


def test_multi_file_lengths_concatenate(tmp_path):
    for f in range(2):
        write_lines(tmp_path / f"m{f}.jsonl", [json.dumps({"t": "x" * (f * 10 + j)})
                                               for j in range(3)])
    ds = JsonlDataset(str(tmp_path / "m*.jsonl"), length_key="t")
    assert ds.lengths.tolist() == [0, 1, 2, 10, 11, 12]


def _mod100(record: dict) -> int:
    return record["i"] % 100


def test_pickled_dataset_is_small_and_reopens(tmp_path):
    p = write_lines(tmp_path / "big.jsonl", [json.dumps({"i": i}) for i in range(20000)])
    ds = JsonlDataset(p, length_key=_mod100)
    ds[5]  # opens a descriptor, which must not travel
    blob = pickle.dumps(ds)
    assert len(blob) < 4000  # offsets are memory-mapped again, never copied into the pickle
    clone = pickle.loads(blob)
    assert clone[19999] == {"i": 19999} and clone.lengths[150] == 50


def _readonly_child(path: str, cache: str, q: mp.Queue) -> None:  # type: ignore[type-arg]
    """Forked: drop root's privileges (root writes into read-only folders), then index."""
    try:
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)  # nobody: from here on folder permissions apply
        os.environ["DDPGUARD_CACHE"] = cache
        first = build_offsets(path)
        record = JsonlDataset(path)[0]
        q.put((str(first[0]), first[2], record, build_offsets(path)[2], None))
    except BaseException as exc:
        q.put((None, None, None, None, repr(exc)))


def test_readonly_folder_falls_back_to_cache():
    # Not tmp_path: pytest's base folder is private to root, and the child runs as nobody.
    base = Path(tempfile.mkdtemp(prefix="ddpguard-ro-"))
    data, cache = base / "data", base / "cache"
    try:
        base.chmod(0o755)
        data.mkdir()
        cache.mkdir(mode=0o777)
        cache.chmod(0o777)
        p = write_lines(data / "r.jsonl", ['{"v": 1}'])
        p.chmod(0o644)
        data.chmod(0o555)
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        child = ctx.Process(target=_readonly_child, args=(str(p), str(cache), q))
        child.start()
        where, built, record, built_again, error = q.get(timeout=60)
        child.join(30)
        q.close()
        q.join_thread()
        assert error is None, error
        assert child.exitcode == 0
        assert built and Path(where).is_relative_to(cache / "index")
        assert not (data / ("r.jsonl" + OFFSETS_SUFFIX)).exists()
        assert record == {"v": 1}
        assert not built_again  # found in the cache the second time
    finally:
        if data.exists():
            data.chmod(0o755)
        shutil.rmtree(base)


def _build_in_child(path: str, q: mp.Queue) -> None:  # type: ignore[type-arg]
    _, off, built = build_offsets(path)
    q.put((built, len(off)))


def test_one_builder_per_node_others_wait_and_reuse(tmp_path):
    p = write_lines(tmp_path / "c.jsonl", [json.dumps({"i": i, "pad": "y" * 50})
                                           for i in range(200000)])
    # Forked, not spawned: three processes of their own contend for the lock all the same,
    # without each importing this module again.
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_build_in_child, args=(str(p), q)) for _ in range(3)]
    for pr in procs:
        pr.start()
    results = [q.get(timeout=120) for _ in procs]
    for pr in procs:
        pr.join(30)
    assert sorted(r[0] for r in results) == [False, False, True]
    assert {r[1] for r in results} == {200001}
    q.close()
    q.join_thread()


def _hold_lock_then_die(lock: str, ready: mp.Event) -> None:  # type: ignore[type-arg]
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    time.sleep(600)


def test_lock_wait_is_bounded_and_survives_a_dead_builder(tmp_path):
    p = write_lines(tmp_path / "w.jsonl", ['{"v": 1}'])
    lock = tmp_path / ("w.jsonl" + OFFSETS_SUFFIX + ".lock")
    ctx = mp.get_context("fork")  # a process of its own all the same, without the re-import
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_lock_then_die, args=(str(lock), ready), daemon=True)
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(TimeoutError, match=r"waited 0 s for .*w\.jsonl\.idx\.lock"):
            build_offsets(p, lock_timeout=0.3)
    finally:
        holder.kill()  # a builder that dies: the kernel drops its flock
        holder.join(30)
    _, off, built = build_offsets(p, lock_timeout=30)
    assert built and len(off) == 2


def test_cli_index_prints_throughput_and_fails_clearly(tmp_path, capsys):
    p = write_lines(tmp_path / "cli.jsonl", [json.dumps({"text": "ab" * i}) for i in range(50)])
    r = run_cli("index", str(p), "--length-field", "text", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "records" in r.stdout and "MB/s" in r.stdout and " 50 " in r.stdout
    assert (tmp_path / ("cli.jsonl" + LENGTHS_SUFFIX)).exists()
    # The rest in this process: the entry point is proven above, the command's output and exit
    # code come from the same main().
    assert cli_main(["index", str(p)]) == 0
    again = capsys.readouterr()
    assert "up to date" in again.out
    assert cli_main(["index", str(p), str(tmp_path / "nope.jsonl")]) == 1
    assert "nope.jsonl: no such file" in capsys.readouterr().err
