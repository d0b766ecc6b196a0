"""`nvidia-smi -q -x`: per-GPU facts that /proc does not carry (MIG, persistence, ECC, remap)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SmiGpu:
    bus_id: str
    name: str = ""
    uuid: str = ""
    minor: int | None = None
    mig_current: str = ""
    mig_pending: str = ""
    persistence_mode: str = ""
    compute_mode: str = ""
    fields: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SmiReport:
    driver_version: str
    cuda_version: str
    gpus: list[SmiGpu]


def _t(el: ET.Element | None, path: str) -> str:
    if el is None:
        return ""
    x = el.find(path)
    return (x.text or "").strip() if x is not None and x.text else ""


def parse(text: str) -> SmiReport | None:
    # ElementTree rejects the external DOCTYPE nvidia-smi prints: drop it
    body = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("<!DOCTYPE"))
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return None
    gpus = []
    for g in root.findall("gpu"):
        minor = _t(g, "minor_number")
        flat = {
            "retired_pages_pending": _t(g, "retired_pages/pending_retirement"),
            "remap_pending": _t(g, "remapped_rows/remapping_pending"),
            "remap_failure": _t(g, "remapped_rows/remapping_failure_occurred"),
            "ecc_mode": _t(g, "ecc_mode/current_ecc"),
            "pcie_gen_current": _t(g, "pci/pci_gpu_link_info/pcie_gen/current_link_gen"),
            "pcie_gen_max": _t(g, "pci/pci_gpu_link_info/pcie_gen/max_link_gen"),
            "pcie_width_current": _t(g, "pci/pci_gpu_link_info/link_widths/current_link_width"),
            "pcie_width_max": _t(g, "pci/pci_gpu_link_info/link_widths/max_link_width"),
        }
        gpus.append(
            SmiGpu(
                bus_id=g.get("id", ""),
                name=_t(g, "product_name"),
                uuid=_t(g, "uuid"),
                minor=int(minor) if minor.isdigit() else None,
                mig_current=_t(g, "mig_mode/current_mig"),
                mig_pending=_t(g, "mig_mode/pending_mig"),
                persistence_mode=_t(g, "persistence_mode"),
                compute_mode=_t(g, "compute_mode"),
                fields={k: v for k, v in flat.items() if v},
            )
        )
    return SmiReport(_t(root, "driver_version"), _t(root, "cuda_version"), gpus)
