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

Logs are big, so they are scanned by the log engine (`gpuwarden.logs`), not parsed: only lines
matching a signature of `data/log_signatures.yaml` are kept, with their times. Times without a year or zone (klog,
BSD syslog) are read in the node's zone (`/etc/timezone`, `/etc/localtime`, the bundle's
`meta.json` "tz", or Settings.extra["log_tz"]) with the year taken from `facts.now`.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Iterable, Iterator, Sequence

from msgspec import Struct, field

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.facts.probes import result_field as probe_field
from gpuwarden.logs import signatures as logsignatures
from gpuwarden.logs.devicemanager import DeviceManagerLog, interpret
from gpuwarden.logs.scan import LogEvent, LogScan
from gpuwarden.logs.scanner import LogSource, Scanner
from gpuwarden.parsers import cri_log, plausible, wallclock
from gpuwarden.root import Missing, Root, glob

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

class LogFacts(Struct):
    """What the node's logs said: the scans and the device-manager calls."""
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


# -- opening --------------------------------------------------------------------------------

def _read_kmsg(facts: NodeFacts) -> bytes | None:
    """The live kernel ring buffer: /dev/kmsg read without blocking (one record per read)."""
    if not facts.root.live:
        return None
    try:
        fd = facts.root.open_fd("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)  # beneath the root, like every open
    except (OSError, AttributeError):  # AttributeError: a root without opens (only a live root has them)
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

def _found(s: LogScan) -> bool:
    """Did a (possibly filtered) source hold any line of this log?"""
    return bool(s.events) or s.first_time is not None or s.last_time is not None


def _scan_first(facts: NodeFacts, sc: Scanner, name: str,
                sources: Iterable[LogSource]) -> tuple[LogScan, LogSource] | None:
    sigs = logsignatures.for_log(name)
    for src in sources:
        try:
            got = sc.run(src, sigs)
        except Exception as exc:  # one unreadable log must not cost the others
            facts.gap(src.path, f"{name} log scan failed: {type(exc).__name__}: {exc}")
            continue
        if isinstance(got, Missing):
            if got.kind not in ("missing",):
                facts.gap(got)
            continue
        for p in got.problems:
            facts.gap(src.path, p)
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
        parsed = cri_log.parse_pod_dir(d)
        if parsed is None:
            continue
        ns, pod, uid = parsed
        uids[uid] = f"{ns}/{pod}"
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
            logs.sort(key=lambda f: (int(f.split(".")[0]) if plausible.decimal(f.split(".")[0]) else -1), reverse=True)
            for f in logs[:2]:
                if len(out) >= MAX_POD_LOGS:
                    break
                out.append(LogSource(f"pod:{ns}/{pod}/{c}", f"{POD_LOGS}/{d}/{c}/{f}", "cri"))
    return out, uids


@fact("logs")
def collect_logs(facts: NodeFacts) -> LogFacts:
    tz, tz_label = node_tz(facts)
    s = facts.settings
    sc = Scanner(facts.root, facts.now, tz, boot=lambda: facts.maybe("boot"), max_bytes=s.log_max_bytes,
                 window_s=s.log_window_s, cursors=s.log_cursors)
    result = LogFacts([], sc.ref, tz_label)
    kubelet_src: LogSource | None = None
    for name in ("kubelet", "containerd", "kernel"):
        got = _scan_first(facts, sc, name, _candidates(facts, name))
        if got is None and name in ("kubelet", "containerd"):
            data = _probe_journal(facts, name)
            if data:
                got = _scan_first(facts, sc, name, [LogSource(name, f"probes:journal:{name}", "journal-json", data=data)])
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
