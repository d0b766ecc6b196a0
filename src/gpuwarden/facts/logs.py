"""The `logs` fact: kubelet, containerd, kernel and NVIDIA pod logs, scanned for signatures.

Where each log is looked for (first found wins; see docs/logs.md):
- a captured bundle: `/.gpuwarden/logs/{kubelet,containerd,kernel}.journal.json` (`journalctl -o json`;
  `journalctl -k -o json` for the kernel: a multi-line printk is one MESSAGE),
  `/.gpuwarden/logs/{kubelet,containerd}.log` (text), `/.gpuwarden/logs/kernel.log` (or
  `kmsg.txt`, `dmesg.txt`);
- a live node: `Settings.kubelet_log` / `containerd_log` / `kernel_log` when set, else
  /var/log/kubelet.log, /var/log/kubelet/*.log, /var/log/messages and /var/log/syslog (lines of
  `kubelet[`), /dev/kmsg, /var/log/kern.log; the journal, when the `probes` section exposes
  `journalctl` output (journald itself is not read here);
- pod logs of NVIDIA components under /var/log/pods/<ns>_<pod>_<uid>/<container>/*.log.

Logs are big, so they are scanned (`logscan`), not parsed: only lines matching a signature of
`data/log_signatures.yaml` are kept, with their times. Times without a year or zone (klog,
BSD syslog) are read in the node's zone (`/etc/timezone`, `/etc/localtime`, the bundle's
`meta.json` "tz", or Settings.extra["log_tz"]) with the year taken from `facts.now`.
"""

from __future__ import annotations

import datetime as dt
import io
import os
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterable, Iterator, Sequence

from gpuwarden.facts import logsignatures
from gpuwarden.facts.devicemanager_log import DeviceManagerLog, interpret
from gpuwarden.facts.logdecode import decoder
from gpuwarden.facts.logscan import CHUNK, MAX_LINE, Decoded, LogEvent, LogScan, Signature, merge, scan
from gpuwarden.facts.live import result_field as probe_field
from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.parsers import cri_log, wallclock
from gpuwarden.root import Missing, Root, StatInfo, glob

# The MPS section registers from here until `gpuwarden.facts.mps` is in node._FACT_MODULES.

BUNDLE_LOGS = "/.gpuwarden/logs"
POD_LOGS = "/var/log/pods"

#: (path or glob, format, line filter): where each log is looked for, in order
CANDIDATES: dict[str, tuple[tuple[str, str, bytes | None], ...]] = {
    "kubelet": (
        (f"{BUNDLE_LOGS}/kubelet.journal.json", "journal-json", None),
        (f"{BUNDLE_LOGS}/kubelet.log", "klog", None),
        ("/var/log/kubelet.log", "klog", None),
        ("/var/log/kubelet/*.log", "klog", None),
        ("/var/log/messages", "klog", b" kubelet["),
        ("/var/log/syslog", "klog", b" kubelet["),
    ),
    "containerd": (
        (f"{BUNDLE_LOGS}/containerd.journal.json", "journal-json", None),
        (f"{BUNDLE_LOGS}/containerd.log", "klog", None),
        ("/var/log/containerd.log", "klog", None),
        ("/var/log/messages", "klog", b" containerd["),
        ("/var/log/syslog", "klog", b" containerd["),
    ),
    "kernel": (
        (f"{BUNDLE_LOGS}/kernel.journal.json", "journal-json", None),
        (f"{BUNDLE_LOGS}/kernel.log", "kernel", None),
        (f"{BUNDLE_LOGS}/kmsg.txt", "kernel", None),
        (f"{BUNDLE_LOGS}/dmesg.txt", "kernel", None),
        ("/dev/kmsg", "kernel", None),
        ("/var/log/kern.log", "kernel", None),
        ("/var/log/messages", "kernel", b" kernel: "),
        ("/var/log/syslog", "kernel", b" kernel: "),
    ),
}
_SETTING = {"kubelet": "kubelet_log", "containerd": "containerd_log", "kernel": "kernel_log"}

#: pod-log directories (<ns>_<pod>_<uid>) worth scanning: NVIDIA components
NVIDIA_POD_HINTS = ("nvidia", "gpu-operator", "gpu-feature-discovery", "mps-control-daemon", "dcgm",
                    "device-plugin")
MAX_POD_LOGS = 64
POD_LOG_MAX_BYTES = 16 << 20
KMSG_MAX_BYTES = 32 << 20

#: logs that Settings.log_window_s bounds: the big, chatty ones. Kernel and pod logs are small
#: (ring buffer, 16 MB tails) and their old lines (an Xid hours ago) still matter.
WINDOW_LOGS = ("kubelet", "containerd")
#: a bounded scan still reads at least this much of the end of a file: the kubelet's last state,
#: even when it stopped logging before the window began
WINDOW_MIN_TAIL = 1 << 20
#: the window's start is found by bisection over line times, to this many bytes
WINDOW_GRAIN = 64 << 10
#: the device-plugin calls GPU-K8S-001 pairs; a windowed kubelet scan holding none looks back for
#: the latest one, so that a call hung since before the window is still seen
CALL_SIGNATURES = ("kubelet.gpa.issue", "kubelet.allocate.issue")
#: ... starting this far before it: an Allocate line names no pod before kubelet 1.30, the
#: GetPreferredAllocation line just before it does
LOOK_BACK_MARGIN = 64 << 10


@dataclass(frozen=True)
class LogSource:
    log: str  # "kubelet" | "containerd" | "kernel" | "pod:<ns>/<pod>/<container>"
    path: str  # node path, or "probes:journal:<unit>"
    fmt: str  # "klog" | "journal-json" | "cri" | "kernel"
    line_filter: bytes | None = None
    data: bytes | None = field(default=None, repr=False)  # in-memory text (probe output, /dev/kmsg)


@dataclass
class LogFacts:
    scans: list[LogScan]
    ref_time: float
    tz: str
    devicemanager: DeviceManagerLog | None = None
    #: pod UID -> "ns/name", from /var/log/pods directory names
    pod_names: dict[str, str] = field(default_factory=dict)
    #: log name -> why it was not read
    not_found: dict[str, str] = field(default_factory=dict)

    def log(self, name: str) -> LogScan | None:
        for s in self.scans:
            if s.log == name:
                return s
        return None

    @property
    def kubelet(self) -> LogScan | None:
        return self.log("kubelet")

    @property
    def containerd(self) -> LogScan | None:
        return self.log("containerd")

    @property
    def kernel(self) -> LogScan | None:
        return self.log("kernel")

    def pods(self) -> list[LogScan]:
        return [s for s in self.scans if s.log.startswith("pod:")]

    def events(self, *sig_ids: str, logs: Iterable[str] | None = None) -> list[LogEvent]:
        """Events of these signatures (or "family." prefixes) across logs, oldest first when timed."""
        want = tuple(logs) if logs is not None else None
        out: list[LogEvent] = []
        for s in self.scans:
            if want is not None and not any(s.log == w or s.log.startswith(w + ":") for w in want):
                continue
            out.extend(s.of(*sig_ids))
        return sorted(out, key=lambda e: (e.time is None, e.time or 0.0, e.source, e.offset))


# -- time -----------------------------------------------------------------------------------

def node_tz(facts: NodeFacts) -> tuple[dt.tzinfo, str]:
    """The zone the node's logs are written in, and where that came from."""
    extra = facts.settings.extra.get("log_tz")
    if extra is not None:
        return wallclock.zone(extra), f"settings: {extra}"
    meta = getattr(facts.root, "meta_merged", None)
    if isinstance(meta, dict):
        for key in ("tz", "utc_offset_s"):
            if meta.get(key) is not None:
                return wallclock.zone(meta[key]), f"meta.json {key}: {meta[key]}"
    name = facts.read_text("/etc/timezone", 256)
    if name and name.strip():
        return wallclock.zone(name.strip().splitlines()[0]), f"/etc/timezone: {name.strip()}"
    link = facts.root.readlink("/etc/localtime")
    if isinstance(link, str) and "zoneinfo/" in link:
        zname = link.split("zoneinfo/", 1)[1]
        return wallclock.zone(zname), f"/etc/localtime -> {link}"
    if facts.root.live and getattr(facts.root, "base", "/") == "/":
        local = dt.datetime.now().astimezone().tzinfo or dt.timezone.utc
        return local, f"local zone of this process ({local})"
    return dt.timezone.utc, "UTC (zone unknown)"


def _boot_time(facts: NodeFacts) -> float | None:
    text = facts.read_text("/proc/stat", 1 << 20)
    for line in (text or "").splitlines():
        if line.startswith("btime "):
            v = line.split()[1] if len(line.split()) > 1 else ""
            return float(v) if v.isdigit() else None
    return None


# -- opening --------------------------------------------------------------------------------

def open_log(facts: NodeFacts, src: LogSource) -> BinaryIO | Iterator[bytes] | Missing:
    """A binary file (fast path) or a line iterator for one log source."""
    if src.data is not None:
        return io.BytesIO(src.data)
    return facts.root.open_binary(src.path)


def _close(stream: Any) -> None:
    close = getattr(stream, "close", None)
    if callable(close):
        try:
            close()
        except Exception:
            pass


def _read_kmsg(facts: NodeFacts) -> bytes | None:
    """The live kernel ring buffer: /dev/kmsg read without blocking (one record per read)."""
    if not facts.root.live:
        return None
    hp = facts.root.host_path("/dev/kmsg")
    if not hp:
        return None
    try:
        fd = os.open(hp, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    out: list[bytes] = []
    total = 0
    try:
        while total < KMSG_MAX_BYTES:
            try:
                b = os.read(fd, 16384)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: records overwritten while reading, read on
                    continue
                break
            if not b:
                break
            out.append(b if b.endswith(b"\n") else b + b"\n")
            total += len(b)
    finally:
        os.close(fd)
    return b"".join(out) or None


# -- locating -------------------------------------------------------------------------------

def _sniff_format(facts: NodeFacts, path: str, default: str) -> str:
    if path.endswith(".json"):
        return "journal-json"
    head = facts.root.read_bytes(path, 4096)
    if isinstance(head, bytes):
        first = head.lstrip()[:200]
        if first.startswith(b"{") and (b"__REALTIME_TIMESTAMP" in first or b"MESSAGE" in first):
            return "journal-json"
    return default


def _newest(facts: NodeFacts, paths: Sequence[str]) -> str | None:
    best: tuple[float, str] | None = None
    for p in paths:
        st = facts.root.stat(p)
        if isinstance(st, Missing) or st.kind != "file":
            continue
        if best is None or st.mtime > best[0]:
            best = (st.mtime, p)
    return best[1] if best else None


def _exists(facts: NodeFacts, path: str) -> bool:
    st = facts.root.stat(path)
    if isinstance(st, Missing):
        if st.kind not in ("missing", "not-captured"):
            facts.gap(st)
        return False
    return st.kind in ("file", "chr")


def _candidates(facts: NodeFacts, name: str) -> Iterator[LogSource]:
    setting = getattr(facts.settings, _SETTING[name], None)
    if setting:
        default = "kernel" if name == "kernel" else "klog"
        if _exists(facts, setting):
            yield LogSource(name, setting, _sniff_format(facts, setting, default))
        else:
            facts.gap(setting, f"{name} log from settings: not readable")
    for path, fmt, filt in CANDIDATES[name]:
        if path == "/dev/kmsg":
            data = _read_kmsg(facts)
            if data:
                yield LogSource(name, path, fmt, data=data)
            continue
        if "*" in path:
            newest = _newest(facts, glob(facts.root, path))
            if newest:
                yield LogSource(name, newest, fmt, filt)
            continue
        if _exists(facts, path):
            yield LogSource(name, path, fmt if fmt == "kernel" else _sniff_format(facts, path, fmt), filt)


def _probe_journal(facts: NodeFacts, unit: str) -> bytes | None:
    """The hook for a live journal: `probes.journal[unit]` holding `journalctl -o json` text."""
    if not facts.root.live:
        return None
    try:
        probes = facts.maybe("probes")
    except Exception:
        return None
    journal = probe_field(probes, "journal") or probe_field(probe_field(probes, "extra"), "journal")
    text = probe_field(journal, unit) or probe_field(journal, f"{unit}.service")
    if isinstance(text, str):
        return text.encode("utf-8", "replace")
    if isinstance(text, (bytes, bytearray)):
        return bytes(text)
    return None


# -- scanning -------------------------------------------------------------------------------

class _Scanner:
    """Scans sources of one node with one time context; re-opens a source for follow-ups."""

    def __init__(self, facts: NodeFacts) -> None:
        self.facts = facts
        self.tz, self.tz_label = node_tz(facts)
        self.ref = facts.now
        self.boot = None
        self._boot_read = False
        self.max_bytes = facts.settings.log_max_bytes

    def decoder_for(self, src: LogSource):
        if src.fmt == "kernel" and not self._boot_read:
            self.boot, self._boot_read = _boot_time(self.facts), True
        return decoder(src.fmt, self.ref, self.tz, self.boot)

    def run(self, src: LogSource, sigs: Sequence[Signature], *, start: int = 0, first_only: bool = False,
            max_bytes: int | None = None, edges: bool = True, align: bool = False,
            stop: int | None = None) -> LogScan | Missing:
        stream = open_log(self.facts, src)
        if isinstance(stream, Missing):
            return stream
        size = len(src.data) if src.data is not None else None
        if size is None and not hasattr(stream, "readinto"):
            st = self.facts.root.stat(src.path)
            size = st.size if isinstance(st, StatInfo) and st.kind == "file" else None
        try:
            s = self.facts.settings
            file = hasattr(stream, "readinto") and src.data is None
            main = start == 0 and not first_only and edges and not align and stop is None
            if main and file and (s.log_cursors is not None or (s.log_window_s and src.log in WINDOW_LOGS)):
                return self._bounded(src, sigs, stream, max_bytes or self.max_bytes)  # type: ignore[arg-type]
            if not main and file and not align and stop is None and isinstance(s.log_cursors, LogCursors):
                return self._follow_on(src, sigs, stream, start, first_only, s.log_cursors,  # type: ignore[arg-type]
                                       max_bytes or self.max_bytes)
            return scan(stream, sigs, self.decoder_for(src), log=src.log, source=src.path, fmt=src.fmt,
                        start=start, max_bytes=max_bytes or self.max_bytes, line_filter=src.line_filter,
                        first_only=first_only, edges=edges, align_start=align, size=size, stop=stop)
        finally:
            _close(stream)

    def _follow_on(self, src: LogSource, sigs: Sequence[Signature], f: BinaryIO, start: int, first_only: bool,
                   cursors: "LogCursors", max_bytes: int) -> LogScan:
        """A follow-up search from `start` to the end, incremental across checks like the main pass:
        a call left open is searched after once, then only in what the log gained since."""
        size = _fsize(f)
        kw: dict[str, Any] = dict(log=src.log, source=src.path, fmt=src.fmt, max_bytes=max_bytes,
                                  line_filter=src.line_filter, first_only=first_only, edges=False)
        decode = self.decoder_for(src)
        if size is None:
            return scan(f, sigs, decode, start=start, **kw)
        stop = _last_line_end(f, size)
        key, ident, ids = ("follow", src.log, src.path, start, first_only), _ident(f), tuple(x.id for x in sigs)
        prev = cursors.resume(key, ident, ids, f, stop)
        _pread(f, 0, 0)
        if prev is None:
            got = scan(f, sigs, decode, start=start, stop=stop, **kw)
        elif first_only and prev.scan.events:
            got = prev.scan  # the first line after `start` stays the first as the log grows
        else:
            got = merge(prev.scan, scan(f, sigs, decode, start=prev.end, stop=stop, **kw), sigs)
        cursors.store(key, ident, ids, f, stop, got)
        return got

    def _bounded(self, src: LogSource, sigs: Sequence[Signature], f: BinaryIO, max_bytes: int) -> LogScan:
        """The main pass of a file, incremental (log_cursors) and/or over a time window (log_window_s)."""
        decode = self.decoder_for(src)
        kw: dict[str, Any] = dict(log=src.log, source=src.path, fmt=src.fmt, max_bytes=max_bytes,
                                  line_filter=src.line_filter)
        size = _fsize(f)
        cursors: LogCursors | None = self.facts.settings.log_cursors
        if not isinstance(cursors, LogCursors):
            cursors = None
        key, ident = (src.log, src.path), _ident(f)
        ids = tuple(s.id for s in sigs)
        stop = _last_line_end(f, size) if cursors is not None and size is not None else None
        if cursors is not None and stop is not None:
            prev = cursors.resume(key, ident, ids, f, stop)
            if prev is not None:
                _pread(f, 0, 0)  # scan() reads from the current position when start is 0
                got = merge(prev.scan, scan(f, sigs, decode, start=prev.end, stop=stop, **kw), sigs)
                cursors.store(key, ident, ids, f, stop, got)
                return got
        window = self.facts.settings.log_window_s
        start = 0
        if window and src.log in WINDOW_LOGS and size:
            start = _window_start(f, size, decode, self.ref - float(window), src.line_filter)
        _pread(f, 0, 0)
        got = scan(f, sigs, decode, start=start, stop=stop, align_start=start > 0, **kw)
        if start > 0 and got.start > 0:
            note = f"log window: scanned the last {_fmt_s(float(window or 0))} ({(size or 0) - got.start} of {size} bytes)"
            if src.log == "kubelet":
                got, note = self._look_back(f, sigs, decode, got, size or 0, stop, kw, note)
            got.problems.append(note)
        if cursors is not None and stop is not None:
            cursors.store(key, ident, ids, f, stop, got)
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
        at = _rfind_before(f, got.start, anchors, floor)
        if at is None:
            return got, note + "; no device-plugin call before it either"
        begin = _line_start(f, max(floor, at - LOOK_BACK_MARGIN))
        earlier = scan(f, sigs, decode, start=begin, stop=stop, align_start=True, **kw)
        return earlier, (f"log window: extended back to the latest device-plugin call "
                         f"({size - earlier.start} of {size} bytes)")

    def follow(self, src: LogSource):
        def follow(start: int, sigs: Sequence[Signature], first_only: bool, align: bool = False,
                   stop: int | None = None) -> LogScan:
            got = self.run(src, sigs, start=start, first_only=first_only, edges=False, align=align, stop=stop)
            if isinstance(got, Missing):
                raise OSError(str(got))
            return got

        return follow


class _Cursor:
    __slots__ = ("ident", "sig_ids", "end", "tail", "scan")

    def __init__(self, ident: tuple[int, int] | None, sig_ids: tuple[str, ...], end: int, tail: bytes,
                 scan: LogScan) -> None:
        self.ident, self.sig_ids, self.end, self.tail, self.scan = ident, sig_ids, end, tail, scan


class LogCursors:
    """Where the scan of each log file stopped, kept across checks by a long-running caller.

    The agent keeps one for its lifetime and passes it as `Settings(log_cursors=...)`: each check
    then reads only the bytes a log gained since the previous check (up to its last complete line)
    and merges them into the previous result (`logscan.merge`), so a 200 MB kubelet log costs its
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
        if c.tail and _pread(f, c.end - len(c.tail), len(c.tail)) != c.tail:
            return None
        return c

    def store(self, key: tuple[Any, ...], ident: tuple[int, int] | None, sig_ids: tuple[str, ...], f: BinaryIO,
              end: int, scan: LogScan) -> None:
        n = min(self.TAIL, end)
        self._by.pop(key, None)  # re-inserted last: the order is that of the latest store
        self._by[key] = _Cursor(ident, sig_ids, end, _pread(f, end - n, n) if n else b"", scan)
        while len(self._by) > self.MAX_ENTRIES:
            del self._by[next(iter(self._by))]


def _pread(f: BinaryIO, offset: int, n: int) -> bytes:
    try:
        f.seek(offset)
        return f.read(n) or b""
    except (OSError, ValueError):
        return b""


def _fsize(f: BinaryIO) -> int | None:
    try:
        return os.fstat(f.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        return None


def _ident(f: BinaryIO) -> tuple[int, int] | None:
    try:
        st = os.fstat(f.fileno())
        return st.st_dev, st.st_ino
    except (AttributeError, OSError, ValueError):
        return None


def _last_line_end(f: BinaryIO, size: int) -> int:
    """Offset just after the last newline: a line still being written is left for the next scan."""
    n = min(size, MAX_LINE)
    tail = _pread(f, size - n, n)
    i = tail.rfind(b"\n")
    if i < 0:
        return size  # no newline in the last MAX_LINE bytes: a runaway line, taken whole
    return size - len(tail) + i + 1


def _line_start(f: BinaryIO, offset: int) -> int:
    lo = max(0, offset - MAX_LINE)
    head = _pread(f, lo, offset - lo)
    return lo + head.rfind(b"\n") + 1 if head else offset


def _line_time(f: BinaryIO, offset: int, decode: Any, line_filter: bytes | None) -> tuple[int, float] | None:
    """(line start, time) of the first timed line at or after `offset` (within WINDOW_GRAIN bytes)."""
    data = _pread(f, offset, WINDOW_GRAIN)
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


def _window_start(f: BinaryIO, size: int, decode: Any, since: float, line_filter: bytes | None) -> int:
    """A line start at most WINDOW_GRAIN before the first line timed `since` or later (bisection;
    log times are close to sorted), and never later than WINDOW_MIN_TAIL before the end."""
    first = _line_time(f, 0, decode, line_filter)
    if first is None or first[1] >= since:
        return 0
    lo, hi = 0, size
    while hi - lo > WINDOW_GRAIN:
        mid = (lo + hi) // 2
        got = _line_time(f, mid, decode, line_filter)
        if got is None or got[1] >= since:
            hi = mid  # untimed stretch: assume it is recent (scan more, never less)
        else:
            lo = min(max(got[0], mid), hi)
    return max(0, min(lo, size - WINDOW_MIN_TAIL))


def _rfind_before(f: BinaryIO, end: int, anchors: Sequence[bytes], floor: int = 0) -> int | None:
    """Offset of the last occurrence of any anchor that starts before `end` (reading backwards)."""
    if not anchors:
        return None
    over = max(len(a) for a in anchors) - 1
    block = 8 * CHUNK
    hi = end
    while hi > floor:
        lo = max(floor, hi - block)
        data = _pread(f, lo, hi - lo + over)
        # occurrences starting before hi (those starting later were seen in the previous block)
        best = max(data.rfind(a, 0, hi - lo + len(a) - 1) for a in anchors)
        if best >= 0:
            return lo + best
        hi = lo
    return None


def _fmt_s(s: float) -> str:
    if s >= 3600 and s % 3600 == 0:
        return f"{s / 3600:g}h"
    if s >= 60 and s % 60 == 0:
        return f"{s / 60:g}m"
    return f"{s:g}s"


def parse_duration(text: str) -> float:
    """Seconds of '900', '90s', '15m', '2h', '1d' (for --log-window); ValueError otherwise."""
    t = text.strip().lower()
    mult = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(t[-1:], None)
    num = t[:-1] if mult else t
    v = float(num) * (mult or 1)
    if not v > 0 or v != v or v == float("inf"):
        raise ValueError(f"not a positive duration: {text!r}")
    return v


def _found(s: LogScan) -> bool:
    """Did a (possibly filtered) source hold any line of this log?"""
    return bool(s.events) or s.first_time is not None or s.last_time is not None


def _scan_first(sc: _Scanner, name: str, sources: Iterable[LogSource]) -> tuple[LogScan, LogSource] | None:
    sigs = logsignatures.for_log(name)
    for src in sources:
        try:
            got = sc.run(src, sigs)
        except Exception as exc:  # one unreadable log must not cost the others
            sc.facts.gap(src.path, f"{name} log scan failed: {type(exc).__name__}: {exc}")
            continue
        if isinstance(got, Missing):
            if got.kind not in ("missing",):
                sc.facts.gap(got)
            continue
        for p in got.problems:
            sc.facts.gap(src.path, p)
        if src.line_filter and not _found(got):
            continue  # e.g. /var/log/messages without a single kubelet line
        return got, src
    return None


def pod_log_sources(root: Root) -> tuple[list[LogSource], dict[str, str]]:
    """The NVIDIA pods' log files worth scanning (current and previous instance), and pod UID -> "ns/name"."""
    names = root.listdir(POD_LOGS)
    if isinstance(names, Missing):
        return [], {}
    uids: dict[str, str] = {}
    out: list[LogSource] = []
    for d in names:
        parsed = cri_log.parse_path(f"{POD_LOGS}/{d}/x/0.log")
        if parsed is None:
            continue
        uids[parsed.uid] = f"{parsed.namespace}/{parsed.pod}"
        if not any(h in d.lower() for h in NVIDIA_POD_HINTS):
            continue
        containers = root.listdir(f"{POD_LOGS}/{d}")
        if isinstance(containers, Missing):
            continue
        for c in containers:
            files = root.listdir(f"{POD_LOGS}/{d}/{c}")
            if isinstance(files, Missing):
                continue
            logs = [f for f in files if f.endswith(".log")]
            # the current and the previous instance: a crash-looping container's error is in either
            logs.sort(key=lambda f: (int(f.split(".")[0]) if f.split(".")[0].isdigit() else -1), reverse=True)
            for f in logs[:2]:
                if len(out) >= MAX_POD_LOGS:
                    break
                out.append(LogSource(f"pod:{parsed.namespace}/{parsed.pod}/{c}", f"{POD_LOGS}/{d}/{c}/{f}", "cri"))
    return out, uids


@fact("logs")
def collect_logs(facts: NodeFacts) -> LogFacts:
    sc = _Scanner(facts)
    result = LogFacts([], sc.ref, sc.tz_label)
    kubelet_src: LogSource | None = None
    for name in ("kubelet", "containerd", "kernel"):
        got = _scan_first(sc, name, _candidates(facts, name))
        if got is None and name in ("kubelet", "containerd"):
            data = _probe_journal(facts, name)
            if data:
                got = _scan_first(sc, name, [LogSource(name, f"probes:journal:{name}", "journal-json", data=data)])
        if got is None:
            why = "no file" + ("; journald not read" if name != "kernel" else "")
            result.not_found[name] = why
            facts.gap(f"{name} log", why)
            continue
        result.scans.append(got[0])
        if name == "kubelet":
            kubelet_src = got[1]
    pod_srcs, result.pod_names = pod_log_sources(facts.root)
    pod_sigs = logsignatures.for_log("pod")
    for src in pod_srcs:
        try:
            got = sc.run(src, pod_sigs, max_bytes=POD_LOG_MAX_BYTES)
        except Exception as exc:
            facts.gap(src.path, f"pod log scan failed: {type(exc).__name__}: {exc}")
            continue
        if isinstance(got, Missing):
            facts.gap(got)
            continue
        result.scans.append(got)
    if not result.scans:
        raise FactUnavailable("no kubelet, containerd, kernel or NVIDIA pod log found "
                              f"(looked in {BUNDLE_LOGS}, /var/log, {POD_LOGS}; journald not read)")
    if kubelet_src is not None:
        result.devicemanager = interpret(result.kubelet, sc.follow(kubelet_src), sc.ref)  # type: ignore[arg-type]
        for p in result.devicemanager.problems:
            facts.gap(kubelet_src.path, p)
    return result


def scan_path(root: Any, path: str, log: str = "kubelet", fmt: str = "klog", *, ref_time: float,
              tz: dt.tzinfo = dt.timezone.utc, phase: str = "main",
              line_filter: bytes | None = None) -> LogScan | Missing:
    """Scan one file of a root with the shipped signatures of a log kind (tools, tests)."""
    facts = NodeFacts(root, now=ref_time)
    src = LogSource(log, path, fmt, line_filter)
    stream = open_log(facts, src)
    if isinstance(stream, Missing):
        return stream
    try:
        return scan(stream, logsignatures.for_log(log.split(":", 1)[0], phase), decoder(fmt, ref_time, tz),
                    log=log, source=path, fmt=fmt, line_filter=line_filter)
    finally:
        _close(stream)
