"""Container log files under /var/log/pods: the CRI format, and docker's json-file.

CRI (kubelet `pkg/kubelet/kuberuntime/logs`, written by containerd and CRI-O):

    2025-08-05T16:40:16.431856123+08:00 stderr F E0805 08:40:16.431856 303 main.go:213] Failed …

time (RFC 3339 with nanoseconds), stream (stdout/stderr), tag (F = full line, P = partial: the
runtime split a long line and the next P/F lines continue it), then the text.
dockershim-era files are docker json-file lines: {"log":"…\\n","stream":"stderr","time":"…"}.

Pod log paths: /var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log.
"""

from __future__ import annotations

import json
from typing import Iterable, Iterator

from msgspec import Struct

from gpuwarden.parsers import lazyre, plausible, wallclock

_CRI = lazyre.compile(r"(?P<ts>[0-9]{4}-[0-9][0-9]-[0-9][0-9]T\S+) (?P<stream>stdout|stderr) (?P<tag>[A-Z])(?::\S*)? ?")
_POD_DIR = lazyre.compile(r"(?P<ns>[^_/]+)_(?P<pod>[^_/]+)_(?P<uid>[0-9a-fA-F-]{8,})")


class CriLine(Struct, frozen=True):
    """One line of a CRI container log file."""
    time: float | None
    stream: str  # "stdout" | "stderr"
    partial: bool
    message: str


class PodLogPath(Struct, frozen=True):
    """What a /var/log/pods path names: pod, uid, container and restart."""
    namespace: str
    pod: str
    uid: str
    container: str
    restart: int | None


def parse_line(line: str) -> CriLine | None:
    """One line of a container log (CRI or docker json-file), or None."""
    line = line.rstrip("\r\n")
    m = _CRI.match(line)
    if m:
        return CriLine(wallclock.rfc3339_epoch(m.group("ts")), m.group("stream"), m.group("tag") == "P",
                       line[m.end():])
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except ValueError:
            return None
        if isinstance(obj, dict) and isinstance(obj.get("log"), str):
            msg = obj["log"]
            return CriLine(wallclock.rfc3339_epoch(str(obj.get("time", ""))), str(obj.get("stream", "")),
                           not msg.endswith("\n"), msg.rstrip("\n"))
    return None


def iter_messages(lines: Iterable[str | bytes]) -> Iterator[CriLine]:
    """Whole messages: partial lines joined with the line that completes them."""
    parts: list[CriLine] = []
    for raw in lines:
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        c = parse_line(line)
        if c is None:
            continue
        if c.partial:
            parts.append(c)
            continue
        if parts:
            c = CriLine(parts[0].time, c.stream, False, "".join(p.message for p in parts) + c.message)
            parts = []
        yield c
    if parts:
        yield CriLine(parts[0].time, parts[0].stream, True, "".join(p.message for p in parts))


def parse_pod_dir(name: str) -> tuple[str, str, str] | None:
    """(namespace, pod, uid) of a /var/log/pods/<ns>_<pod>_<uid> directory name, None for another name.

    Neither a namespace (a DNS label) nor a pod name (a DNS subdomain) can hold "_", so the name
    splits in exactly three; the UID is hex digits and dashes.
    """
    m = _POD_DIR.fullmatch(name)
    return (m.group("ns"), m.group("pod"), m.group("uid")) if m else None


def parse_path(path: str) -> PodLogPath | None:
    """Who a /var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log file belongs to."""
    parts = path.rstrip("/").split("/")
    if len(parts) < 3:
        return None
    pod = parse_pod_dir(parts[-3])
    if pod is None:
        return None
    base = parts[-1].split(".", 1)[0]
    return PodLogPath(*pod, parts[-2], int(base) if plausible.decimal(base) else None)
