"""Xid events of the kernel log, classified (data/xid.yaml) and tied to the node's GPUs.

The `kernel.xid` signature finds `NVRM: Xid (PCI:0000:3b:00): 79, pid=…, GPU has fallen off the
bus.` lines; this section turns each into an `XidEvent`: the Xid's classification, the GPU it
names (the PCI address compared without function against /proc/driver/nvidia/gpus and
nvidia-smi), and whether it happened in the current boot (its time at or after `btime` of
/proc/stat; a /dev/kmsg capture holds the current boot only). Rules other than the Xid rules
read the same GPU map (`gpus`) to name a GPU from a PCI address.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwarden import xid as xidtable
from gpuwarden.facts.logscan import LogEvent
from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.findings import Affected
from gpuwarden.parsers import proc_pid

#: an event this long before btime still counts as this boot (clock skew of the log's times)
BOOT_SLACK_S = 120.0


@dataclass(frozen=True)
class GpuRef:
    key: str  # "0000:3b:00"
    bus_id: str = ""
    uuid: str = ""
    minor: int | None = None
    model: str = ""

    def affected(self, detail: str = "") -> Affected:
        d = ", ".join(x for x in (self.bus_id, self.model, f"minor {self.minor}" if self.minor is not None else "",
                                  detail) if x)
        return Affected("gpu", self.uuid or self.bus_id or self.key, detail=d)


@dataclass(frozen=True)
class XidEvent:
    xid: int
    info: xidtable.XidInfo
    device: str  # as written: "PCI:0000:3b:00"
    key: str | None
    detail: str
    event: LogEvent
    current_boot: bool | None  # None: no time to tell

    @property
    def time(self) -> float | None:
        return self.event.time


@dataclass
class XidFacts:
    events: list[XidEvent]
    boot_time: float | None
    gpus: dict[str, GpuRef] = field(default_factory=dict)
    source: str = ""

    def current(self) -> list[XidEvent]:
        """Events of the current boot (or of unknown time)."""
        return [e for e in self.events if e.current_boot is not False]

    def gpu(self, key: str | None) -> GpuRef:
        if key and key in self.gpus:
            return self.gpus[key]
        return GpuRef(key or "unknown")

    def by_gpu(self, events: list[XidEvent]) -> dict[str, list[XidEvent]]:
        out: dict[str, list[XidEvent]] = {}
        for e in events:
            out.setdefault(e.key or e.device or "unknown", []).append(e)
        return out


def gpu_map(facts: NodeFacts) -> dict[str, GpuRef]:
    """PCI key -> what the driver and nvidia-smi say about that GPU."""
    out: dict[str, GpuRef] = {}
    driver = facts.maybe("driver")
    if driver is None:
        return out
    for g in driver.gpus:
        k = xidtable.pci_key(g.bus_id)
        if k:
            out[k] = GpuRef(k, g.bus_id, g.uuid, g.minor, g.model)
    for g in (driver.smi.gpus if driver.smi else []):
        k = xidtable.pci_key(g.bus_id)
        if not k:
            continue
        have = out.get(k)
        out[k] = GpuRef(k, have.bus_id if have else g.bus_id, (have.uuid if have else "") or g.uuid,
                        have.minor if have and have.minor is not None else g.minor,
                        (have.model if have else "") or g.name)
    return out


def boot_time(facts: NodeFacts) -> float | None:
    return proc_pid.boot_time(facts.read_text("/proc/stat") or "")


def in_current_boot(t: float | None, boot: float | None) -> bool | None:
    if t is None or boot is None:
        return None
    return t >= boot - BOOT_SLACK_S


@fact("xids")
def collect_xids(facts: NodeFacts) -> XidFacts:
    logs = facts.get("logs")
    kernel = logs.kernel
    if kernel is None:
        raise FactUnavailable("no kernel log: " + logs.not_found.get("kernel", "not found"))
    boot = boot_time(facts)
    out: list[XidEvent] = []
    for ev in kernel.of("kernel.xid"):
        raw = ev.get("xid")
        if not raw.isdigit():
            continue
        x = int(raw)
        device = ev.get("device")
        out.append(XidEvent(x, xidtable.classify(x), device, xidtable.pci_key(device), ev.get("detail").strip(), ev,
                            in_current_boot(ev.time, boot)))
    return XidFacts(out, boot, gpu_map(facts), kernel.source)
