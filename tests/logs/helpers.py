"""Small standalone nodes for the log tests: a bundle directory or a live tree in tmp."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from zoneinfo import ZoneInfo

from gpuwarden.facts import NodeFacts, Settings
from gpuwarden.root import BundleRoot, HostRoot

SH = ZoneInfo("Asia/Shanghai")
#: 2025-07-30 21:05:00 +08:00: three minutes after the incident's last kubelet line
CAPTURED = dt.datetime(2025, 7, 30, 21, 5, tzinfo=SH).timestamp()
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def kline(t: str, pid: int, src: str, body: str, host: str = "ai-app-8-1-msxf", sev: str = "I") -> str:
    """A journalctl-short kubelet line: t = 'HH:MM:SS.ffffff' on Jul 30."""
    hms = t.split(".")[0]
    return f"Jul 30 {hms} {host} kubelet[{pid}]: {sev}0730 {t} {pid} {src}] {body}\n"


def gpa(t: str, pid: int, uid: str, container: str) -> str:
    return kline(t, pid, "manager.go:956",
                 f'"Issuing a GetPreferredAllocation call for container" containerName="{container}" podUID="{uid}"')


def alloc(t: str, pid: int, resource: str = "nvidia.com/gpu", dev: str = "GPU-1") -> str:
    return kline(t, pid, "manager.go:819",
                 f'"Making allocation request for device plugin" devices=[{dev}] resourceName="{resource}"')


def noise(t: str, pid: int) -> str:
    return kline(t, pid, "manager.go:919", 'ignoring container "/system.slice/sssd-ssh.socket"')


def syncloop(t: str, pid: int, what: str = "(housekeeping)") -> str:
    return kline(t, pid, "kubelet.go:2392", f'"SyncLoop {what}"')


def adding(t: str, pid: int, pod: str, op: str = "Adding new") -> str:
    return kline(t, pid, "config.go:398", f'"{op} pods from source" source="api" pods=[{pod}]')


def bundle(tmp: Path, files: dict[str, str | bytes], captured_at: float = CAPTURED, meta: dict | None = None,
           tz: str | None = "Asia/Shanghai") -> BundleRoot:
    d = tmp / "node"
    for path, data in files.items():
        f = d / "files" / path.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data if isinstance(data, bytes) else data.encode())
    if tz:
        f = d / "files/etc/timezone"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(tz + "\n")
    m = {"format": "gpuwarden.bundle/v1", "captured_at": captured_at}
    m.update(meta or {})
    d.mkdir(parents=True, exist_ok=True)
    (d / "meta.json").write_text(json.dumps(m))
    return BundleRoot(d)


def live(tmp: Path, files: dict[str, str | bytes]) -> HostRoot:
    for path, data in files.items():
        f = tmp / path.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data if isinstance(data, bytes) else data.encode())
    return HostRoot(str(tmp))


def facts(root, now: float | None = CAPTURED, **settings) -> NodeFacts:
    s = Settings(probes=False)
    for k, v in settings.items():
        setattr(s, k, v)
    return NodeFacts(root, s, now=now)
