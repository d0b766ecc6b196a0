"""Xid and SXid events of the kernel log, classified (data/xid.yaml) and tied to the node's GPUs.

The `kernel.xid` signature finds `NVRM: Xid (PCI:0000:3b:00): 79, pid=…, GPU has fallen off the
bus.` lines (also `…: 79` with nothing after the number); this section turns each into an
`XidEvent`: the Xid's classification, the GPU it names (the PCI address compared without
function against /proc/driver/nvidia/gpus and nvidia-smi), whether it happened in the current
boot (its time at or after `btime` of /proc/stat; a /dev/kmsg capture holds the current boot
only) and, for the NVLink5 Xids 144-150, NVIDIA's decode of the line for the loaded driver branch.
It also reads NVSwitch SXids (`SxidEvent`), the classic three-line lost-GPU message
(`NVRM: The NVIDIA GPU 0000:b3:00.0` … `fallen off the bus and is not responding to commands.`,
one record or three lines: `LostGpu`), and keeps every NVRM / nvidia-nvswitch line that mentions
an Xid or SXid but could not be read (`unparsed`), so that nothing matched halfway is dropped
silently. Rules other than the Xid rules read the same GPU map (`gpus`) to name a GPU from a PCI
address.
"""

from __future__ import annotations

from msgspec import Struct, field
from msgspec.structs import replace

from gpuwarden import xid as xidtable
from gpuwarden.logs.scan import LogEvent
from gpuwarden.facts.boot import boot_time
from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.findings import Affected
from gpuwarden.parsers import lazyre, plausible

#: an event this long before btime still counts as this boot (clock skew of the log's times)
BOOT_SLACK_S = 120.0
#: the lines of a three-line lost-GPU message lie within this many bytes of its first line
LOST_SPAN = 1024
#: a follow-on Xid whose line names no cause is tied to another Xid of its GPU this recent
FOLLOW_S = 60.0
#: rsyslog writes a record's newlines as "#012"; /dev/kmsg as "\x0a" (unescaped by the parser)
_NEWLINE = lazyre.compile(r"#012|\\x0a")


class GpuRef(Struct, frozen=True):
    """A GPU as the Xid facts name it (bus id, uuid, minor)."""
    key: str  # "0000:3b:00"
    bus_id: str = ""
    uuid: str = ""
    minor: int | None = None
    model: str = ""
    index: int | None = None  # NVML's (nvidia-smi's) index: the GPU's place in PCI bus order

    def affected(self, detail: str = "") -> Affected:
        d = ", ".join(x for x in (f"GPU {self.index}" if self.index is not None else "", self.bus_id, self.model,
                                  f"minor {self.minor}" if self.minor is not None else "", detail) if x)
        return Affected("gpu", self.uuid or self.bus_id or self.key, detail=d, index=self.index, uuid=self.uuid,
                        bus_id=self.bus_id or self.key, minor=self.minor)


class XidEvent(Struct, frozen=True):
    """One Xid from the kernel log, classified and tied to its GPU."""
    xid: int
    info: xidtable.XidInfo
    device: str  # as written: "PCI:0000:3b:00"
    key: str | None
    detail: str
    event: LogEvent
    current_boot: bool | None  # None: no time to tell
    nvlink5: xidtable.Nvlink5Decode | None = None  # Xids 144-150
    #: a follow-on Xid (45) tied to the Xid it follows on the same GPU: the number its line names
    #: ("caused by previous Xid 149"), else the last other Xid of the GPU within FOLLOW_S before it
    cause: int | None = None

    @property
    def time(self) -> float | None:
        return self.event.time


class SxidEvent(Struct, frozen=True):
    """`nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)`."""

    sxid: int
    switch: str  # "nvidia-nvswitch0"
    device: str
    key: str | None
    fatality: str  # "Fatal" | "Non-fatal" | "" (the line does not say)
    link: str
    detail: str
    event: LogEvent
    current_boot: bool | None

    @property
    def fatal(self) -> bool | None:
        return {"fatal": True, "non-fatal": False}.get(self.fatality.lower())


class LostGpu(Struct, frozen=True):
    """The classic lost-GPU message, its lines joined: the GPU it names and its evidence."""

    key: str | None
    device: str
    events: tuple[LogEvent, ...]
    current_boot: bool | None


class XidFacts(Struct):
    """Xids, SXids and lost GPUs of the node's kernel log."""
    events: list[XidEvent]
    boot_time: float | None
    gpus: dict[str, GpuRef] = field(default_factory=dict)
    source: str = ""
    sxids: list[SxidEvent] = field(default_factory=list)
    lost: list[LostGpu] = field(default_factory=list)
    #: NVRM / nvidia-nvswitch lines naming an Xid or SXid that no signature could read
    unparsed: list[LogEvent] = field(default_factory=list)
    unparsed_count: int = 0
    driver_branch: int | None = None

    def current(self) -> list[XidEvent]:
        """Events of the current boot (or of unknown time)."""
        return [e for e in self.events if e.current_boot is not False]

    def gpu(self, key: str | None) -> GpuRef:
        if key and key in self.gpus:
            return self.gpus[key]
        return GpuRef(key or "unknown")

    def followers(self, key: str, causes: set[int]) -> list[XidEvent]:
        """The current boot's follow-on Xids of GPU `key` tied to one of `causes`."""
        return [e for e in self.current() if e.cause in causes and (e.key or e.device or "unknown") == key]

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
    # NVML enumerates GPUs in PCI bus order by default: nvidia-smi's and the device plugin's index
    return {k: replace(r, index=i) for i, (k, r) in enumerate(sorted(out.items()))}


def gpu_ref(facts: NodeFacts, uuid: str = "", bus_id: str = "") -> GpuRef | None:
    """The node's GPU with this UUID or PCI address, as gpu_map knows it (None when it does not)."""
    gpus = gpu_map(facts)
    k = xidtable.pci_key(bus_id)
    if k and k in gpus:
        return gpus[k]
    want = uuid.strip().lower()
    return next((r for r in gpus.values() if want and r.uuid.lower() == want), None)


def in_current_boot(t: float | None, boot: float | None) -> bool | None:
    if t is None or boot is None:
        return None
    return t >= boot - BOOT_SLACK_S


def lost_gpus(events: list[LogEvent], boot: float | None) -> list[LostGpu]:
    """Join the lost-GPU message's lines: a record holding all of it, or a header line
    (`NVRM: The NVIDIA GPU <bdf>`) followed within LOST_SPAN bytes by the `fallen off the bus and is
    not responding to commands.` line. A header alone is not a lost GPU: the driver opens its
    "not supported by this driver release" message with the same words."""
    out: list[LostGpu] = []
    header: LogEvent | None = None
    for ev in sorted(events, key=lambda e: e.offset):
        whole = _NEWLINE.sub("\n", ev.message)
        if ev.get("device"):
            if "fallen off the bus" in whole:
                out.append(LostGpu(xidtable.pci_key(ev.get("device")), ev.get("device"), (ev,),
                                   in_current_boot(ev.time, boot)))
                header = None
            else:
                header = ev
        elif ev.get("tail") and header is not None and 0 <= ev.offset - header.offset <= LOST_SPAN:
            out.append(LostGpu(xidtable.pci_key(header.get("device")), header.get("device"), (header, ev),
                               in_current_boot(header.time if header.time is not None else ev.time, boot)))
            header = None
    return out


def _branch(facts: NodeFacts) -> int | None:
    driver = facts.maybe("driver")
    v = getattr(driver, "version", None) if driver is not None else None
    try:
        return v.branch if v is not None else None
    except (ValueError, AttributeError):
        return None


def _tie_follow_ons(events: list[XidEvent]) -> list[XidEvent]:
    """Tie each follow-on Xid (the catalog's 45; 154 keeps its own recovery action) to its cause."""
    out: list[XidEvent] = []
    last: dict[str, tuple[int, float | None]] = {}  # GPU -> the last root Xid and its time
    for e in events:
        k = e.key or e.device or "unknown"
        if not e.info.follow_on or e.xid == 154:
            last[k] = (e.xid, e.time)
            out.append(e)
            continue
        cause = xidtable.named_cause(e.detail)
        if cause is None and k in last:
            x, t = last[k]
            if t is None or e.time is None or 0 <= e.time - t <= FOLLOW_S:
                cause = x
        out.append(replace(e, cause=cause) if cause is not None else e)
    return out


@fact("xids")
def collect_xids(facts: NodeFacts) -> XidFacts:
    logs = facts.get("logs")
    kernel = logs.kernel
    if kernel is None:
        raise FactUnavailable("no kernel log: " + logs.not_found.get("kernel", "not found"))
    boot = boot_time(facts)
    branch = _branch(facts)
    out: list[XidEvent] = []
    read: set[int] = set()
    for ev in kernel.of("kernel.xid"):
        raw = ev.get("xid")
        if not plausible.decimal(raw):
            continue
        x = int(raw)
        device = ev.get("device")
        detail = ev.get("detail").strip()
        nvl = xidtable.decode_nvlink5(x, detail, branch) if 144 <= x <= 150 else None
        out.append(XidEvent(x, xidtable.classify(x), device, xidtable.pci_key(device), detail, ev,
                            in_current_boot(ev.time, boot), nvl))
        read.add(ev.offset)
    out = _tie_follow_ons(out)
    sxids: list[SxidEvent] = []
    for ev in kernel.of("kernel.sxid"):
        sxids.append(SxidEvent(int(ev.get("sxid")), f"nvidia-nvswitch{ev.get('switch')}", ev.get("device"),
                               xidtable.pci_key(ev.get("device")), ev.get("fatality"), ev.get("link"),
                               ev.get("detail").strip(), ev, in_current_boot(ev.time, boot)))
        read.add(ev.offset)
    unparsed = [e for e in kernel.of("kernel.nvidia-unplaced")
                if e.offset not in read and in_current_boot(e.time, boot) is not False]
    # all of them kept: the list is the count; more lines than `keep`: the count (of every boot) says how many
    seen = kernel.count("kernel.nvidia-unplaced")
    count = len(unparsed) if seen <= len(kernel.of("kernel.nvidia-unplaced")) else max(
        len(unparsed), seen - kernel.count("kernel.xid") - kernel.count("kernel.sxid"))
    return XidFacts(out, boot, gpu_map(facts), kernel.source, sxids, lost_gpus(kernel.of("kernel.gpu-lost"), boot),
                    unparsed, count, branch)
