"""JsonlDataset: map-style dataset over plain-text JSONL files through memory-mapped indexes.

Memory per process does not grow with the number of records: the offsets (and lengths) are
`numpy.memmap`s shared through the page cache, and each process reads a record with one
`os.pread` on its own lazily opened file handle (never a descriptor inherited across a fork).
Compressed files are refused, not half-supported.
"""

from __future__ import annotations

import bisect
import contextlib
import glob
import json
import mmap
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data

from .index import (
    DEFAULT_LOCK_TIMEOUT,
    LENGTHS_MAGIC,
    OFFSETS_MAGIC,
    DatasetError,
    ensure_array,
)

try:  # orjson is an optional speed-up (extra "fast"); the standard library is the fallback
    import orjson

    _loads: Callable[[bytes], Any] = orjson.loads
    _DECODE_ERRORS: tuple[type[BaseException], ...] = (orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads
    _DECODE_ERRORS = (ValueError,)

OFFSETS_SUFFIX = ".idx"
LENGTHS_SUFFIX = ".len"
LengthKey = str | Callable[[Any], int]


def resolve_paths(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """A path, a glob, or a list of either -> the files, in a fixed (sorted per glob) order."""
    items = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    if not items:
        raise DatasetError("JsonlDataset needs at least one path, got an empty list")
    out: list[str] = []
    for item in items:
        s = os.fspath(item)
        if glob.has_magic(s):
            found = sorted(glob.glob(s))
            if not found:
                raise FileNotFoundError(f"{s}: the pattern matches no file")
            out.extend(found)
        else:
            out.append(s)
    return out


def build_offsets(path: str | os.PathLike[str], *, force: bool = False,
                  lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> tuple[Path, np.memmap, bool]:
    """Open (building if missing or stale) the offset index of one JSONL file."""
    from .scan import scan_offsets

    return ensure_array(path, OFFSETS_SUFFIX, magic=OFFSETS_MAGIC, dtype="<i8", key="offsets",
                        fill=lambda f, st: scan_offsets(path, f, st.st_size) + 1,
                        force=force, lock_timeout=lock_timeout)


def length_key_name(length_key: LengthKey) -> str:
    if isinstance(length_key, str):
        return f"field:{length_key}"
    return "fn:" + getattr(length_key, "__qualname__", type(length_key).__name__)


def _length_of(record: Any, length_key: LengthKey) -> int:
    if callable(length_key):
        return int(length_key(record))
    if not isinstance(record, dict):
        raise TypeError(f"record is a {type(record).__name__}, not an object")
    value = record[length_key]
    if isinstance(value, bool) or not isinstance(value, str | list | int):
        raise TypeError(f"field {length_key!r} is a {type(value).__name__}; "
                        "need a string, a list or an integer")
    return value if isinstance(value, int) else len(value)


def build_lengths(path: str | os.PathLike[str], offsets: np.ndarray, length_key: LengthKey, *,
                  force: bool = False, lock_timeout: float = DEFAULT_LOCK_TIMEOUT
                  ) -> tuple[Path, np.memmap, bool]:
    """Open (building if missing or stale) the int32 length sidecar of one JSONL file. The
    sidecar is keyed by the field name or the callable's qualified name: a different key
    rebuilds it. Malformed and non-object records get length 0 (they are refused or replaced
    when read)."""

    def fill(f: Any, st: os.stat_result) -> int:
        n = len(offsets) - 1
        out = np.zeros(n, dtype="<i4")
        with open(path, "rb") as src, mmap.mmap(src.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            for i in range(n):
                try:
                    rec = _loads(mm[offsets[i]:offsets[i + 1]])
                except _DECODE_ERRORS:
                    continue
                if isinstance(length_key, str) and not isinstance(rec, dict):
                    continue  # not an object: refused or replaced when read, like bad JSON
                try:
                    length = _length_of(rec, length_key)
                except (KeyError, TypeError) as exc:
                    raise DatasetError(
                        f"{path}: record {i} has no usable length ({exc!r}) for length key "
                        f"{length_key_name(length_key)!r}") from exc
                if not 0 <= length < 2**31:
                    raise DatasetError(f"{path}: record {i} length {length} out of int32 range")
                out[i] = length
        f.write(out.tobytes())
        return n

    return ensure_array(path, LENGTHS_SUFFIX, magic=LENGTHS_MAGIC, dtype="<i4",
                        key=length_key_name(length_key), fill=fill, force=force,
                        lock_timeout=lock_timeout)


def _random_access(arr: np.memmap) -> np.ndarray:
    """A plain ndarray view of a memmap (cheaper to index), advised for random access so the
    kernel does not read ahead around each touched page (that would grow RSS for nothing)."""
    mm = getattr(arr, "_mmap", None)
    if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        with contextlib.suppress(OSError):
            mm.madvise(mmap.MADV_RANDOM)
    return arr.view(np.ndarray)


class JsonlDataset(torch.utils.data.Dataset[Any]):
    """Records of one or many JSONL files, indexed once per file and node.

    on_error="raise": a malformed record raises DatasetError naming file, line and its first
    bytes. on_error="skip": it is replaced by the next good record (i+1, i+2, ... wrapping),
    a rule that depends only on the file contents, so every rank makes the same replacement
    and does the same number of steps; `skipped_count` counts replacements in this process.
    """

    def __init__(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                 transform: Callable[[Any], Any] | None = None, on_error: str = "raise",
                 require_object: bool = True, length_key: LengthKey | None = None,
                 lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.paths = resolve_paths(paths)
        self.transform = transform
        self.on_error = on_error
        self.require_object = require_object
        self.length_key = length_key
        self.lock_timeout = lock_timeout
        self.skipped_count = 0
        self._stats: list[tuple[int, int]] = []
        counts = []
        for p in self.paths:
            _, off, _ = build_offsets(p, lock_timeout=lock_timeout)
            if len(off) < 2:
                raise DatasetError(f"{p}: holds only blank lines; a dataset needs records")
            st = os.stat(p)
            self._stats.append((st.st_size, st.st_mtime_ns))
            counts.append(len(off) - 1)
        cum = np.cumsum([0, *counts]).tolist()
        self._starts: list[int] = cum[:-1]  # plain ints: bisect beats numpy for one lookup
        self._n: int = cum[-1]
        self._open_arrays()

    # -- process-local state: memmaps and file handles are reopened, never pickled --------
    def _open_arrays(self) -> None:
        self._offsets: list[np.ndarray] = []
        self._lengths: list[np.memmap] | None = [] if self.length_key is not None else None
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()
        for p, st in zip(self.paths, self._stats, strict=True):
            self._check_unchanged(p, st)
            _, off, _ = build_offsets(p, lock_timeout=self.lock_timeout)
            self._offsets.append(_random_access(off))
            if self._lengths is not None:
                assert self.length_key is not None
                _, ln, _ = build_lengths(p, off, self.length_key, lock_timeout=self.lock_timeout)
                self._lengths.append(ln)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for k in ("_offsets", "_lengths", "_fds", "_pid", "_lengths_cat"):
            state.pop(k, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_arrays()

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", {}).values():
            with contextlib.suppress(OSError):
                os.close(fd)

    @staticmethod
    def _check_unchanged(path: str, st: tuple[int, int]) -> None:
        now = os.stat(path)
        if (now.st_size, now.st_mtime_ns) != st:
            raise DatasetError(f"{path}: changed after it was indexed (size/mtime differ); "
                               "recreate the dataset (it re-indexes) and do not modify data "
                               "files during training")

    def _fd(self, file_no: int) -> int:
        if self._pid != os.getpid():  # forked: descriptors of the parent are not ours
            self._fds, self._pid = {}, os.getpid()
        fd = self._fds.get(file_no)
        if fd is None:
            fd = os.open(self.paths[file_no], os.O_RDONLY)
            self._fds[file_no] = fd
        return fd

    # -- the Dataset protocol ---------------------------------------------------------
    def __len__(self) -> int:
        return self._n

    @property
    def lengths(self) -> np.ndarray:
        """Per-record lengths (memmap for one file, concatenated for several)."""
        if self._lengths is None:
            raise DatasetError("no length sidecar: create the dataset with length_key=...")
        if len(self._lengths) == 1:
            return self._lengths[0]
        cat = getattr(self, "_lengths_cat", None)
        if cat is None:
            cat = self._lengths_cat = np.concatenate(self._lengths)
        return cat

    def locate(self, index: int) -> tuple[int, int]:
        """Global record index -> (file number, record number within that file)."""
        n = self._n
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"record {index} out of range for a dataset of {n} records")
        if len(self._starts) == 1:  # the common case pays no search
            return 0, index
        f = bisect.bisect_right(self._starts, index) - 1
        return f, index - self._starts[f]

    def raw(self, index: int) -> bytes:
        """The bytes of one record (with any blank lines after it), read with one pread."""
        f, j = self.locate(index)
        start, end = self._offsets[f][j:j + 2].tolist()
        data = os.pread(self._fd(f), end - start, start)
        if len(data) != end - start:
            self._check_unchanged(self.paths[f], self._stats[f])
        return data

    def _parse(self, index: int) -> Any:
        data = self.raw(index)
        try:
            rec = _loads(data)
        except _DECODE_ERRORS as exc:
            raise self._record_error(index, data, f"malformed JSON ({exc})") from None
        if self.require_object and not isinstance(rec, dict):
            raise self._record_error(index, data, f"valid JSON but a {type(rec).__name__}, "
                                     "not an object (pass require_object=False to allow it)")
        return rec

    def _record_error(self, index: int, data: bytes, what: str) -> DatasetError:
        f, j = self.locate(index)
        path = self.paths[f]
        self._check_unchanged(path, self._stats[f])
        line = self._line_number(f, int(self._offsets[f][j]))
        return RecordError(f"{path}, line {line} (record {index}): {what}; "
                            f"first bytes: {data[:80]!r}")

    def _line_number(self, file_no: int, offset: int) -> int:
        """1-based line of a byte offset; counts newlines before it (error path only)."""
        count, pos, fd = 0, 0, self._fd(file_no)
        while pos < offset:
            block = os.pread(fd, min(64 << 20, offset - pos), pos)
            if not block:
                break
            count += block.count(b"\n")
            pos += len(block)
        return count + 1

    def __getitem__(self, index: int) -> Any:
        try:
            rec = self._parse(index)
        except RecordError:
            if self.on_error == "raise":
                raise
            rec = self._replacement(index)
        if self.transform is None:
            return rec
        try:
            return self.transform(rec)
        except Exception as exc:
            f, j = self.locate(index)
            line = self._line_number(f, int(self._offsets[f][j]))
            raise DatasetError(f"{self.paths[f]}, line {line} (record {index}): transform "
                               f"{getattr(self.transform, '__qualname__', self.transform)!r} "
                               f"failed: {exc!r}") from exc

    def _replacement(self, index: int) -> Any:
        n = len(self)
        index %= n
        for step in range(1, n):
            try:
                rec = self._parse((index + step) % n)
            except RecordError:
                continue
            self.skipped_count += 1
            return rec
        raise DatasetError(f"{self.paths}: no record parses; nothing can replace record {index}")


class RecordError(DatasetError):
    """One record is malformed (bad JSON, or not an object where one is required)."""
