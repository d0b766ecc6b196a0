"""Variants of the healthy example for the hardware, driver, plugin and runtime rule tests.

Everything starts from real text: the healthy example carries the H200 capture's /proc, its
`nvidia-smi -q -x` and its /dev/kmsg (tests/fixtures/captures/h200-2026-11-22). Faults are added
as lines in the real formats: /dev/kmsg records (`pri,seq,usec,flags;message`) with NVRM lines
whose wording is quoted from public reports (see each test), nvidia-smi XML with one element
changed, CRI pod-log lines (`<RFC3339Nano> stderr F <klog line>`).
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuwarden.findings import Finding
from tests.support.bundles import CHECKPOINT, GPU_UUID, bundle_file, copy_example, edit_meta, open_dir, report_of, write

KMSG = "/.gpuwarden/logs/kmsg.txt"
SMI = "/.gpuwarden/commands/nvidia-smi-q-x.xml"
PROBES = "/.gpuwarden/probes.json"
#: the healthy node's GPU (GPU_UUID): bus 0000:00:06.0, minor 0
GPU_BUS = "0000:00:06"
#: the healthy node's device-plugin pod log directory (its /var/log/pods listing)
PLUGIN_LOG_DIR = ("/var/log/pods/kube-system_nvidia-device-plugin-x7k2p_1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d/"
                  "nvidia-device-plugin-ctr")
#: inside the healthy node's current boot (btime 02:12:07Z, captured 02:12:41Z)
IN_BOOT = "2026-11-22T02:12:30.123456789Z"


def healthy(tmp: Path, name: str = "healthy") -> Path:
    return copy_example(name, tmp)


def root(b: Path):
    return open_dir(b)


def found(b: Path, code: str) -> list[Finding]:
    rep = report_of(open_dir(b), (code,))
    assert not [e for e in rep.errors if code in e], rep.errors
    return [f for f in rep.findings if f.code == code]


def one(b: Path, code: str) -> Finding:
    """The one finding of a rule on a bundle directory."""
    got = found(b, code)
    assert len(got) == 1, [(f.code, f.summary) for f in got]
    return got[0]


def skipped(b: Path, code: str) -> dict[str, str]:
    rep = report_of(open_dir(b), (code,))
    return {s.code: s.reason for s in rep.skipped}


def add_kmsg(b: Path, *messages: str, level: int = 3, usec: int = 20_000_000) -> None:
    """Append /dev/kmsg records after the capture's last one (seq 357), inside the current boot."""
    f = bundle_file(b, KMSG)
    text = f.read_text()
    seq = 358
    lines = []
    for i, m in enumerate(messages):
        lines.append(f"{level},{seq + i},{usec + i * 1000},-;{m}")
    f.write_text(text.rstrip("\n") + "\n" + "\n".join(lines) + "\n")


def edit_smi(b: Path, *pairs: tuple[str, str]) -> None:
    """Replace the first occurrence of each old element text with the new one in nvidia-smi -q -x."""
    f = bundle_file(b, SMI)
    text = f.read_text()
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new, 1)
    f.write_text(text)


def set_probes(b: Path, value: dict | None, status: str = "ok", detail: str = "") -> None:
    write(b, PROBES, json.dumps({"nvml": {"status": status, "elapsed_s": 0.2, "value": value, "detail": detail}}))


def nvml_snapshot(**gpu) -> dict:
    """A probe snapshot of the healthy GPU, as probes/nvml.py records it, with fields overridden."""
    g = {"index": 0, "name": "NVIDIA H200", "uuid": GPU_UUID, "minor": 0, "bus_id": "00000000:00:06.0",
         "mig_current": 0, "mig_pending": 0, "persistence_mode": 1, "compute_mode": 0, "retired_pages_pending": 0,
         "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
         "pcie_gen_current": 5, "pcie_gen_max": 5, "pcie_width_current": 16, "pcie_width_max": 16,
         "ecc_uncorrected_volatile": 0}
    g.update(gpu)
    return {"init": "ok", "driver_version": "580.159.04", "nvml_version": "13.580.159.04",
            "cuda_driver_version": 13000, "gpus": [g]}


def cri(msg: str, t: str = IN_BOOT, stream: str = "stderr") -> str:
    return f"{t} {stream} F {msg}\n"


def plugin_log(b: Path, *klog_lines: str, n: int = 0) -> None:
    """Write the device-plugin container's log file <n>.log (CRI format)."""
    write(b, f"{PLUGIN_LOG_DIR}/{n}.log", "".join(cri(x) for x in klog_lines))


def checkpoint(b: Path, fn) -> None:
    f = bundle_file(b, CHECKPOINT)
    doc = json.loads(f.read_text())
    fn(doc["Data"])
    f.write_text(json.dumps(doc))


def sysfs_gpu(b: Path, bdf: str = "0000:00:06.0", *, cls: str = "0x030200", driver: str | None = "nvidia",
              width: str = "16", max_width: str = "16", speed: str = "32.0 GT/s PCIe",
              max_speed: str = "32.0 GT/s PCIe", aer: dict[str, str] | None = None, config: bytes | None = None) -> None:
    """An NVIDIA function under /sys/bus/pci/devices, with its driver link in meta.json (as collect records it)."""
    d = f"/sys/bus/pci/devices/{bdf}"
    write(b, f"{d}/vendor", "0x10de\n")
    write(b, f"{d}/device", "0x2335\n")
    write(b, f"{d}/class", cls + "\n")
    write(b, f"{d}/current_link_width", width + "\n")
    write(b, f"{d}/max_link_width", max_width + "\n")
    write(b, f"{d}/current_link_speed", speed + "\n")
    write(b, f"{d}/max_link_speed", max_speed + "\n")
    for k, v in (aer or {}).items():
        write(b, f"{d}/{k}", v)
    if config is not None:
        write(b, f"{d}/config", config)
    if driver is not None:
        edit_meta(b, lambda m: m.setdefault("readlink", {}).__setitem__(
            f"{d}/driver", f"../../../bus/pci/drivers/{driver}"))
