"""Read and parse a file the way Python does, or say why Python could not (DDP000).

Python decodes source by its encoding cookie (`# -*- coding: latin-1 -*-`) or a UTF-8
byte-order mark, else UTF-8 (PEP 263, PEP 3120). A file that starts with a BOM compiles,
so it must be linted like any other; only files that Python itself refuses get DDP000,
with Python's own reason.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

DDP000_FIX = "make the file compile (python -m py_compile FILE shows the same error)"


class Unreadable(Exception):
    """Python cannot compile the file: `line`, `col` and `why` say where and why."""

    def __init__(self, why: str, line: int = 1, col: int = 1) -> None:
        super().__init__(why)
        self.why, self.line, self.col = why, line, col


def decode(data: bytes) -> str:
    """Source text as the interpreter reads it (cookie, BOM, else UTF-8)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # an unknown or contradictory cookie
        raise Unreadable(f"Python cannot read it: {exc}") from None
    try:
        text = data.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        raise Unreadable(f"Python cannot decode it as {encoding}: {exc}") from None
    return text  # a BOM makes detect_encoding answer "utf-8-sig", which drops it


def read(path: str | Path) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise Unreadable(f"cannot read the file: {exc.strerror or exc}") from None
    return decode(data)


def parse(source: str, path: str) -> ast.Module:
    """`ast.parse`, with Python's refusal turned into Unreadable (syntax, null bytes)."""
    if source.startswith("\ufeff"):  # a str handed over with its BOM still on
        source = source[1:]
    try:
        return ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise Unreadable(f"syntax error: {exc.msg} (Python does not compile this file)",
                         exc.lineno or 1, exc.offset or 1) from None
    except ValueError as exc:  # source code string cannot contain null bytes
        raise Unreadable(f"Python cannot compile it: {exc}") from None
