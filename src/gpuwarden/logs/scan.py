"""Signature scanning of large logs: find the few lines that matter without parsing the rest.

A kubelet at --v=4 writes hundreds of megabytes of cadvisor chatter; the rules need a few
hundred lines out of millions. So nothing is parsed per line: the file is read in big binary
chunks, each chunk is searched once per distinct *anchor* (a literal every line of a
signature contains) with `bytes.find` — C speed, about the memory bandwidth — and only the
lines around a hit are decoded and matched against the signature's regex. The cost is one
pass per distinct anchor, so signatures should share anchors and prefer long, rare ones
(see docs/logs.md for measurements).

Signatures are data (`gpuwarden/data/log_signatures.yaml`, or `Signature(...)` built in code);
a decoder turns one raw line of a given format (klog, journal JSON, CRI, kernel) into a
`Decoded` message with its time and pid. Events are bounded: per signature the first hit and
the last `keep` hits are kept, and every hit is counted.

Reading never raises: the caller gets a `LogScan` with `problems` instead. Files are read with
`readinto`, not mmap: a live log truncated under an mmap (logrotate copytruncate) would kill
the process with SIGBUS.
"""

from __future__ import annotations

import os
import re
import stat
from collections import deque
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Mapping, Sequence

from msgspec import Struct, field

from gpuwarden.findings import Evidence
from gpuwarden.logs.flood import BLOCK, FloodClasses

#: bytes read per chunk; every anchor is searched once per chunk. 1 MB keeps the chunk in the
#: CPU's L2 cache across the anchor passes (8 MB chunks were ~10% slower, bench/run.py logscan)
CHUNK = 1 << 20
#: a "line" longer than this (binary garbage, a runaway message) is cut
MAX_LINE = 256 << 10
#: characters of a matched line kept for evidence
LINE_CLIP = 2000
#: lines looked at from each end of the file for its first/last timestamp
EDGE_LINES = 200

_ANCHOR_OK = re.compile(rb"[\x20-\x7e]+")


class Signature(Struct, frozen=True):
    """One thing to look for in a log.

    `anchor` is the fast pre-filter: a literal that every matching line contains (no quotes or
    backslashes, so that it also matches inside JSON-escaped journal lines). `regex`, searched
    in the decoded message, decides; its named groups become event fields. `logs` names the logs
    it applies to (kubelet, containerd, kernel, pod; empty = all). `phase` "follow-up" keeps it
    out of the full-file pass: such signatures are only searched after a given offset, when a
    rule needs to know what followed a line (see `gpuwarden.logs.devicemanager`).
    """

    id: str
    anchor: bytes
    regex: re.Pattern[str] | None = None
    logs: frozenset[str] = frozenset()
    phase: str = "main"
    keep: int = 200
    about: str = ""
    source: str = ""
    #: named groups whose values make a line's class (kernel.xid: device, xid): the latest hits of each class
    #: are kept beside the signature's latest `keep` (a flood of one Xid never pushes another out), and a
    #: flooded class is counted at C speed instead of line by line (logs/flood.py)
    flood_class: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.anchor or not _ANCHOR_OK.fullmatch(self.anchor) or b'"' in self.anchor or b"\\" in self.anchor:
            raise ValueError(f"signature {self.id}: anchor must be printable ASCII without quotes or backslashes")
        if self.phase not in ("main", "follow-up"):
            raise ValueError(f"signature {self.id}: phase must be 'main' or 'follow-up'")

    def applies_to(self, log_kind: str) -> bool:
        return not self.logs or log_kind in self.logs

    def match(self, message: str) -> dict[str, str] | None:
        if self.regex is None:
            return {}
        m = self.regex.search(message)
        if m is None:
            return None
        return {k: v for k, v in m.groupdict().items() if v is not None}

    def match_class(self, message: str) -> tuple[dict[str, str], str] | None:
        """`match`, and the class literal of the line: the message from the match's start to just after the
        last `flood_class` group ("NVRM: Xid (PCI:0000:3b:00): 13,"), or "" when the line has none."""
        if self.regex is None:
            return {}, ""
        m = self.regex.search(message)
        if m is None:
            return None
        fields = {k: v for k, v in m.groupdict().items() if v is not None}
        end = max((m.end(g) for g in self.flood_class if m.start(g) >= 0), default=-1)
        # the literal ends with the character after the class's last group: "13," is never a prefix of "130,"
        if end <= m.start() or end >= len(message) or message[end].isalnum():
            return fields, ""
        return fields, message[m.start():end + 1]


class Decoded(Struct, frozen=True):
    """One raw line, understood: its message and whatever the format says about it."""

    message: str
    time: float | None = None
    pid: int | None = None
    severity: str = ""
    fields: Mapping[str, str] = field(default_factory=dict)


#: turns one raw line (text) into a Decoded, or None when the line is not of the format
Decoder = Callable[[str], "Decoded | None"]


class LogEvent(Struct, frozen=True):
    """A line that matched a signature."""

    sig: str
    log: str  # "kubelet", "containerd", "kernel", "pod:<ns>/<pod>/<container>"
    source: str  # the node path it was read from
    offset: int  # byte offset of the line in that file (orders events across signatures)
    time: float | None
    pid: int | None
    severity: str
    message: str
    fields: Mapping[str, str]
    line: str  # the line as read (clipped), for evidence
    end: int = 0  # byte offset just after the line's newline (where a follow-up search starts)

    def evidence(self) -> Evidence:
        return Evidence(self.source, self.line)

    def get(self, key: str, default: str = "") -> str:
        return self.fields.get(key, default)


class LogScan(Struct):
    """What a scan of one log found."""

    log: str
    source: str
    format: str
    size: int | None = None
    start: int = 0  # first byte scanned (> 0: the head was skipped, see max_bytes)
    end: int = 0  # byte after the last one scanned
    events: list[LogEvent] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    first_hit: dict[str, LogEvent] = field(default_factory=dict)
    first_time: float | None = None
    last_time: float | None = None
    last_pid: int | None = None
    last_line: str = ""
    problems: list[str] = field(default_factory=list)
    #: matching lines counted in bulk as a flood class's (logs/flood.py), not read one by one
    bulk_lines: int = 0
    #: the flood classes the scan knew at its end (literal -> the signatures its lines match): the next
    #: incremental scan of the file starts with them, not by learning them again
    flood_classes: dict[bytes, tuple[str, ...]] = field(default_factory=dict)

    def of(self, *sig_ids: str) -> list[LogEvent]:
        """Kept events of these signatures (prefixes ending in '.' select a family), in file order."""
        def want(s: str) -> bool:
            return any(s == i or (i.endswith(".") and s.startswith(i)) for i in sig_ids)
        return [e for e in self.events if want(e.sig)]

    def count(self, sig_id: str) -> int:
        return self.counts.get(sig_id, 0)

    @property
    def truncated(self) -> bool:
        return self.start > 0


# -- reading -------------------------------------------------------------------------------

Chunk = tuple[Any, int, int, int]  # (buffer, lo, hi, file offset of buffer[0])


def _file_size(f: Any) -> int | None:
    """Size of a regular file (or of a seekable in-memory stream); None when unknown."""
    try:
        st = os.fstat(f.fileno())
        return st.st_size if stat.S_ISREG(st.st_mode) else None
    except (AttributeError, OSError, ValueError):
        pass
    try:
        if f.seekable():
            pos = f.tell()
            end = f.seek(0, os.SEEK_END)
            f.seek(pos)
            return end
    except (AttributeError, OSError, ValueError):
        pass
    return None


def _file_chunks(f: BinaryIO, start: int, size: int | None = None, stop: int | None = None) -> Iterator[Chunk]:
    """Chunks of whole lines read with readinto into one reused buffer (up to `stop` when given)."""
    size = size or CHUNK
    if start:
        try:
            f.seek(start)
        except (OSError, ValueError):
            start = 0
    buf = bytearray(size + MAX_LINE)
    view = memoryview(buf)
    carry = 0
    pos = start
    while True:
        want = size if stop is None else max(0, min(size, stop - pos - carry))
        n = f.readinto(view[carry:carry + want]) if want else 0
        if not n:
            if carry:
                yield buf, 0, carry, pos
            return
        filled = carry + n
        cut = buf.rfind(b"\n", 0, filled) + 1
        if cut == 0:
            if filled < MAX_LINE:
                carry = filled  # one long line so far: read on
                continue
            cut = filled  # a runaway "line": take it as is
        yield buf, 0, cut, pos
        rest = filled - cut
        if rest:
            buf[0:rest] = buf[cut:filled]
        pos += cut
        carry = rest


def _line_chunks(lines: Iterable[bytes], start: int = 0, size: int | None = None) -> Iterator[Chunk]:
    """Chunks built by joining lines (for roots that only offer a line iterator).

    Lines that end before `start` are skipped: a line source cannot seek.
    """
    size = size or CHUNK
    pending: list[bytes] = []
    n = 0
    pos = 0
    for line in lines:
        if pos < start:
            pos += len(line)
            continue
        pending.append(line)
        n += len(line)
        if n >= size:
            data = b"".join(pending)
            if not data.endswith(b"\n"):
                data += b"\n"
            yield data, 0, len(data), pos
            pos += n
            pending, n = [], 0
    if pending:
        data = b"".join(pending)
        yield data, 0, len(data), pos


def _skip_to_line(f: BinaryIO, start: int) -> int:
    """Move a start offset to the beginning of the next line."""
    try:
        f.seek(start)
        rest = f.readline(MAX_LINE)
        return start + len(rest)
    except (OSError, ValueError):
        return 0


# -- scanning ------------------------------------------------------------------------------

#: the latest hits kept per class of a `flood_class` signature, beside the signature's latest `keep`
CLASS_KEEP = 8
#: classes of one signature that keep their own latest hits (beyond: only the signature's `keep`)
MAX_KEPT_CLASSES = 64


def class_key(sig: Signature, fields: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(fields.get(g, "") for g in sig.flood_class)


class _Collector:
    def __init__(self, scan: LogScan, sigs: Sequence[Signature]) -> None:
        self.scan = scan
        self.kept: dict[str, deque[LogEvent]] = {s.id: deque(maxlen=max(1, s.keep)) for s in sigs}
        #: sig id -> class -> its latest hits: a flood of one class never pushes another class's lines out
        self.classes: dict[str, dict[tuple[str, ...], deque[LogEvent]]] = {s.id: {} for s in sigs if s.flood_class}
        self.sigs = {s.id: s for s in sigs}

    def add(self, ev: LogEvent) -> None:
        s = self.scan
        s.counts[ev.sig] = s.counts.get(ev.sig, 0) + 1
        s.first_hit.setdefault(ev.sig, ev)
        self.kept[ev.sig].append(ev)
        by = self.classes.get(ev.sig)
        if by is not None:
            k = class_key(self.sigs[ev.sig], ev.fields)
            dq = by.get(k)
            if dq is None and len(by) < MAX_KEPT_CLASSES:
                dq = by[k] = deque(maxlen=CLASS_KEEP)
            if dq is not None:
                dq.append(ev)

    def bulk(self, sig_ids: Sequence[str], n: int) -> None:
        """`n` more lines of these signatures, counted but not kept (a flood class's)."""
        c = self.scan.counts
        for sid in sig_ids:
            c[sid] = c.get(sid, 0) + n

    def finish(self) -> None:
        evs: dict[tuple[int, str], LogEvent] = {}
        for dq in self.kept.values():
            for e in dq:
                evs[(e.offset, e.sig)] = e
        for by in self.classes.values():
            for dq in by.values():
                for e in dq:
                    evs[(e.offset, e.sig)] = e
        for e in self.scan.first_hit.values():
            evs[(e.offset, e.sig)] = e
        self.scan.events = [evs[k] for k in sorted(evs)]


def _decode(decode: Decoder, text: str) -> Decoded:
    try:
        d = decode(text)
    except Exception:  # a decoder bug must cost one line, not the scan
        d = None
    return d if d is not None else Decoded(text)


def _edges(scan: LogScan, buf: Any, lo: int, hi: int, decode: Decoder, line_filter: bytes | None,
           first: bool) -> None:
    """Timestamp of the first (or last) decodable line within a chunk."""
    data = bytes(buf[lo:min(hi, lo + MAX_LINE)]) if first else bytes(buf[lo:hi])
    lines = data.split(b"\n")
    seq = lines[:EDGE_LINES] if first else reversed(lines[-EDGE_LINES:])
    for raw in seq:
        if not raw.strip() or (line_filter and line_filter not in raw):
            continue
        d = _decode(decode, raw.decode("utf-8", "replace"))
        if d.time is None:
            continue
        if first:
            scan.first_time = d.time
        else:
            scan.last_time, scan.last_pid = d.time, d.pid
            scan.last_line = raw.decode("utf-8", "replace")[:LINE_CLIP]
        return


def scan(
    stream: BinaryIO | Iterable[bytes],
    signatures: Sequence[Signature],
    decode: Decoder,
    *,
    log: str,
    source: str,
    fmt: str,
    start: int = 0,
    max_bytes: int | None = None,
    line_filter: bytes | None = None,
    first_only: bool = False,
    edges: bool = True,
    align_start: bool = False,
    size: int | None = None,
    stop: int | None = None,
    flood_classes: Mapping[bytes, tuple[str, ...]] | None = None,
) -> LogScan:
    """Scan one log for `signatures`; bounded memory, never raises on the file's content.

    stream: a binary file (read with readinto) or an iterator of lines (bytes).
    start: byte offset to begin at (follow-up searches); max_bytes: scan at most the last
    this-many bytes; line_filter: a literal a line must contain to count (e.g. b" kubelet[" in
    /var/log/messages); first_only: stop at the first matching line; align_start: `start` may
    fall inside a line (a window before an offset): begin at the next line; size: the file's
    size when the stream cannot tell (a line iterator), for max_bytes; stop: read a file no
    further than this offset (a line start: an incremental scan leaves a line still being
    written for the next one); flood_classes: the classes an earlier scan of the same file
    learned (`LogScan.flood_classes`), counted in bulk from the start.
    """
    result = LogScan(log=log, source=source, format=fmt)
    sigs = [s for s in signatures if s.applies_to(log.split(":", 1)[0])]
    groups: dict[bytes, list[Signature]] = {}
    for s in sigs:
        groups.setdefault(s.anchor, []).append(s)
    anchors = sorted(groups, key=len, reverse=True)
    col = _Collector(result, sigs)

    if hasattr(stream, "readinto"):
        size = _file_size(stream)
    result.size = size
    if hasattr(stream, "readinto"):
        if max_bytes and size is not None and size - start > max_bytes:
            start = _skip_to_line(stream, size - max_bytes)  # type: ignore[arg-type]
            result.problems.append(f"scanned the last {max_bytes} of {size} bytes")
        elif align_start and start > 0:
            start = _skip_to_line(stream, start - 1)  # type: ignore[arg-type]
        chunks: Iterator[Chunk] = _file_chunks(stream, start, stop=stop)  # type: ignore[arg-type]
    else:
        if max_bytes and size is not None and size - start > max_bytes:
            start = size - max_bytes  # the line containing it is skipped: lines start after it
            result.problems.append(f"scanned the last {max_bytes} of {size} bytes")
        chunks = _line_chunks(stream, start)  # type: ignore[arg-type]
    result.start = start

    # a class of line flooding the log is counted in bulk (logs/flood.py); not with a line filter (a class
    # line without the filter's text must not count) nor for a first hit
    flood = FloodClasses(anchors) if anchors and not line_filter and not first_only and any(
        s.flood_class for s in sigs) else None
    if flood is not None and flood_classes:
        flood.seed(flood_classes, {s.id for s in sigs})

    def line(buf: Any, ls: int, hi: int, base: int) -> tuple[int, tuple[str, ...]]:
        """Read the line starting at `ls`: (its end, the signatures it matched)."""
        le = buf.find(b"\n", ls, hi)
        le = hi if le < 0 else le
        raw = bytes(buf[ls:min(le, ls + MAX_LINE)])
        if line_filter and line_filter not in raw:
            return le, ()
        present = [a for a in anchors if a in raw]
        if not present:
            return le, ()
        d = _decode(decode, raw.decode("utf-8", "replace"))
        matched: list[str] = []
        literal = ""
        for a in present:
            for sig in groups[a]:
                if sig.flood_class:
                    got_class = sig.match_class(d.message)
                    got = got_class[0] if got_class is not None else None
                    if got_class is not None and got_class[1]:
                        literal = got_class[1]
                else:
                    got = sig.match(d.message)
                if got is None:
                    continue
                fields = dict(d.fields)
                fields.update(got)
                col.add(LogEvent(sig.id, log, source, base + ls, d.time, d.pid, d.severity,
                                 d.message, fields, raw.decode("utf-8", "replace")[:LINE_CLIP].rstrip("\r"),
                                 base + le + 1))
                matched.append(sig.id)
        if flood is not None and literal:
            flood.note(raw, literal, tuple(matched))
        return le, tuple(matched)

    def region(buf: Any, lo: int, hi: int, base: int) -> int:
        """Every anchor line of buf[lo:hi], one by one; the end of the first hit's line when `first_only`."""
        starts: set[int] = set()
        for a in anchors:
            i = buf.find(a, lo, hi)
            while i >= 0:
                ls = buf.rfind(b"\n", lo, i) + 1
                starts.add(ls if ls > lo else lo)
                le = buf.find(b"\n", i, hi)
                if le < 0:
                    break
                i = buf.find(a, le, hi)
        for ls in sorted(starts):
            le, matched = line(buf, ls, hi, base)
            if matched and first_only:
                return le
        return -1

    def bulk(buf: Any, lo: int, hi: int, base: int, counts: dict[bytes, int]) -> None:
        """A block holding only flood-class lines: counted, and the last few of each class read."""
        assert flood is not None
        known = {lit: flood.classes[lit] for lit in counts}  # reading a tail line may forget a class
        for lit, n in counts.items():
            if not n:
                continue
            cls = known[lit]
            tail = flood.tail(buf, lo, hi, lit, n)
            for ls in tail:
                _, matched = line(buf, ls, hi, base)
                if matched != cls.sigs:
                    flood.forget(lit)
            col.bulk(cls.sigs, n - len(tail))
            flood.bulk_lines += n - len(tail)

    first_chunk = True
    last: tuple[bytes, int, int] | None = None
    end = start
    try:
        for buf, lo, hi, base in chunks:
            end = base + hi
            if edges and first_chunk and not start:
                _edges(result, buf, lo, hi, decode, line_filter, first=True)
            first_chunk = False
            if edges:
                tail_lo = max(lo, hi - MAX_LINE)
                last = (bytes(memoryview(buf)[tail_lo:hi]), 0, hi - tail_lo)  # one copy, not two
            if not anchors:
                continue
            if flood is None:
                stopped = region(buf, lo, hi, base)
            else:
                stopped = -1
                b = lo
                while b < hi and stopped < 0:
                    e = hi if hi - b <= BLOCK else buf.rfind(b"\n", b, b + BLOCK) + 1
                    if e <= b:  # one line longer than a block
                        e = buf.find(b"\n", b + BLOCK, hi) + 1 or hi
                    counts = flood.bulk(buf, b, e)
                    if counts is None:
                        stopped = region(buf, b, e, base)
                    else:
                        bulk(buf, b, e, base, counts)
                    b = e
            if stopped >= 0:
                col.finish()
                result.end = base + stopped
                return result
    except (OSError, ValueError) as exc:
        result.problems.append(f"read error: {type(exc).__name__}: {exc}")
    if edges and last is not None:
        _edges(result, last[0], last[1], last[2], decode, line_filter, first=False)
    result.end = end
    col.finish()
    if flood is not None:
        result.bulk_lines = flood.bulk_lines
        result.flood_classes = {lit: c.sigs for lit, c in flood.classes.items()}
    return result


def merge(old: LogScan, new: LogScan, signatures: Sequence[Signature]) -> LogScan:
    """`old` (a scan up to some offset) followed by `new` (the same file from that offset on), as
    one scan of the whole: counts added, the first hit of each signature kept, the last `keep`
    hits of each signature and the last CLASS_KEEP of each of its flood classes kept, times and last line from the newer part when it has any."""
    keep = {s.id: max(1, s.keep) for s in signatures}
    flood = {s.id: s for s in signatures if s.flood_class}
    out = LogScan(log=old.log, source=old.source, format=old.format, size=new.size, start=old.start,
                  end=max(old.end, new.end), bulk_lines=old.bulk_lines + new.bulk_lines,
                  flood_classes=dict(new.flood_classes))
    out.counts = dict(old.counts)
    for k, v in new.counts.items():
        out.counts[k] = out.counts.get(k, 0) + v
    out.first_hit = dict(new.first_hit)
    out.first_hit.update(old.first_hit)
    by_sig: dict[str, list[LogEvent]] = {}
    for e in old.events + new.events:
        by_sig.setdefault(e.sig, []).append(e)
    evs: dict[tuple[int, str], LogEvent] = {}
    for sig, lst in by_sig.items():
        for e in lst[-keep.get(sig, 200):]:
            evs[(e.offset, e.sig)] = e
        if sig in flood:  # each class's latest hits, as the scan kept them
            by_class: dict[tuple[str, ...], list[LogEvent]] = {}
            for e in lst:
                k = class_key(flood[sig], e.fields)
                if k in by_class or len(by_class) < MAX_KEPT_CLASSES:
                    by_class.setdefault(k, []).append(e)
            for cl in by_class.values():
                for e in cl[-CLASS_KEEP:]:
                    evs[(e.offset, e.sig)] = e
    for e in out.first_hit.values():
        evs[(e.offset, e.sig)] = e
    out.events = [evs[k] for k in sorted(evs)]
    out.first_time = old.first_time if old.first_time is not None else new.first_time
    src = new if new.last_time is not None else old
    out.last_time, out.last_pid, out.last_line = src.last_time, src.last_pid, src.last_line
    out.problems = list(dict.fromkeys(old.problems + new.problems))
    return out
