"""The NVML probe's ctypes client answers what nvidia-ml-py (pynvml) answers, on the same library.

A stand-in libnvidia-ml.so.1 (nvml_fake.c: two GPUs, one without MIG or row remapping) is loaded
by each side in its own probe child; `_pynvml_snapshot` is the probe as it was written on pynvml.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.probes import nvml
from gpuwarden.probes.bounded import run_func

FAKE = Path(__file__).resolve().parent / "nvml_fake.c"


@pytest.fixture(scope="module")
def fake_lib(tmp_path_factory) -> str:
    if not shutil.which("gcc"):
        pytest.skip("gcc not available to build the stand-in NVML library")
    so = tmp_path_factory.mktemp("nvml") / "libnvidia-ml-fake.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(so), str(FAKE)], check=True)
    return str(so)


def _pynvml_snapshot(library: str | None) -> dict[str, Any]:
    """The reference: the same snapshot through pynvml (preloaded under its soname, as the probe did)."""
    import ctypes

    if library:
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    pynvml = pytest.importorskip("pynvml")
    n = pynvml

    def call(fn, *args):
        try:
            return fn(*args)
        except Exception:
            return None

    def text(v):
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else v

    try:
        n.nvmlInit()
    except n.NVMLError as exc:
        return {"init": "error", "error": str(exc), "error_code": getattr(exc, "value", None)}
    out: dict[str, Any] = {"init": "ok", "gpus": [], "driver_version": text(call(n.nvmlSystemGetDriverVersion)),
                           "nvml_version": text(call(n.nvmlSystemGetNVMLVersion)),
                           "cuda_driver_version": call(n.nvmlSystemGetCudaDriverVersion_v2)}
    for i in range(call(n.nvmlDeviceGetCount) or 0):
        h = n.nvmlDeviceGetHandleByIndex(i)
        pci = call(n.nvmlDeviceGetPciInfo, h)
        mig = call(n.nvmlDeviceGetMigMode, h)
        g = {"index": i, "name": text(call(n.nvmlDeviceGetName, h)), "uuid": text(call(n.nvmlDeviceGetUUID, h)),
             "minor": call(n.nvmlDeviceGetMinorNumber, h), "bus_id": text(getattr(pci, "busId", None)) if pci else None,
             "mig_current": mig[0] if mig else None, "mig_pending": mig[1] if mig else None,
             "persistence_mode": call(n.nvmlDeviceGetPersistenceMode, h),
             "compute_mode": call(n.nvmlDeviceGetComputeMode, h),
             "retired_pages_pending": call(n.nvmlDeviceGetRetiredPagesPendingStatus, h)}
        rr = call(n.nvmlDeviceGetRemappedRows, h)
        if rr:
            g["remapped_rows"] = {"correctable": rr[0], "uncorrectable": rr[1], "pending": bool(rr[2]),
                                  "failure": bool(rr[3])}
        g.update(pcie_gen_current=call(n.nvmlDeviceGetCurrPcieLinkGeneration, h),
                 pcie_gen_max=call(n.nvmlDeviceGetMaxPcieLinkGeneration, h),
                 pcie_width_current=call(n.nvmlDeviceGetCurrPcieLinkWidth, h),
                 pcie_width_max=call(n.nvmlDeviceGetMaxPcieLinkWidth, h),
                 ecc_uncorrected_volatile=call(n.nvmlDeviceGetTotalEccErrors, h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                               n.NVML_VOLATILE_ECC))
        mem = call(n.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            g["memory"] = {"used": mem.used, "free": mem.free, "total": mem.total}
        procs: dict[int, dict[str, Any]] = {}
        for kind, fn in (("G", n.nvmlDeviceGetGraphicsRunningProcesses), ("C", n.nvmlDeviceGetComputeRunningProcesses)):
            for p in call(fn, h) or []:
                e = procs.setdefault(p.pid, {"pid": p.pid, "type": "", "used": None})
                e["type"] = "C+G" if e["type"] and e["type"] != kind else kind
                if isinstance(p.usedGpuMemory, int):  # pynvml turns NVML_VALUE_NOT_AVAILABLE into None
                    e["used"] = max(e["used"] or 0, p.usedGpuMemory)
        g["processes"] = sorted(procs.values(), key=lambda e: e["pid"])
        out["gpus"].append(g)
    return out


def _both(lib: str | None, env: dict[str, str] | None = None) -> tuple[Any, Any]:
    ours = run_func(nvml.snapshot, lib, timeout=10, env=env)
    ref = run_func(_pynvml_snapshot, lib, timeout=10, env=env)
    assert ours.ok and ref.ok, (ours, ref)
    return ours.value, ref.value


def test_snapshot_equals_pynvml_on_the_same_library(fake_lib):
    ours, ref = _both(fake_lib)
    assert ours == ref
    assert ours["init"] == "ok" and len(ours["gpus"]) == 2
    g0, g1 = ours["gpus"]
    assert g0["bus_id"] == "00000000:18:00.0" and g0["ecc_uncorrected_volatile"] == 12345678901
    assert g0["remapped_rows"] == {"correctable": 2, "uncorrectable": 1, "pending": True, "failure": False}
    assert g1["mig_current"] is None and "remapped_rows" not in g1  # NOT_SUPPORTED stays None, as with pynvml
    # the per-process lists the memory rule separates holders with (docs/memory.md, section 7)
    assert g0["processes"] == [{"pid": 499, "type": "C+G", "used": 83399540736},
                               {"pid": 523, "type": "G", "used": 1563582464}]
    assert g0["memory"] == {"used": 85520809984 - 21692416, "free": 21692416, "total": 85520809984}
    assert g1["processes"] == []


@pytest.mark.skipif(not os.path.exists("/proc/driver/nvidia"), reason="no NVIDIA driver on this host")
def test_snapshot_equals_pynvml_on_this_hosts_driver():
    """On a GPU host (the project's GPU machine, docs/validation/): the real libnvidia-ml.so.1."""
    pytest.importorskip("pynvml")
    ours, ref = _both(None)
    assert ours == ref and ours["init"] == "ok" and ours["gpus"]


def test_init_failure_reads_the_same(fake_lib):
    ours, ref = _both(fake_lib, {"FAKE_NVML_INIT_RC": "9"})
    assert ours == ref == {"init": "error", "error": "Driver Not Loaded", "error_code": 9}


def test_missing_library_is_an_init_error_not_a_crash(tmp_path):
    out = run_func(nvml.snapshot, str(tmp_path / "libnvidia-ml.so.1"), timeout=10)
    assert out.ok and out.value == {"init": "error", "error": nvml.LIBRARY_NOT_FOUND, "error_code": 12}


def test_probe_child_does_not_import_pynvml(fake_lib, monkeypatch):
    """The point of the client: the child loads ctypes and the library, not nvidia-ml-py."""
    import sys

    def modules_after(lib: str) -> bool:
        nvml.snapshot(lib)
        return "pynvml" in sys.modules

    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    assert run_func(modules_after, fake_lib, timeout=10).value is False


def test_one_gpu_lost_is_recorded_with_nvml_error_and_clears(fake_lib, tmp_path):
    """tools/gpu/nvml_inject_shim.c's GW_NVML_LOST_INDEX_FILE, loaded as the probe's library and linked against
    the NVML it forwards to: while the file names GPU 1, that GPU has no handle (NVML_ERROR_GPU_IS_LOST,
    recorded with NVML's own error text) and GPU 0 is answered in full; without the file both are."""
    shim = tmp_path / "nvml_inject_shim.so"
    src = Path(__file__).resolve().parents[2] / "tools/gpu/nvml_inject_shim.c"
    (Path(fake_lib).parent / "libnvidia-ml.so.1").unlink(missing_ok=True)
    (Path(fake_lib).parent / "libnvidia-ml.so.1").symlink_to(fake_lib)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(shim), str(src), f"-Wl,--no-as-needed,-rpath,{Path(fake_lib).parent}",
                    fake_lib, "-ldl"], check=True)
    lost = tmp_path / "lost"
    env = {"GW_NVML_REAL": fake_lib, "GW_NVML_LOST_INDEX_FILE": str(lost)}
    lost.write_text("1\n")
    out = run_func(nvml.snapshot, str(shim), timeout=10, env=env).value
    assert out["init"] == "ok" and out["gpus"][0]["uuid"] == "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    assert out["gpus"][1] == {"index": 1, "error": "GPU is lost", "error_code": 15}
    lost.unlink()
    out = run_func(nvml.snapshot, str(shim), timeout=10, env=env).value
    assert [g.get("uuid") for g in out["gpus"]] == ["GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
                                                    "GPU-11111111-2222-3333-4444-555555555555"]
