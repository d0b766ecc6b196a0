"""NVML probe: run in a killable child, because nvmlInit can hang forever (incident 5, GPU-DRV-006).

The child talks to libnvidia-ml.so.1 through ctypes, for the handful of read-only calls the rules
use: importing all of nvidia-ml-py (`pynvml`, 8,000 lines of structures and wrappers) cost the
child ~50 ms on a GPU host before nvmlInit even started (docs/performance.md). The calls,
argument types and buffer sizes are NVML's C API (nvml.h) as pynvml wraps them; a test compares
this snapshot with pynvml's answers on a stand-in library. `GPUWARDEN_NVML_LIBRARY` names a
library to load in place of libnvidia-ml.so.1 (a driver container's copy, or a test shim).
"""

from __future__ import annotations

import os
from typing import Any

from gpuwarden.probes.bounded import ChildResult, Pending, start_func

ENV_LIBRARY = "GPUWARDEN_NVML_LIBRARY"
SONAME = "libnvidia-ml.so.1"

#: nvml.h: buffer sizes, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
_NAME_LEN, _UUID_LEN, _VERSION_LEN = 96, 96, 80
_UNCORRECTED, _VOLATILE = 1, 0
#: error text when the library itself cannot be loaded (pynvml's wording for NVML_ERROR_LIBRARY_NOT_FOUND)
LIBRARY_NOT_FOUND = "NVML Shared Library Not Found"


class Nvml:
    """The few NVML calls of the snapshot (and of the event child, `wake.nvml_child`); each answers a
    value, or None when NVML refuses."""

    def __init__(self, library: str | None) -> None:
        import ctypes

        self.c = ctypes
        self.lib = ctypes.CDLL(library or SONAME)

        class PciInfo(ctypes.Structure):  # nvmlPciInfo_t (v3)
            _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                        ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                        ("busId", ctypes.c_char * 32)]

        self.PciInfo = PciInfo

        class Memory(ctypes.Structure):  # nvmlMemory_t (v1)
            _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

        class ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t (v2, the _v3 list calls' element)
            _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                        ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]

        self.Memory, self.ProcessInfo = Memory, ProcessInfo

    def _fn(self, name: str) -> Any:
        return getattr(self.lib, name, None)

    def error(self, code: int) -> str:
        fn = self._fn("nvmlErrorString")
        if fn is None:
            return f"NVML error {code}"
        fn.restype = self.c.c_char_p
        text = fn(code)
        return text.decode("utf-8", "replace") if text else f"NVML error {code}"

    def init(self) -> int:
        """nvmlInitWithFlags(0) as pynvml calls it (nvmlInit_v2 on a driver older than 418)."""
        fn = self._fn("nvmlInitWithFlags")
        if fn is not None:
            return fn(0)
        fn = self._fn("nvmlInit_v2")
        return fn() if fn is not None else 13  # NVML_ERROR_FUNCTION_NOT_FOUND

    def _call(self, name: str, *args: Any) -> bool:
        fn = self._fn(name)
        try:
            return fn is not None and fn(*args) == 0
        except Exception:
            return False

    def text(self, name: str, size: int, *pre: Any) -> str | None:
        buf = self.c.create_string_buffer(size)
        if not self._call(name, *pre, buf, self.c.c_uint(size)):
            return None
        return buf.value.decode("utf-8", "replace")

    def uints(self, name: str, n: int, *pre: Any, kind: Any = None) -> list[int] | None:
        vals = [(kind or self.c.c_uint)() for _ in range(n)]
        if not self._call(name, *pre, *(self.c.byref(v) for v in vals)):
            return None
        return [int(v.value) for v in vals]

    def uint(self, name: str, *pre: Any, kind: Any = None) -> int | None:
        got = self.uints(name, 1, *pre, kind=kind)
        return got[0] if got else None

    def handle(self, index: int) -> tuple[Any, int]:
        """(handle, 0), or (None, NVML's return code): NVML_ERROR_GPU_IS_LOST (15) for a GPU off the bus."""
        h = self.c.c_void_p()
        fn = self._fn("nvmlDeviceGetHandleByIndex_v2")
        try:
            rc = fn(self.c.c_uint(index), self.c.byref(h)) if fn is not None else 13
        except Exception:
            rc = 999
        return (h, 0) if rc == 0 else (None, int(rc))

    def memory(self, h: Any) -> dict[str, int] | None:
        m = self.Memory()
        if not self._call("nvmlDeviceGetMemoryInfo", h, self.c.byref(m)):
            return None
        return {"used": int(m.used), "free": int(m.free), "total": int(m.total)}

    def processes(self, h: Any) -> list[dict[str, Any]]:
        """NVML's per-process lists: type "G" (graphics: EGL/GL/Vulkan), "C" (compute) or "C+G", and the GPU
        memory each holds. Graphics clients are the ones whose objects the driver places in host memory
        when the GPU's memory is full (docs/memory.md, section 7)."""
        by_pid: dict[int, dict[str, Any]] = {}
        for kind, name in (("G", "nvmlDeviceGetGraphicsRunningProcesses_v3"),
                           ("C", "nvmlDeviceGetComputeRunningProcesses_v3")):
            fn = self._fn(name)
            if fn is None:
                continue
            count = self.c.c_uint(0)
            rc = fn(h, self.c.byref(count), None)  # NVML_ERROR_INSUFFICIENT_SIZE (7) with the count, or 0 for none
            if rc == 7:
                count.value = count.value * 2 + 5  # processes may start between the two calls
                arr = (self.ProcessInfo * count.value)()
                rc = fn(h, self.c.byref(count), arr)
                items = list(arr[: count.value]) if rc == 0 else []
            else:
                items = []
            for p in items:
                e = by_pid.setdefault(int(p.pid), {"pid": int(p.pid), "type": "", "used": None})
                e["type"] = "C+G" if e["type"] and e["type"] != kind else kind
                if p.usedGpuMemory < (1 << 62):  # NVML_VALUE_NOT_AVAILABLE is 2**64-1
                    e["used"] = max(e["used"] or 0, int(p.usedGpuMemory))
        return sorted(by_pid.values(), key=lambda e: e["pid"])

    def bus_id(self, h: Any) -> str | None:
        info = self.PciInfo()
        if not self._call("nvmlDeviceGetPciInfo_v3", h, self.c.byref(info)):
            return None
        return info.busId.decode("utf-8", "replace")


def snapshot(library: str | None = None) -> dict[str, Any]:
    """Runs in the child: everything a rule may want from NVML, as plain data."""
    try:
        n = Nvml(library)
    except OSError:
        return {"init": "error", "error": LIBRARY_NOT_FOUND, "error_code": 12}
    rc = n.init()
    if rc != 0:
        return {"init": "error", "error": n.error(rc), "error_code": rc}
    c = n.c
    out: dict[str, Any] = {"init": "ok", "gpus": []}
    out["driver_version"] = n.text("nvmlSystemGetDriverVersion", _VERSION_LEN)
    out["nvml_version"] = n.text("nvmlSystemGetNVMLVersion", _VERSION_LEN)
    out["cuda_driver_version"] = n.uint("nvmlSystemGetCudaDriverVersion_v2", kind=c.c_int)
    count = n.uint("nvmlDeviceGetCount_v2") or 0
    for i in range(count):
        h, rc = n.handle(i)
        if h is None:  # the GPU's own error ("GPU is lost"): GPU-HW-002 names it by its place in bus order
            out["gpus"].append({"index": i, "error": n.error(rc), "error_code": rc})
            continue
        g: dict[str, Any] = {"index": i}
        g["name"] = n.text("nvmlDeviceGetName", _NAME_LEN, h)
        g["uuid"] = n.text("nvmlDeviceGetUUID", _UUID_LEN, h)
        g["minor"] = n.uint("nvmlDeviceGetMinorNumber", h)
        g["bus_id"] = n.bus_id(h)
        mig = n.uints("nvmlDeviceGetMigMode", 2, h)
        g["mig_current"], g["mig_pending"] = (mig[0], mig[1]) if mig else (None, None)
        g["persistence_mode"] = n.uint("nvmlDeviceGetPersistenceMode", h)
        g["compute_mode"] = n.uint("nvmlDeviceGetComputeMode", h)
        g["retired_pages_pending"] = n.uint("nvmlDeviceGetRetiredPagesPendingStatus", h)
        rr = n.uints("nvmlDeviceGetRemappedRows", 4, h)
        if rr:
            g["remapped_rows"] = {"correctable": rr[0], "uncorrectable": rr[1], "pending": bool(rr[2]),
                                  "failure": bool(rr[3])}
        g["pcie_gen_current"] = n.uint("nvmlDeviceGetCurrPcieLinkGeneration", h)
        g["pcie_gen_max"] = n.uint("nvmlDeviceGetMaxPcieLinkGeneration", h)
        g["pcie_width_current"] = n.uint("nvmlDeviceGetCurrPcieLinkWidth", h)
        g["pcie_width_max"] = n.uint("nvmlDeviceGetMaxPcieLinkWidth", h)
        g["ecc_uncorrected_volatile"] = n.uint("nvmlDeviceGetTotalEccErrors", h, c.c_uint(_UNCORRECTED),
                                               c.c_uint(_VOLATILE), kind=c.c_ulonglong)
        mem = n.memory(h)
        if mem is not None:
            g["memory"] = mem
        g["processes"] = n.processes(h)
        out["gpus"].append(g)
    n._call("nvmlShutdown")
    return out


def start(timeout: float) -> Pending:
    """Start the NVML snapshot in its child now; collect it later with `.result()`."""
    return start_func(snapshot, os.environ.get(ENV_LIBRARY) or None, timeout=timeout)


def probe(timeout: float) -> ChildResult:
    """NVML snapshot with a hard deadline; a timeout is itself evidence of a hung driver."""
    return start(timeout).result()
