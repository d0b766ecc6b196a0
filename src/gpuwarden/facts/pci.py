"""NVIDIA PCI functions as sysfs shows them: which GPUs and NVSwitches exist on the bus.

`/sys/bus/pci/devices/<domain:bus:dev.fn>/` gives per function `vendor` (0x10de = NVIDIA),
`class` (0x0302xx 3D controller and 0x0300xx VGA = GPU, 0x0680xx = NVSwitch bridge), the bound
`driver` (a link to .../drivers/nvidia, vfio-pci …), the PCIe link (`current_link_speed`
"16.0 GT/s PCIe", `max_link_speed`, `current_link_width` "16", `max_link_width`), AER counters
(`aer_dev_correctable`, `aer_dev_nonfatal`, `aer_dev_fatal`: "<name> <count>" lines ending in
TOTAL_ERR_*), and `config` (config space; all 0xff when the device no longer answers on the bus,
what lspci prints as "rev ff").
"""

from __future__ import annotations

from msgspec import Struct, field

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.parsers import plausible
from gpuwarden.root import Missing
from gpuwarden.xid import pci_key

PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA_VENDOR = "0x10de"
LINK_FILES = ("current_link_speed", "max_link_speed", "current_link_width", "max_link_width")
AER_FILES = ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal")


class PciFunction(Struct):
    """A PCI function of an NVIDIA device, from sysfs."""
    bdf: str  # "0000:3b:00.0"
    device_id: str  # "0x2335"
    pci_class: str  # "0x030200"
    #: bound driver ("nvidia", "vfio-pci"); None = unbound (live only); "" = unknown (not captured)
    driver: str | None
    link: dict[str, str] = field(default_factory=dict)
    aer: dict[str, dict[str, int]] = field(default_factory=dict)
    config_all_ff: bool | None = None
    source: str = ""

    @property
    def key(self) -> str | None:
        return pci_key(self.bdf)

    @property
    def is_gpu(self) -> bool:
        return self.pci_class.lower().startswith(("0x0300", "0x0302"))

    @property
    def is_nvswitch(self) -> bool:
        return self.pci_class.lower().startswith("0x0680")

    def aer_total(self, kind: str) -> int | None:
        counters = self.aer.get(kind)
        if not counters:
            return None
        totals = [v for k, v in counters.items() if k.startswith("TOTAL_ERR")]
        return totals[0] if totals else sum(counters.values())


class PciFacts(Struct):
    """The node's NVIDIA PCI functions."""
    functions: list[PciFunction]  # NVIDIA functions only

    def gpus(self) -> list[PciFunction]:
        return [f for f in self.functions if f.is_gpu]

    def nvswitches(self) -> list[PciFunction]:
        return [f for f in self.functions if f.is_nvswitch]

    def by_key(self) -> dict[str, PciFunction]:
        return {f.key: f for f in self.functions if f.key and f.bdf.endswith(".0")}


def _counters(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and plausible.decimal(parts[1]):
            out[parts[0]] = int(parts[1])
    return out


def _small(facts: NodeFacts, path: str) -> str | None:
    t = facts.root.read_text(path, 8192)
    return None if isinstance(t, Missing) else t.strip()


def _link_value_possible(name: str, v: str) -> bool:
    """A width sysfs can show (x1 .. x32), or a speed ("16.0 GT/s PCIe", "Unknown") below 256 GT/s."""
    if name.endswith("width"):
        return plausible.digits(v, 32) in plausible.LINK_WIDTHS
    head = v.split()[0] if v.split() else ""
    try:
        return not plausible.decimal(head[:1]) or 0 < float(head) < 256
    except ValueError:
        return False


@fact("pci")
def collect_pci(facts: NodeFacts) -> PciFacts:
    names = facts.root.listdir(PCI_DEVICES)
    if isinstance(names, Missing):
        raise FactUnavailable(f"{PCI_DEVICES} cannot be listed ({names.kind})")
    out: list[PciFunction] = []
    for bdf in names:
        d = f"{PCI_DEVICES}/{bdf}"
        if (_small(facts, f"{d}/vendor") or "").lower() != NVIDIA_VENDOR:
            continue
        link = facts.root.readlink(f"{d}/driver")
        if isinstance(link, str):
            driver: str | None = link.rstrip("/").rsplit("/", 1)[-1]
        else:
            driver = None if (facts.root.live and link.kind == "missing") else ""
        fn = PciFunction(bdf, _small(facts, f"{d}/device") or "", _small(facts, f"{d}/class") or "", driver,
                         source=d)
        for name in LINK_FILES:
            v = _small(facts, f"{d}/{name}")
            if v and not _link_value_possible(name, v):
                facts.gap(f"{d}/{name}", f"unreadable: {v[:40]!r} is not a possible PCIe link value")
            elif v:
                fn.link[name] = v
        for name in AER_FILES:
            v = _small(facts, f"{d}/{name}")
            if v:
                fn.aer[name] = _counters(v)
        cfg = facts.root.read_bytes(f"{d}/config", 64)
        if isinstance(cfg, bytes) and len(cfg) >= 4:
            fn.config_all_ff = all(b == 0xFF for b in cfg)
        out.append(fn)
    return PciFacts(out)
