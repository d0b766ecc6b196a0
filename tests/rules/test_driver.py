"""GPU-DRV-001 … 005 and 007 on variants of the healthy example (the real H200 capture).

Strings come from the catalog's quotes of public reports: "nvidia-container-cli: initialization
error: nvml error: driver not loaded" (nvidia-docker#291), "Failed to initialize NVML:
Driver/library version mismatch" + "NVML library version: …" (newer drivers), the kernel's
"NVRM: API mismatch: the client has the version …" , "driver rpc error: timed out"
(nvidia-container-toolkit#202), Xid 119 (open-gpu-kernel-modules#461), "RmInitAdapter failed!
(0x62:0x40:2168)" and the firmware-load line (catalog GPU-DRV-005). containerd lines are in
containerd's logrus format.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpuwarden.findings import Severity, Status
from tests.support.gpunode import (
    add_kmsg,
    checkpoint,
    edit_meta,
    edit_smi,
    found,
    healthy,
    nvml_snapshot,
    one,
    set_probes,
    write,
)
from tests.support.bundles import bundle_file

CONTAINERD_LOG = "/.gpuwarden/logs/containerd.log"


def ctrd(msg: str) -> str:
    return (f'time="2026-11-22T02:12:30.100000000Z" level=error msg="RunPodSandbox for &PodSandboxMetadata'
            f'{{Name:trainer-0,Uid:8f1c2a3b,Namespace:ml,}} failed" error="failed to create containerd task: '
            f"OCI runtime create failed: runc create failed: unable to start container process: error during "
            f'container init: error running hook #0: error running hook: exit status 1, stdout: , stderr: {msg}: unknown"\n')


def unload_driver(b: Path) -> None:
    """The node after a kernel upgrade without a module rebuild: no nvidia module, no /proc/driver/nvidia."""
    shutil.rmtree(b / "files/proc/driver/nvidia")
    shutil.rmtree(b / "files/sys/module/nvidia")
    f = bundle_file(b, "/proc/modules")
    f.write_text("".join(ln + "\n" for ln in f.read_text().splitlines() if not ln.startswith("nvidia")))
    f = bundle_file(b, "/proc/devices")
    f.write_text("".join(ln + "\n" for ln in f.read_text().splitlines() if "nvidia" not in ln))
    edit_meta(b, lambda m: m.__setitem__("stat", {k: v for k, v in m["stat"].items() if not k.startswith("/dev/nvidia")}))


# --- GPU-DRV-001 -------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-DRV-001", "positive")
def test_drv001_gpu_node_without_module(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    unload_driver(b)
    write(b, CONTAINERD_LOG, ctrd("nvidia-container-cli: initialization error: nvml error: driver not loaded"))
    f = one(b, "GPU-DRV-001")
    assert f.status is Status.CONFIRMED and f.severity is Severity.CRITICAL
    texts = [f"{e.source}: {e.text}" for e in f.evidence]
    assert any("device-manager checkpoint has nvidia.com/gpu" in t for t in texts)
    assert any("[10de:2335] type 00 class 0x030200" in t for t in texts)  # the capture's own boot line
    assert "/proc/driver/nvidia/version: does not exist" in texts
    assert any("driver not loaded" in t for t in texts)


@pytest.mark.rule("GPU-DRV-001", "negative")
def test_drv001_silent_with_module_loaded_or_on_a_non_gpu_node(tmp_path: Path) -> None:
    assert found(healthy(tmp_path), "GPU-DRV-001") == []
    b = healthy(tmp_path / "cpu")
    unload_driver(b)
    checkpoint(b, lambda d: (d.__setitem__("RegisteredDevices", {}), d.__setitem__("PodDeviceEntries", [])))
    f = bundle_file(b, "/.gpuwarden/logs/kmsg.txt")
    f.write_text("".join(ln + "\n" for ln in f.read_text().splitlines() if "10de:" not in ln))
    assert found(b, "GPU-DRV-001") == []


# --- GPU-DRV-002 -------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-DRV-002", "positive")
def test_drv002_library_link_newer_than_module(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    edit_meta(b, lambda m: m["readlink"].__setitem__("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                                                     "libnvidia-ml.so.580.172.02"))
    f = one(b, "GPU-DRV-002")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert f.evidence[0].text == "-> libnvidia-ml.so.580.172.02 (library 580.172.02; loaded module 580.159.04)"


@pytest.mark.rule("GPU-DRV-002", "positive")
def test_drv002_nvidia_smi_output_and_kernel_line(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    write(b, "/.gpuwarden/commands/nvidia-smi-q-x.xml",
          "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.172\n")
    add_kmsg(b, "NVRM: API mismatch: the client has the version 580.172.02, but",
             "NVRM: this kernel module has the version 580.159.04.  Please", level=4)
    f = one(b, "GPU-DRV-002")
    texts = [e.text for e in f.evidence]
    assert "Failed to initialize NVML: Driver/library version mismatch" in texts
    assert any("API mismatch: the client has the version 580.172.02" in t for t in texts)


@pytest.mark.rule("GPU-DRV-002", "positive")
def test_drv002_nvml_probe_error(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    set_probes(b, {"init": "error", "error": "Driver/library version mismatch", "error_code": 18})
    f = one(b, "GPU-DRV-002")
    assert any(e.source == "probe nvml (recorded)" and "mismatch" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-DRV-002", "negative")
def test_drv002_matching_versions(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    edit_meta(b, lambda m: m["readlink"].__setitem__("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                                                     "libnvidia-ml.so.580.159.04"))
    set_probes(b, nvml_snapshot())
    assert found(b, "GPU-DRV-002") == []


# --- GPU-DRV-003 -------------------------------------------------------------------------------------

def drop_uvm(b: Path, module: bool) -> None:
    edit_meta(b, lambda m: m.__setitem__("stat", {k: v for k, v in m["stat"].items() if "nvidia-uvm" not in k}))
    if module:
        for p in ("/proc/devices", "/proc/modules"):
            f = bundle_file(b, p)
            f.write_text("".join(ln + "\n" for ln in f.read_text().splitlines() if "uvm" not in ln))


@pytest.mark.rule("GPU-DRV-003", "positive")
def test_drv003_module_not_loaded_with_gpu_pods(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    drop_uvm(b, module=True)
    f = one(b, "GPU-DRV-003")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert f.evidence[0].source == "/proc/devices" and "no nvidia-uvm entry" in f.evidence[0].text


@pytest.mark.rule("GPU-DRV-003", "positive")
def test_drv003_node_missing_no_gpu_pods_is_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    drop_uvm(b, module=False)
    checkpoint(b, lambda d: d.__setitem__("PodDeviceEntries", []))
    f = one(b, "GPU-DRV-003")
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM
    assert "no /dev/nvidia-uvm node" in f.summary


@pytest.mark.rule("GPU-DRV-003", "negative")
def test_drv003_silent_when_present_or_dev_not_captured(tmp_path: Path) -> None:
    assert found(healthy(tmp_path), "GPU-DRV-003") == []
    b = healthy(tmp_path / "nodev")
    edit_meta(b, lambda m: m.__setitem__("stat", {k: v for k, v in m["stat"].items() if not k.startswith("/dev/")}))
    assert found(b, "GPU-DRV-003") == []


# --- GPU-DRV-004 -------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-DRV-004", "positive")
def test_drv004_persistence_off_is_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    edit_smi(b, ("<persistence_mode>Enabled</persistence_mode>", "<persistence_mode>Disabled</persistence_mode>"))
    f = one(b, "GPU-DRV-004")
    assert f.status is Status.AT_RISK and f.severity is Severity.LOW
    assert any("no nvidia-persistenced among" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-DRV-004", "positive")
def test_drv004_persistence_off_and_driver_timeouts_confirmed(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    edit_smi(b, ("<persistence_mode>Enabled</persistence_mode>", "<persistence_mode>Disabled</persistence_mode>"))
    write(b, CONTAINERD_LOG, ctrd("nvidia-container-cli: initialization error: driver rpc error: timed out"))
    f = one(b, "GPU-DRV-004")
    assert f.status is Status.CONFIRMED and f.severity is Severity.MEDIUM


@pytest.mark.rule("GPU-DRV-004", "negative")
def test_drv004_persistenced_running(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    edit_smi(b, ("<persistence_mode>Enabled</persistence_mode>", "<persistence_mode>Disabled</persistence_mode>"))
    write(b, "/proc/1150/cmdline", b"/usr/bin/nvidia-persistenced\0--user\0nvidia-persistenced\0--no-persistence-mode\0")
    assert found(b, "GPU-DRV-004") == []
    assert found(healthy(tmp_path / "h"), "GPU-DRV-004") == []  # persistence Enabled in the capture


# --- GPU-DRV-005 -------------------------------------------------------------------------------------

X119 = "NVRM: Xid (PCI:0000:00:06): 119, pid=430, name=nv_queue, Timeout waiting for RPC from GSP!"


@pytest.mark.rule("GPU-DRV-005", "positive")
def test_drv005_xid119_and_rminitadapter(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X119, "NVRM: GPU 0000:00:06.0: RmInitAdapter failed! (0x62:0x40:2168)")
    f = one(b, "GPU-DRV-005")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH and f.data["xids"] == [119]
    assert len([e for e in f.evidence if e.source.endswith("kmsg.txt")]) == 2


@pytest.mark.rule("GPU-DRV-005", "positive")
def test_drv005_firmware_missing_on_a_525_driver(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    f = bundle_file(b, "/proc/driver/nvidia/version")
    f.write_text(f.read_text().replace("580.159.04", "525.85.05"))
    add_kmsg(b, "nvidia 0000:00:06.0: Direct firmware load for nvidia/525.85.05/gsp_tu10x.bin failed with error -2",
             "NVRM: RmFetchGspRmImages: No firmware image found", level=4)
    got = one(b, "GPU-DRV-005")
    assert got.status is Status.CONFIRMED
    assert "Upgrade to 525.105.17 or later" in got.remedy
    assert any("nvidia-driver-525-gsp-rpc-timeout" in e.text for e in got.evidence)


@pytest.mark.rule("GPU-DRV-005", "negative")
def test_drv005_silent_on_other_xids(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, "NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    assert found(b, "GPU-DRV-005") == []


# --- GPU-DRV-007 -------------------------------------------------------------------------------------

def nvswitches(b: Path, n: int = 4) -> None:
    def add(m: dict) -> None:
        for i in range(n):
            p = f"/dev/nvidia-nvswitch{i}"
            m["stat"][p] = {"path": p, "kind": "chr", "major": 239, "minor": i, "mode": 8630}
    edit_meta(b, add)


@pytest.mark.rule("GPU-DRV-007", "positive")
def test_drv007_fabric_in_progress_confirmed(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    nvswitches(b)
    edit_smi(b, ("<state>N/A</state>", "<state>In Progress</state>"))
    f = one(b, "GPU-DRV-007")
    assert f.status is Status.CONFIRMED and f.severity is Severity.CRITICAL
    assert any("fabric state 'In Progress'" in e.text for e in f.evidence)
    assert any("no nv-fabricmanager process" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-DRV-007", "positive")
def test_drv007_no_fabric_manager_is_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    nvswitches(b)
    f = one(b, "GPU-DRV-007")
    assert f.status is Status.AT_RISK and f.severity is Severity.HIGH


@pytest.mark.rule("GPU-DRV-007", "negative")
def test_drv007_fabric_manager_running_or_no_nvswitch(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    nvswitches(b)
    write(b, "/proc/1160/cmdline", b"/usr/bin/nv-fabricmanager\0-c\0/usr/share/nvidia/nvswitch/fabricmanager.cfg\0")
    edit_smi(b, ("<state>N/A</state>", "<state>Completed</state>"), ("<status>N/A</status>", "<status>Success</status>"))
    assert found(b, "GPU-DRV-007") == []
    # the H200 capture: /proc/devices has nvidia-nvswitch, but there is no NVSwitch
    assert found(healthy(tmp_path / "h"), "GPU-DRV-007") == []


@pytest.mark.rule("GPU-DRV-007", "positive")
def test_drv007_fabric_still_initialising_with_fm_running_is_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    nvswitches(b)
    write(b, "/proc/1160/cmdline", b"/usr/bin/nv-fabricmanager\0-c\0/usr/share/nvidia/nvswitch/fabricmanager.cfg\0")
    edit_smi(b, ("<state>N/A</state>", "<state>In Progress</state>"))
    f = one(b, "GPU-DRV-007")
    assert f.status is Status.AT_RISK and "still being set up" in f.summary


RESET_REQUIRED = ("NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED] (0x00000062) "
                  "returned from status @ kernel_channel.c:2874")


@pytest.mark.rule("GPU-DRV-005", "positive")
def test_drv005_rminitadapter_without_gsp_says_not_initialised(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, "NVRM: GPU 0000:00:06.0: RmInitAdapter failed! (0x24:0x72:1568)",
             "NVRM: GPU 0000:00:06.0: rm_init_adapter failed, device minor number 0")
    f = one(b, "GPU-DRV-005")
    assert "not initialised" in f.summary and "GSP" not in f.summary and f.data["kinds"] == ["init"]
    assert "not usable until it is reset" in f.summary


@pytest.mark.rule("GPU-DRV-005", "positive")
def test_drv005_rminitadapter_with_a_gsp_line_says_gsp(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, "NVRM: RmInitAdapter: Cannot initialize GSP firmware RM",
             "NVRM: GPU 0000:00:06.0: RmInitAdapter failed! (0x62:0x65:1792)")
    kinds = {k for f in found(b, "GPU-DRV-005") for k in f.data["kinds"]}
    assert "gsp" in kinds and "init" in kinds


@pytest.mark.rule("GPU-DRV-005", "positive")
def test_drv005_reset_required_assertion_names_the_only_gpu(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, RESET_REQUIRED, RESET_REQUIRED.replace("NVRM: ", "NVRM: GPU0 "))
    f = one(b, "GPU-DRV-005")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH and f.data["kinds"] == ["reset"]
    assert "needs a reset" in f.summary and f.data["gpu"] == "0000:00:06"


@pytest.mark.rule("GPU-DRV-005", "negative")
def test_drv005_other_assertions_are_not_reset_required(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, "NVRM: GPU0 nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || "
                "(status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ rs_client.c:844")
    assert found(b, "GPU-DRV-005") == []
