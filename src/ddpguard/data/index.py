"""Offset index and length sidecar for JSONL files: a small binary header, then a flat array.

Layout (little endian, 128-byte header so the array that follows is 8-byte aligned):

    magic     8s   b"DDPGIDX\\0" (offsets) or b"DDPGLEN\\0" (lengths)
    version   u4   FORMAT_VERSION
    dtype     4s   numpy dtype string of the array, e.g. b"<i8"
    count     u8   number of array entries (offsets: records + 1 end offset)
    src_size  u8   size in bytes of the source file when indexed
    src_mtime i8   st_mtime_ns of the source file when indexed
    src_name  48s  basename of the source file (utf-8, truncated): catches an index copied
                   next to another file of the same size and mtime
    key       40s  what the array holds (lengths: the field or callable name)

Offsets: record i spans bytes [off[i], off[i+1]) of the source; blank lines are not records
(they are folded into the span of the record before them, where the JSON parser skips them
as whitespace). An index whose size, mtime, name or key disagrees with the source is stale:
it is rebuilt, never trusted.

One builder per node: builders take an exclusive `fcntl.flock` on `<index>.lock`. Other
processes (ranks, workers) poll the same lock, then re-check the index and use it. No
collective is involved, so no process-group timeout can fire while a long file is scanned.
flock is released by the kernel when its holder dies, so a crashed builder never strands the
waiters; they take over the build. Waiting is bounded (`lock_timeout`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_VERSION = 1
OFFSETS_MAGIC = b"DDPGIDX\0"
LENGTHS_MAGIC = b"DDPGLEN\0"
HEADER = struct.Struct("<8sI4sQQq48s40s")
HEADER_SIZE = 128
# Files above this size show a progress bar while being indexed (when tqdm is installed).
PROGRESS_MIN_BYTES = 256 << 20
DEFAULT_LOCK_TIMEOUT = 3600.0
_COMPRESSED_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz",
                     b"\x28\xb5\x2f\xfd": "zstd"}


class DatasetError(ValueError):
    """A data file or its index is unusable; the message names the path and what to do."""


class StaleIndexError(DatasetError):
    """An index file does not describe the source file it sits next to."""


@dataclass(frozen=True)
class Header:
    magic: bytes
    version: int
    dtype: str
    count: int
    src_size: int
    src_mtime_ns: int
    src_name: str
    key: str

    def pack(self) -> bytes:
        raw = HEADER.pack(self.magic, self.version, self.dtype.encode(), self.count,
                          self.src_size, self.src_mtime_ns,
                          self.src_name.encode()[:48], self.key.encode()[:40])
        return raw.ljust(HEADER_SIZE, b"\0")


def _strip(b: bytes) -> str:
    return b.rstrip(b"\0").decode(errors="replace")


def read_header(path: str | os.PathLike[str]) -> Header:
    with open(path, "rb") as f:
        raw = f.read(HEADER_SIZE)
    if len(raw) < HEADER_SIZE:
        raise StaleIndexError(f"{path}: truncated index header ({len(raw)} bytes)")
    magic, version, dtype, count, size, mtime, name, key = HEADER.unpack_from(raw)
    if magic not in (OFFSETS_MAGIC, LENGTHS_MAGIC):
        raise StaleIndexError(f"{path}: not a ddpguard index (magic {magic!r})")
    return Header(magic, version, _strip(dtype), count, size, mtime, _strip(name), _strip(key))


def check_source(source: str | os.PathLike[str]) -> os.stat_result:
    """stat() a data file, refusing what cannot be a plain-text JSONL file. Returns the stat."""
    p = Path(source)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file (JSONL data file)")
    if p.is_dir():
        raise IsADirectoryError(f"{p}: is a directory; pass the .jsonl files in it "
                                f"(or a glob such as '{p}/*.jsonl')")
    st = p.stat()
    if st.st_size == 0:
        raise DatasetError(f"{p}: file is empty; a JSONL dataset needs at least one record")
    with open(p, "rb") as f:
        head = f.read(6)
    for magic, kind in _COMPRESSED_MAGIC.items():
        if head.startswith(magic):
            raise DatasetError(f"{p}: looks {kind}-compressed; only plain-text JSONL is "
                               f"supported (decompress it first, e.g. `{kind} -d`)")
    return st


def expected_header(source: str | os.PathLike[str], st: os.stat_result, *, magic: bytes,
                    dtype: str, key: str = "") -> Header:
    return Header(magic, FORMAT_VERSION, dtype, 0, st.st_size, st.st_mtime_ns,
                  Path(source).name[:48], key[:40])


def header_problem(found: Header, want: Header) -> str | None:
    """Why `found` does not describe the source `want` was made from; None when it does."""
    for field in ("magic", "version", "dtype", "src_name", "src_size", "src_mtime_ns", "key"):
        a, b = getattr(found, field), getattr(want, field)
        if a != b:
            return f"{field} is {a!r} in the index but {b!r} for the source"
    return None


def open_array(path: str | os.PathLike[str], want: Header) -> np.memmap:
    """Memory-map a validated array file; StaleIndexError naming the path if it is stale."""
    hdr = read_header(path)
    problem = header_problem(hdr, want)
    if problem:
        raise StaleIndexError(f"{path} does not match its source file: {problem}")
    expect = HEADER_SIZE + hdr.count * np.dtype(hdr.dtype).itemsize
    if os.path.getsize(path) != expect:
        raise StaleIndexError(f"{path}: size {os.path.getsize(path)} != {expect} from header")
    return np.memmap(path, dtype=np.dtype(hdr.dtype), mode="r", offset=HEADER_SIZE,
                     shape=(hdr.count,))


def cache_dir() -> Path:
    base = os.environ.get("DDPGUARD_CACHE")
    root = Path(base) if base else Path.home() / ".cache" / "ddpguard"
    return root / "index"


def candidate_paths(source: str | os.PathLike[str], suffix: str) -> list[Path]:
    """Where an index may live: next to the file, then the per-user cache folder."""
    src = Path(source).resolve()
    digest = hashlib.sha256(str(src).encode()).hexdigest()[:16]
    return [src.with_name(src.name + suffix), cache_dir() / digest / (src.name + suffix)]


def _writable_dir(d: Path) -> bool:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(d, os.W_OK | os.X_OK)


@contextlib.contextmanager
def build_lock(lock_path: Path, timeout: float) -> Iterator[None]:
    """Exclusive flock on `lock_path`, polled so the wait is bounded and names the lock."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"pid {os.getpid()} waited {timeout:.0f} s for {lock_path}, held by another "
                    "process building this index. If no process is building it (check with "
                    f"`fuser {lock_path}`), the holder is stuck: kill it, or prebuild with "
                    "`ddpguard index FILE`.")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def progress_bar(total: int, desc: str) -> Any:
    if total < PROGRESS_MIN_BYTES:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, leave=False)


def write_atomic(target: Path, header: Header, fill: Callable[[Any], int]) -> int:
    """Write header + array through a temp file in the target folder, then os.replace, so a
    reader never sees half an index. `fill(f)` writes the array and returns its length."""
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0" * HEADER_SIZE)
            n = fill(f)
            f.seek(0)
            f.write(Header(header.magic, header.version, header.dtype, n, header.src_size,
                           header.src_mtime_ns, header.src_name, header.key).pack())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return n


def ensure_array(source: str | os.PathLike[str], suffix: str, *, magic: bytes, dtype: str,
                 key: str, fill: Callable[[Any, os.stat_result], int], force: bool = False,
                 lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> tuple[Path, np.memmap, bool]:
    """Open a valid array file for `source`, building it (once per node, under the lock) when
    missing or stale. Returns (path, memmap, built)."""
    st = check_source(source)
    want = expected_header(source, st, magic=magic, dtype=dtype, key=key)
    places = candidate_paths(source, suffix)
    if not force:
        for p in places:
            with contextlib.suppress(StaleIndexError, FileNotFoundError):
                return p, open_array(p, want), False
    target = next((p for p in places if _writable_dir(p.parent)), None)
    if target is None:
        raise DatasetError(f"{source}: cannot write an index next to it nor in {places[-1]}; "
                           "set DDPGUARD_CACHE to a writable folder")
    with build_lock(target.with_name(target.name + ".lock"), lock_timeout):
        if not force:  # another process may have built it while this one waited
            with contextlib.suppress(StaleIndexError, FileNotFoundError):
                return target, open_array(target, want), False
        write_atomic(target, want, lambda f: fill(f, st))
    after = os.stat(source)
    if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
        raise DatasetError(f"{source}: changed while being indexed; index again once "
                           "writers are done")
    return target, open_array(target, want), True
