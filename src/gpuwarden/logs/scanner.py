"""One log source scanned: whole, from an offset, over a time window, or incrementally across checks.

The caller (the `logs` fact) says which sources a node has and in which time context they are read;
the Scanner decides how much of each to read: a whole file, the last `window_s` seconds of the big
chatty logs (found by bisection, `window`), only what a log gained since the previous check
(`cursors`), and the follow-up searches after a device-plugin call (`devicemanager`).
"""

from __future__ import annotations

import datetime as dt
import io
from typing import Any, BinaryIO, Callable, Iterator, Sequence

from msgspec import Struct

from gpuwarden.logs.cursors import LogCursors
from gpuwarden.logs.decode import decoder
from gpuwarden.logs.offsets import fsize, ident, last_line_end, line_start, pread
from gpuwarden.logs.scan import LogScan, Signature, merge, scan
from gpuwarden.logs.window import rfind_before, window_start
from gpuwarden.parsers.duration import format_duration
from gpuwarden.root import Missing, Root, StatInfo

#: logs that a time window bounds: the big, chatty ones. Kernel and pod logs are small
#: (ring buffer, 16 MB tails) and their old lines (an Xid hours ago) still matter.
WINDOW_LOGS = ("kubelet", "containerd")
#: the device-plugin calls GPU-K8S-001 pairs; a windowed kubelet scan holding none looks back for
#: the latest one, so that a call hung since before the window is still seen
CALL_SIGNATURES = ("kubelet.gpa.issue", "kubelet.allocate.issue")
#: ... starting this far before it: an Allocate line names no pod before kubelet 1.30, the
#: GetPreferredAllocation line just before it does
LOOK_BACK_MARGIN = 64 << 10


class LogSource(Struct, frozen=True, repr_omit_defaults=True):
    """A log to scan: where it is, its format and which lines to keep."""
    log: str  # "kubelet" | "containerd" | "kernel" | "pod:<ns>/<pod>/<container>"
    path: str  # node path, or "probes:journal:<unit>"
    fmt: str  # "klog" | "journal-json" | "cri" | "kernel"
    line_filter: bytes | None = None
    data: bytes | None = None  # in-memory text (probe output, /dev/kmsg)


def open_log(root: Root, src: LogSource) -> BinaryIO | Iterator[bytes] | Missing:
    """A binary file (fast path) or a line iterator for one log source."""
    if src.data is not None:
        return io.BytesIO(src.data)
    return root.open_binary(src.path)


def close(stream: Any) -> None:
    closer = getattr(stream, "close", None)
    if callable(closer):
        try:
            closer()
        except Exception:
            pass


class Scanner:
    """Scans sources of one node with one time context; re-opens a source for follow-ups.

    `boot` gives the boot time kernel lines are timed from (asked once, for the first kernel source);
    `window_s` bounds the WINDOW_LOGS by time; `cursors` (kept by the caller) makes scans incremental.
    """

    def __init__(self, root: Root, ref: float, tz: dt.tzinfo, *, boot: Callable[[], float | None] = lambda: None,
                 max_bytes: int = 2 << 30, window_s: float | None = None, cursors: Any = None) -> None:
        self.root = root
        self.ref = ref
        self.tz = tz
        self.max_bytes = max_bytes
        self.window_s = window_s
        self.cursors = cursors if isinstance(cursors, LogCursors) else None
        self._boot = boot
        self.boot: float | None = None
        self._boot_read = False

    def decoder_for(self, src: LogSource):
        if src.fmt == "kernel" and not self._boot_read:
            self.boot, self._boot_read = self._boot(), True
        return decoder(src.fmt, self.ref, self.tz, self.boot)

    def run(self, src: LogSource, sigs: Sequence[Signature], *, start: int = 0, first_only: bool = False,
            max_bytes: int | None = None, edges: bool = True, align: bool = False,
            stop: int | None = None) -> LogScan | Missing:
        stream = open_log(self.root, src)
        if isinstance(stream, Missing):
            return stream
        size = len(src.data) if src.data is not None else None
        if size is None and not hasattr(stream, "readinto"):
            st = self.root.stat(src.path)
            size = st.size if isinstance(st, StatInfo) and st.kind == "file" else None
        try:
            file = hasattr(stream, "readinto") and src.data is None
            main = start == 0 and not first_only and edges and not align and stop is None
            if main and file and (self.cursors is not None or (self.window_s and src.log in WINDOW_LOGS)):
                return self._bounded(src, sigs, stream, max_bytes or self.max_bytes)  # type: ignore[arg-type]
            if not main and file and not align and stop is None and self.cursors is not None:
                return self._follow_on(src, sigs, stream, start, first_only, self.cursors,  # type: ignore[arg-type]
                                       max_bytes or self.max_bytes)
            return scan(stream, sigs, self.decoder_for(src), log=src.log, source=src.path, fmt=src.fmt,
                        start=start, max_bytes=max_bytes or self.max_bytes, line_filter=src.line_filter,
                        first_only=first_only, edges=edges, align_start=align, size=size, stop=stop)
        finally:
            close(stream)

    def _follow_on(self, src: LogSource, sigs: Sequence[Signature], f: BinaryIO, start: int, first_only: bool,
                   cursors: LogCursors, max_bytes: int) -> LogScan:
        """A follow-up search from `start` to the end, incremental across checks like the main pass:
        a call left open is searched after once, then only in what the log gained since."""
        size = fsize(f)
        kw: dict[str, Any] = dict(log=src.log, source=src.path, fmt=src.fmt, max_bytes=max_bytes,
                                  line_filter=src.line_filter, first_only=first_only, edges=False)
        decode = self.decoder_for(src)
        if size is None:
            return scan(f, sigs, decode, start=start, **kw)
        stop = last_line_end(f, size)
        key, fid, ids = ("follow", src.log, src.path, start, first_only), ident(f), tuple(x.id for x in sigs)
        prev = cursors.resume(key, fid, ids, f, stop)
        pread(f, 0, 0)
        if prev is None:
            got = scan(f, sigs, decode, start=start, stop=stop, **kw)
        elif first_only and prev.scan.events:
            got = prev.scan  # the first line after `start` stays the first as the log grows
        else:
            got = merge(prev.scan, scan(f, sigs, decode, start=prev.end, stop=stop, **kw), sigs)
        cursors.store(key, fid, ids, f, stop, got)
        return got

    def _bounded(self, src: LogSource, sigs: Sequence[Signature], f: BinaryIO, max_bytes: int) -> LogScan:
        """The main pass of a file, incremental (cursors) and/or over a time window (window_s)."""
        decode = self.decoder_for(src)
        kw: dict[str, Any] = dict(log=src.log, source=src.path, fmt=src.fmt, max_bytes=max_bytes,
                                  line_filter=src.line_filter)
        size = fsize(f)
        cursors = self.cursors
        key, fid = (src.log, src.path), ident(f)
        ids = tuple(s.id for s in sigs)
        stop = last_line_end(f, size) if cursors is not None and size is not None else None
        if cursors is not None and stop is not None:
            prev = cursors.resume(key, fid, ids, f, stop)
            if prev is not None:
                pread(f, 0, 0)  # scan() reads from the current position when start is 0
                got = merge(prev.scan, scan(f, sigs, decode, start=prev.end, stop=stop,
                                            flood_classes=prev.scan.flood_classes, **kw), sigs)
                cursors.store(key, fid, ids, f, stop, got)
                return got
        window = self.window_s
        start = 0
        if window and src.log in WINDOW_LOGS and size:
            start = window_start(f, size, decode, self.ref - float(window), src.line_filter)
        pread(f, 0, 0)
        got = scan(f, sigs, decode, start=start, stop=stop, align_start=start > 0, **kw)
        if start > 0 and got.start > 0:
            note = (f"log window: scanned the last {format_duration(float(window or 0))} "
                    f"({(size or 0) - got.start} of {size} bytes)")
            if src.log == "kubelet":
                got, note = self._look_back(f, sigs, decode, got, size or 0, stop, kw, note)
            got.problems.append(note)
        if cursors is not None and stop is not None:
            cursors.store(key, fid, ids, f, stop, got)
        return got

    def _look_back(self, f: BinaryIO, sigs: Sequence[Signature], decode: Any, got: LogScan, size: int,
                   stop: int | None, kw: dict[str, Any], note: str) -> tuple[LogScan, str]:
        """A windowed kubelet scan without a device-plugin call: rescan from (a little before) the
        latest call before the window, so that a call hung since then (GPU-K8S-001) is paired and
        reported as in a whole-file scan, with the GetPreferredAllocation line that names the pod
        of an Allocate."""
        if any(e.sig in CALL_SIGNATURES for e in got.events):
            return got, note
        anchors = sorted({s.anchor for s in sigs if s.id in CALL_SIGNATURES})
        floor = max(0, size - kw["max_bytes"]) if kw.get("max_bytes") else 0
        at = rfind_before(f, got.start, anchors, floor)
        if at is None:
            return got, note + "; no device-plugin call before it either"
        begin = line_start(f, max(floor, at - LOOK_BACK_MARGIN))
        earlier = scan(f, sigs, decode, start=begin, stop=stop, align_start=True, **kw)
        return earlier, (f"log window: extended back to the latest device-plugin call "
                         f"({size - earlier.start} of {size} bytes)")

    def follow(self, src: LogSource):
        """The `devicemanager.Follow` of one source: a search of the same log from an offset."""
        def follow(start: int, sigs: Sequence[Signature], first_only: bool, align: bool = False,
                   stop: int | None = None) -> LogScan:
            got = self.run(src, sigs, start=start, first_only=first_only, edges=False, align=align, stop=stop)
            if isinstance(got, Missing):
                raise OSError(str(got))
            return got

        return follow


def scan_path(root: Root, path: str, log: str = "kubelet", fmt: str = "klog", *, ref_time: float,
              tz: dt.tzinfo = dt.timezone.utc, phase: str = "main",
              line_filter: bytes | None = None) -> LogScan | Missing:
    """Scan one file of a root with the shipped signatures of a log kind (tools, tests)."""
    from gpuwarden.logs import signatures

    stream = open_log(root, LogSource(log, path, fmt, line_filter))
    if isinstance(stream, Missing):
        return stream
    try:
        return scan(stream, signatures.for_log(log.split(":", 1)[0], phase), decoder(fmt, ref_time, tz),
                    log=log, source=path, fmt=fmt, line_filter=line_filter)
    finally:
        close(stream)
