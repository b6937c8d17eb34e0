"""Real text that ships with every Python: the standard library's docstrings, read with `ast`
(nothing is imported or executed) and written once to JSONL files in a cache folder."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

__all__ = ["build_corpus", "default_cache", "docstrings"]

VERSION = 1


def default_cache() -> Path:
    base = os.environ.get("DDPGUARD_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "ddpguard") / "demo"


def _sources(stdlib: Path) -> Iterator[Path]:
    skip = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "turtledemo"}
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(root) / name


def docstrings(stdlib: Path | None = None) -> Iterator[str]:
    """Module, class and function docstrings of the standard library, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"]) if stdlib is None else stdlib
    for path in _sources(stdlib):
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, OSError):
            continue
        nodes = [tree, *(n for n in ast.walk(tree) if isinstance(
            n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef))]
        for node in nodes:
            doc = ast.get_docstring(node)
            if doc:
                yield doc


def _chunks(text: str, max_bytes: int) -> Iterator[str]:
    """Paragraph-aligned pieces of at most max_bytes UTF-8 bytes (longer paragraphs are cut)."""
    piece = ""
    for para in text.split("\n\n"):
        cand = f"{piece}\n\n{para}" if piece else para
        if len(cand.encode()) <= max_bytes:
            piece = cand
            continue
        if piece:
            yield piece
        raw = para.encode()
        while len(raw) > max_bytes:
            yield raw[:max_bytes].decode(errors="ignore")
            raw = raw[max_bytes:]
        piece = raw.decode(errors="ignore")
    if piece:
        yield piece


def build_corpus(cache: Path | None = None, *, max_bytes: int = 256, min_bytes: int = 48,
                 val_every: int = 20, total_bytes: int = 640_000) -> tuple[Path, Path]:
    """Write train.jsonl and val.jsonl ({"text", "len"} records) once; later calls reuse them.

    The split is by a hash of the text, so it does not depend on the Python patch release's file
    order. `total_bytes` caps the text kept (train + val) so a demo epoch stays short. Written
    to temporary names and renamed, so concurrent first runs cannot see half.
    """
    folder = (default_cache() if cache is None else cache) / f"stdlib-v{VERSION}-{total_bytes}"
    train, val = folder / "train.jsonl", folder / "val.jsonl"
    if train.exists() and val.exists():
        return train, val
    folder.mkdir(parents=True, exist_ok=True)
    tmp_t, tmp_v = (p.with_suffix(f".tmp{os.getpid()}") for p in (train, val))
    seen: set[str] = set()
    kept = 0
    with open(tmp_t, "w") as ft, open(tmp_v, "w") as fv:
        for doc in docstrings():
            if kept >= total_bytes:
                break
            for chunk in _chunks(doc.strip(), max_bytes):
                n = len(chunk.encode())
                if n < min_bytes or chunk in seen:
                    continue
                kept += n
                seen.add(chunk)
                h = int(hashlib.blake2b(chunk.encode(), digest_size=4).hexdigest(), 16)
                out = fv if h % val_every == 0 else ft
                out.write(json.dumps({"text": chunk, "len": n}) + "\n")
    os.replace(tmp_v, val)
    os.replace(tmp_t, train)
    return train, val
