"""Where the scan of each log file stopped, kept across checks by a long-running caller."""

from __future__ import annotations

from typing import Any, BinaryIO

from gpuwarden.logs.offsets import pread
from gpuwarden.logs.scan import LogScan


class _Cursor:
    __slots__ = ("ident", "sig_ids", "end", "tail", "scan")

    def __init__(self, ident: tuple[int, int] | None, sig_ids: tuple[str, ...], end: int, tail: bytes,
                 scan: LogScan) -> None:
        self.ident, self.sig_ids, self.end, self.tail, self.scan = ident, sig_ids, end, tail, scan


class LogCursors:
    """Where the scan of each log file stopped, kept across checks by a long-running caller.

    The agent keeps one for its lifetime and passes it as `Settings(log_cursors=...)`: each check
    then reads only the bytes a log gained since the previous check (up to its last complete line)
    and merges them into the previous result (`scan.merge`), so a 200 MB kubelet log costs its
    full scan once. A file with another inode (rotated), shorter than where the last scan stopped
    (truncated), whose bytes before that point changed (rewritten), or scanned with other
    signatures, is scanned afresh. The follow-up searches after a device-plugin call (to the end of
    the log) are kept the same way, under (log, path, offset); the least recently stored entries
    beyond MAX_ENTRIES are dropped (calls long closed).
    """

    TAIL = 256
    MAX_ENTRIES = 512

    def __init__(self) -> None:
        self._by: dict[tuple[Any, ...], _Cursor] = {}

    def __len__(self) -> int:
        return len(self._by)

    def resume(self, key: tuple[Any, ...], ident: tuple[int, int] | None, sig_ids: tuple[str, ...], f: BinaryIO,
               stop: int) -> _Cursor | None:
        c = self._by.get(key)
        if c is None or ident is None or c.ident != ident or c.sig_ids != sig_ids or c.end > stop:
            return None
        if c.tail and pread(f, c.end - len(c.tail), len(c.tail)) != c.tail:
            return None
        return c

    def store(self, key: tuple[Any, ...], ident: tuple[int, int] | None, sig_ids: tuple[str, ...], f: BinaryIO,
              end: int, scan: LogScan) -> None:
        n = min(self.TAIL, end)
        self._by.pop(key, None)  # re-inserted last: the order is that of the latest store
        self._by[key] = _Cursor(ident, sig_ids, end, pread(f, end - n, n) if n else b"", scan)
        while len(self._by) > self.MAX_ENTRIES:
            del self._by[next(iter(self._by))]
