"""Seeking in a log by time and by anchor: where a time window starts, where a line last occurred.

Log times are close to sorted, so a window's start is found by bisection over line times in a
few reads of WINDOW_GRAIN bytes, not by reading the file.
"""

from __future__ import annotations

from typing import Any, BinaryIO, Sequence

from gpuwarden.logs.offsets import pread
from gpuwarden.logs.scan import CHUNK, Decoded

#: a bounded scan still reads at least this much of the end of a file: the kubelet's last state,
#: even when it stopped logging before the window began
WINDOW_MIN_TAIL = 1 << 20
#: the window's start is found by bisection over line times, to this many bytes
WINDOW_GRAIN = 64 << 10


def line_time(f: BinaryIO, offset: int, decode: Any, line_filter: bytes | None) -> tuple[int, float] | None:
    """(line start, time) of the first timed line at or after `offset` (within WINDOW_GRAIN bytes)."""
    data = pread(f, offset, WINDOW_GRAIN)
    lines = data.split(b"\n")
    pos = offset
    if offset > 0 and lines:  # the first piece is the end of a line begun before `offset`
        pos += len(lines[0]) + 1
        lines = lines[1:]
    for raw in lines[:-1]:  # the last piece may be cut
        if raw.strip() and (not line_filter or line_filter in raw):
            try:
                d = decode(raw.decode("utf-8", "replace"))
            except Exception:
                d = None
            if isinstance(d, Decoded) and d.time is not None:
                return pos, d.time
        pos += len(raw) + 1
    return None


def window_start(f: BinaryIO, size: int, decode: Any, since: float, line_filter: bytes | None) -> int:
    """A line start at most WINDOW_GRAIN before the first line timed `since` or later (bisection;
    log times are close to sorted), and never later than WINDOW_MIN_TAIL before the end."""
    first = line_time(f, 0, decode, line_filter)
    if first is None or first[1] >= since:
        return 0
    lo, hi = 0, size
    while hi - lo > WINDOW_GRAIN:
        mid = (lo + hi) // 2
        got = line_time(f, mid, decode, line_filter)
        if got is None or got[1] >= since:
            hi = mid  # untimed stretch: assume it is recent (scan more, never less)
        else:
            lo = min(max(got[0], mid), hi)
    return max(0, min(lo, size - WINDOW_MIN_TAIL))


def rfind_before(f: BinaryIO, end: int, anchors: Sequence[bytes], floor: int = 0) -> int | None:
    """Offset of the last occurrence of any anchor that starts before `end` (reading backwards)."""
    if not anchors:
        return None
    over = max(len(a) for a in anchors) - 1
    block = 8 * CHUNK
    hi = end
    while hi > floor:
        lo = max(floor, hi - block)
        data = pread(f, lo, hi - lo + over)
        # occurrences starting before hi (those starting later were seen in the previous block)
        best = max(data.rfind(a, 0, hi - lo + len(a) - 1) for a in anchors)
        if best >= 0:
            return lo + best
        hi = lo
    return None
