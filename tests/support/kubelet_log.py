"""Kubelet journal lines for the log tests, in the log incident's format and clock (Jul 30, Asia/Shanghai)."""

from __future__ import annotations


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
