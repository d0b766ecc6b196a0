"""`nvidia-smi -q -x`: per-GPU facts that /proc does not carry (MIG, persistence, ECC, remap)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from msgspec import Struct, field

from gpuwarden.parsers import plausible


class SmiGpu(Struct, frozen=True):
    """One GPU of `nvidia-smi -q -x`."""
    bus_id: str
    name: str = ""
    uuid: str = ""
    minor: int | None = None
    mig_current: str = ""
    mig_pending: str = ""
    persistence_mode: str = ""
    compute_mode: str = ""
    fields: dict[str, str] = field(default_factory=dict)
    #: framebuffer memory in bytes (used, free, total); None where not reported
    fb_used: int | None = None
    fb_free: int | None = None
    fb_total: int | None = None
    processes: tuple["SmiProcess", ...] = ()
    #: the `<mig_device>` entries listed under the GPU (nvidia-smi names no MIG device UUID there);
    #: None where the GPU has no `<mig_devices>` element
    mig_devices: int | None = None


class SmiProcess(Struct, frozen=True):
    """One `<process_info>`: type G (graphics), C (compute) or C+G, and the GPU memory it holds."""

    pid: int
    type: str
    name: str = ""
    used: int | None = None  # bytes


class SmiReport(Struct, frozen=True):
    """What `nvidia-smi -q -x` reported: versions and GPUs."""
    driver_version: str
    cuda_version: str
    gpus: list[SmiGpu]


def _t(el: ET.Element | None, path: str) -> str:
    if el is None:
        return ""
    x = el.find(path)
    return (x.text or "").strip() if x is not None and x.text else ""


def _ecc_sum(el: ET.Element | None, sram_only: bool = False) -> str:
    """Total uncorrectable ECC errors of a <volatile>/<aggregate> block, as text ("" when unknown).

    Hopper and later (DTD v12+): sram_uncorrectable_parity, sram_uncorrectable_secded,
    dram_uncorrectable; older GPUs: <double_bit><total>. "N/A" values are skipped.
    """
    if el is None:
        return ""
    total, seen = 0, False
    for child in el:
        tag = child.tag
        if sram_only and not tag.startswith("sram_"):
            continue
        if "uncorrectable" in tag and not tag.endswith("_sources"):
            vals = [child.text or ""]
        elif tag == "double_bit" and not sram_only:
            vals = [_t(child, "total")]
        else:
            continue
        for v in vals:
            v = v.strip()
            if plausible.decimal(v):
                total += int(v)
                seen = True
    return str(total) if seen else ""


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def mib_bytes(text: str) -> int | None:
    """'79536 MiB' -> bytes; None for 'N/A' or anything else."""
    parts = text.split()
    if len(parts) != 2 or parts[1] not in _UNITS:
        return None
    try:
        n = int(float(parts[0]) * _UNITS[parts[1]])
    except (ValueError, OverflowError):  # "nan", "inf"
        return None
    return n if plausible.size(n) else None


def _processes(g: ET.Element) -> tuple[SmiProcess, ...]:
    out = []
    for p in g.findall("processes/process_info"):
        pid = _t(p, "pid")
        if plausible.decimal(pid):
            out.append(SmiProcess(int(pid), _t(p, "type"), _t(p, "process_name"), mib_bytes(_t(p, "used_memory"))))
    return tuple(out)


_NUMBER = re.compile(r"^[-+]?([0-9]|nan|inf)", re.IGNORECASE)
_LEADING = re.compile(r"^([0-9]+)")
#: the elements that hold a size, matched in one pass (one pattern, not one per tag; issue 34)
_SIZE_TAGS = ("used", "free", "total", "used_memory")
_SIZE_ELEMENT = re.compile(r"<(used|free|total|used_memory)>\s*([^<]*?)\s*</\1>")


def _count_possible(v: str) -> bool:
    """A counter as nvidia-smi prints it ("0", "16x", "12 %"): no sign, no NaN, not beyond any node."""
    if not _NUMBER.match(v):
        return True  # "N/A", "Yes", "Enabled"
    m = _LEADING.match(v)
    return m is not None and len(m.group(1)) <= 20 and plausible.count(int(m.group(1)))


def implausible(rep: SmiReport, text: str) -> str:
    """Why a parsed report cannot come from a real nvidia-smi ("" when it can).

    nvidia-smi prints a driver version, PCI bus ids, non-negative counters and sizes; a report
    with anything else is damaged, and none of its values may confirm a finding.
    """
    if rep.driver_version and not plausible.driver_version(rep.driver_version):
        return f"driver_version {rep.driver_version!r} is not an NVIDIA driver version"
    for g in rep.gpus:
        if not plausible.pci_address(g.bus_id):
            return f"gpu id {g.bus_id!r} is not a PCI address"
        for k, v in g.fields.items():
            if not _count_possible(v):
                return f"gpu {g.bus_id} {k} {v!r} is not a possible count"
        if None not in (g.fb_used, g.fb_total) and g.fb_used > g.fb_total:  # type: ignore[operator]
            return f"gpu {g.bus_id} uses more framebuffer ({g.fb_used}) than it has ({g.fb_total})"
    bad: dict[str, str] = {}  # a size that did not parse as one: the first of each tag, in one pass
    for m in _SIZE_ELEMENT.finditer(text):
        tag, value = m.group(1), m.group(2)
        if tag not in bad and _NUMBER.match(value) and mib_bytes(value) is None:
            bad[tag] = value
    for tag in _SIZE_TAGS:
        if tag in bad:
            return f"<{tag}>{bad[tag]}</{tag}> is not a possible size"
    return ""


def parse(text: str) -> SmiReport | None:
    # ElementTree rejects the external DOCTYPE nvidia-smi prints: drop it
    body = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("<!DOCTYPE"))
    try:
        root = ET.fromstring(body)
    except (ET.ParseError, UnicodeError, ValueError):  # a lone surrogate cannot even be encoded for expat
        return None
    gpus = []
    for g in root.findall("gpu"):
        minor = _t(g, "minor_number")
        flat = {
            "retired_pages_pending": _t(g, "retired_pages/pending_retirement"),
            "retired_pages_pending_blacklist": _t(g, "retired_pages/pending_blacklist"),
            "retired_pages_sbe": _t(g, "retired_pages/multiple_single_bit_retirement/retired_count"),
            "retired_pages_dbe": _t(g, "retired_pages/double_bit_retirement/retired_count"),
            # DTD v11+ (A100 on) writes remapped_row_*; the remapping_* names are kept for old captures
            "remap_pending": _t(g, "remapped_rows/remapped_row_pending") or _t(g, "remapped_rows/remapping_pending"),
            "remap_failure": (_t(g, "remapped_rows/remapped_row_failure")
                              or _t(g, "remapped_rows/remapping_failure_occurred")),
            "remap_correctable": _t(g, "remapped_rows/remapped_row_corr"),
            "remap_uncorrectable": _t(g, "remapped_rows/remapped_row_unc"),
            "ecc_mode": _t(g, "ecc_mode/current_ecc"),
            "ecc_volatile_uncorrectable": _ecc_sum(g.find("ecc_errors/volatile")),
            "ecc_aggregate_uncorrectable": _ecc_sum(g.find("ecc_errors/aggregate")),
            "ecc_aggregate_sram_uncorrectable": _ecc_sum(g.find("ecc_errors/aggregate"), sram_only=True),
            "sram_threshold_exceeded": _t(g, "ecc_errors/aggregate/sram_threshold_exceeded"),
            "unrepairable_memory": _t(g, "ecc_errors/unrepairable_memory"),
            "pcie_gen_current": _t(g, "pci/pci_gpu_link_info/pcie_gen/current_link_gen"),
            "pcie_gen_max": _t(g, "pci/pci_gpu_link_info/pcie_gen/max_link_gen"),
            "pcie_width_current": _t(g, "pci/pci_gpu_link_info/link_widths/current_link_width"),
            "pcie_width_max": _t(g, "pci/pci_gpu_link_info/link_widths/max_link_width"),
            "pcie_replay_counter": _t(g, "pci/replay_counter"),
            "gpu_util": _t(g, "utilization/gpu_util"),
            "performance_state": _t(g, "performance_state"),
            "clocks_gpu_idle": (_t(g, "clocks_event_reasons/clocks_event_reason_gpu_idle")
                                or _t(g, "clocks_throttle_reasons/clocks_throttle_reason_gpu_idle")),
            "fabric_state": _t(g, "fabric/state"),
            "fabric_status": _t(g, "fabric/status"),
            "gsp_firmware_version": _t(g, "gsp_firmware_version"),
            "product_brand": _t(g, "product_brand"),
        }
        gpus.append(
            SmiGpu(
                bus_id=g.get("id", ""),
                name=_t(g, "product_name"),
                uuid=_t(g, "uuid"),
                minor=int(minor) if plausible.decimal(minor) else None,
                mig_current=_t(g, "mig_mode/current_mig"),
                mig_pending=_t(g, "mig_mode/pending_mig"),
                mig_devices=None if g.find("mig_devices") is None else len(g.findall("mig_devices/mig_device")),
                persistence_mode=_t(g, "persistence_mode"),
                compute_mode=_t(g, "compute_mode"),
                fields={k: v for k, v in flat.items() if v},
                fb_used=mib_bytes(_t(g, "fb_memory_usage/used")),
                fb_free=mib_bytes(_t(g, "fb_memory_usage/free")),
                fb_total=mib_bytes(_t(g, "fb_memory_usage/total")),
                processes=_processes(g),
            )
        )
    return SmiReport(_t(root, "driver_version"), _t(root, "cuda_version"), gpus)
