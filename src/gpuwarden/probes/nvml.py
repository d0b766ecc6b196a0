"""NVML probe: run in a killable child, because nvmlInit can hang forever (incident 5, GPU-DRV-006).

Uses nvidia-ml-py (`pynvml`). `GPUWARDEN_NVML_LIBRARY` names a library to load
in place of libnvidia-ml.so.1 (a driver container's copy, or a test shim): it is
loaded first with its soname, so pynvml's own dlopen finds it.
"""

from __future__ import annotations

import os
from typing import Any

from gpuwarden.probes.bounded import Outcome, Pending, start_func

ENV_LIBRARY = "GPUWARDEN_NVML_LIBRARY"


def _call(fn, *args) -> Any:
    """One NVML query; unsupported or failing queries become None, never an exception."""
    try:
        return fn(*args)
    except Exception:
        return None


def _text(v: Any) -> Any:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def processes(n: Any, h: Any) -> list[dict[str, Any]]:
    """NVML's per-process lists: type "G" (graphics: EGL/GL/Vulkan), "C" (compute) or "C+G", and the GPU
    memory each holds. Graphics clients are the ones whose objects the driver places in host memory
    when the GPU's memory is full (docs/memory.md)."""
    by_pid: dict[int, dict[str, Any]] = {}
    for kind, fn in (("G", "nvmlDeviceGetGraphicsRunningProcesses"), ("C", "nvmlDeviceGetComputeRunningProcesses")):
        for p in _call(getattr(n, fn), h) or []:
            used = getattr(p, "usedGpuMemory", None)
            e = by_pid.setdefault(int(p.pid), {"pid": int(p.pid), "type": "", "used": None})
            e["type"] = "C+G" if e["type"] and e["type"] != kind else kind
            if isinstance(used, int) and used < (1 << 62):  # NVML_VALUE_NOT_AVAILABLE is 2**64-1
                e["used"] = max(e["used"] or 0, used)
    return sorted(by_pid.values(), key=lambda e: e["pid"])


def snapshot(library: str | None = None) -> dict[str, Any]:
    """Runs in the child: everything a rule may want from NVML, as plain data."""
    if library:
        import ctypes

        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    import pynvml as n

    try:
        n.nvmlInit()
    except n.NVMLError as exc:
        return {"init": "error", "error": str(exc), "error_code": getattr(exc, "value", None)}
    out: dict[str, Any] = {"init": "ok", "gpus": []}
    out["driver_version"] = _text(_call(n.nvmlSystemGetDriverVersion))
    out["nvml_version"] = _text(_call(n.nvmlSystemGetNVMLVersion))
    out["cuda_driver_version"] = _call(n.nvmlSystemGetCudaDriverVersion_v2)
    count = _call(n.nvmlDeviceGetCount) or 0
    for i in range(count):
        h = _call(n.nvmlDeviceGetHandleByIndex, i)
        if h is None:
            out["gpus"].append({"index": i, "error": "no handle"})
            continue
        g: dict[str, Any] = {"index": i}
        g["name"] = _text(_call(n.nvmlDeviceGetName, h))
        g["uuid"] = _text(_call(n.nvmlDeviceGetUUID, h))
        g["minor"] = _call(n.nvmlDeviceGetMinorNumber, h)
        pci = _call(n.nvmlDeviceGetPciInfo, h)
        g["bus_id"] = _text(getattr(pci, "busId", None)) if pci else None
        mig = _call(n.nvmlDeviceGetMigMode, h)
        g["mig_current"], g["mig_pending"] = (mig[0], mig[1]) if mig else (None, None)
        g["persistence_mode"] = _call(n.nvmlDeviceGetPersistenceMode, h)
        g["compute_mode"] = _call(n.nvmlDeviceGetComputeMode, h)
        g["retired_pages_pending"] = _call(n.nvmlDeviceGetRetiredPagesPendingStatus, h)
        rr = _call(n.nvmlDeviceGetRemappedRows, h)
        if rr:
            g["remapped_rows"] = {"correctable": rr[0], "uncorrectable": rr[1], "pending": bool(rr[2]),
                                  "failure": bool(rr[3])}
        g["pcie_gen_current"] = _call(n.nvmlDeviceGetCurrPcieLinkGeneration, h)
        g["pcie_gen_max"] = _call(n.nvmlDeviceGetMaxPcieLinkGeneration, h)
        g["pcie_width_current"] = _call(n.nvmlDeviceGetCurrPcieLinkWidth, h)
        g["pcie_width_max"] = _call(n.nvmlDeviceGetMaxPcieLinkWidth, h)
        g["ecc_uncorrected_volatile"] = _call(n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                              n.NVML_VOLATILE_ECC)
        mem = _call(n.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            g["memory"] = {"used": mem.used, "free": mem.free, "total": mem.total}
        g["processes"] = processes(n, h)
        out["gpus"].append(g)
    _call(n.nvmlShutdown)
    return out


def start(timeout: float) -> Pending:
    """Start the NVML snapshot in its child now; collect it later with `.result()`."""
    return start_func(snapshot, os.environ.get(ENV_LIBRARY) or None, timeout=timeout)


def probe(timeout: float) -> Outcome:
    """NVML snapshot with a hard deadline; a timeout is itself evidence of a hung driver."""
    return start(timeout).result()
