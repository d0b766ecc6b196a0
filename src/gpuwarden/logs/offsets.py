"""Byte positions in an open log file: sized, identified and cut at line boundaries, never raising."""

from __future__ import annotations

import os
from typing import BinaryIO

from gpuwarden.logs.scan import MAX_LINE


def pread(f: BinaryIO, offset: int, n: int) -> bytes:
    """`n` bytes at `offset` (fewer at the end; b"" when the file cannot be read there)."""
    try:
        f.seek(offset)
        return f.read(n) or b""
    except (OSError, ValueError):
        return b""


def fsize(f: BinaryIO) -> int | None:
    try:
        return os.fstat(f.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        return None


def ident(f: BinaryIO) -> tuple[int, int] | None:
    """(device, inode): a rotated log is another file under the same name."""
    try:
        st = os.fstat(f.fileno())
        return st.st_dev, st.st_ino
    except (AttributeError, OSError, ValueError):
        return None


def last_line_end(f: BinaryIO, size: int) -> int:
    """Offset just after the last newline: a line still being written is left for the next scan."""
    n = min(size, MAX_LINE)
    tail = pread(f, size - n, n)
    i = tail.rfind(b"\n")
    if i < 0:
        return size  # no newline in the last MAX_LINE bytes: a runaway line, taken whole
    return size - len(tail) + i + 1


def line_start(f: BinaryIO, offset: int) -> int:
    """The start of the line holding `offset` (looking back at most MAX_LINE bytes)."""
    lo = max(0, offset - MAX_LINE)
    head = pread(f, lo, offset - lo)
    return lo + head.rfind(b"\n") + 1 if head else offset
