"""GPU-HW-001 … GPU-HW-007 on variants of the healthy example (the real H200 capture).

Kernel lines are real ones from public reports, with the PCI address rewritten to the healthy
GPU's (0000:00:06): Xid 13 and 43 (NVIDIA developer forums, "Graphics SM Warp Exception" thread),
31 (open-gpu-kernel-modules#1030), 48 (gpu-operator#1146), 63 (stas00/ml-engineering debug.md),
74 (NVIDIA forums, "Xid 74 … NVLink fatal error detected on link"), 79 and 119
(open-gpu-kernel-modules#461), 109 (bbs.archlinux.org 283219), 145 (TensorRT-LLM#4816), the
"NVRM: GPU …: GPU has fallen off the bus." and AER lines (kubernetes#97131 and the report
quoted in docs/; "PCIe Bus Error: severity=Correctable, type=Data Link Layer"). Where no public
line was found the line is marked "synthesized" with the format it follows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden import xid as xidtable
from gpuwarden.facts.xids import collect_xids
from gpuwarden.findings import Severity, Status
from gpuwarden.root import BundleRoot
from tests.support.gpunode import (
    GPU_UUID,
    root as gpu_root,
    add_kmsg,
    checkpoint,
    edit_smi,
    found,
    healthy,
    nvml_snapshot,
    one,
    set_probes,
    skipped,
    sysfs_gpu,
    write,
)
from tests.support.bundles import CAPTURE, bundle_file, edit_meta, example_root, facts_of, report_of

X79 = "NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
FELL = "NVRM: GPU 0000:00:06.0: GPU has fallen off the bus."
X48 = ("NVRM: Xid (PCI:0000:00:06): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) "
       "has been detected on GPU in the framebuffer at physAddr 0x7fdf0de80 partition 5, subpartition 1")
X63 = "NVRM: Xid (PCI:0000:00:06): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate."
X74 = "NVRM: Xid (PCI:0000:00:06): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 1"
X145 = "NVRM: Xid (PCI:0000:00:06): 145, RLW_REMAP Nonfatal XC0 i0 Link 02"
X109 = "NVRM: Xid (PCI:0000:00:06): 109, pid=2075, name=Stray-Win64-Shi, ..."
X13 = "NVRM: Xid (PCI:0000:00:06): 13, Graphics SM Warp Exception on (GPC 1, TPC 0): Out Of Range Address"
X31 = ("NVRM: Xid (PCI:0000:00:06): 31, pid=1942, name=llama-bench, channel 0x00000002, intr 00000000. MMU Fault: "
       "ENGINE GRAPHICS GPC6 GPCCLIENT_T1_13 faulted @ 0x6f6f_320c2000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ")
X43 = "NVRM: Xid (PCI:0000:00:06): 43, Ch 00000020, engmask 00000101"
#: synthesized in the Xid 154 format the catalog describes (recovery action codes 0x1/0x2/0x4)
X154 = ("NVRM: Xid (PCI:0000:00:06): 154, pid='<unknown>', name=<unknown>, GPU recovery action changed from "
        "0x0 (None) to 0x2 (Node Reboot Required)")
AER_COR = "nvidia 0000:00:06.0: PCIe Bus Error: severity=Correctable, type=Data Link Layer, (Transmitter ID)"
#: linux aer.c format, "Uncorrected (Non-Fatal)" severity
AER_UNC = "nvidia 0000:00:06.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, (Requester ID)"
#: linux __pcie_print_link_status format, width-limited (x8 of x16)
BW_X8 = ("pci 0000:00:06.0: 252.048 Gb/s available PCIe bandwidth, limited by 32.0 GT/s PCIe x8 link at 0000:00:00.0 "
         "(capable of 504.112 Gb/s with 32.0 GT/s PCIe x16 link)")
BW_GEN1 = ("pci 0000:00:06.0: 32.000 Gb/s available PCIe bandwidth, limited by 2.5 GT/s PCIe x16 link at 0000:00:00.0 "
           "(capable of 504.112 Gb/s with 32.0 GT/s PCIe x16 link)")


# --- the healthy node and the real capture stay silent -------------------------------------------------

def test_no_hardware_or_new_findings_on_healthy_example_and_real_capture() -> None:
    for root in (example_root("healthy"), BundleRoot(CAPTURE)):
        rep = report_of(root)
        assert rep.findings == [], [(f.code, f.summary) for f in rep.findings]
        assert rep.errors == []


def test_xid_table_loads_and_routes() -> None:
    t = xidtable.table()
    assert len(t.xids) == 172 and t.catalog["last_xid"] == 172
    assert t.get(79).action.name == "RESTART_BM" and t.get(79).severity is Severity.CRITICAL
    assert t.get(63).action.name == "IGNORE" and t.get(63).device_plugin == "unhealthy"
    assert t.get(13).device_plugin == "ignored" and t.get(13).app_class
    assert t.routed_to("GPU-HW-003") == {48, 94, 95, 140, 171, 172}
    assert t.routed_to("GPU-HW-005") == {74, *range(144, 151)}
    assert not t.get(999).known and t.get(999).action.name == "UNKNOWN"
    assert xidtable.pci_key("PCI:0000:3b:00") == xidtable.pci_key("00000000:3B:00.0") == "0000:3b:00"
    assert xidtable.pci_key("PCI:0004:01:00") == "0004:01:00"
    assert xidtable.recovery_action("changed from 0x0 (None) to 0x2 (Node Reboot Required)")[1] is Severity.CRITICAL


def test_xids_fact_maps_the_line_to_the_gpu(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X79)
    xf = collect_xids(facts_of(BundleRoot(b)))
    (e,) = xf.events
    assert (e.xid, e.key, e.current_boot) == (79, "0000:00:06", True)
    assert xf.gpu(e.key).uuid == GPU_UUID


# --- GPU-HW-001 --------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-HW-001", "positive")
def test_hw001_reset_class_xid_confirmed(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X109)
    f = one(b, "GPU-HW-001")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert "RESET_GPU" in f.summary and f.data["xids"] == {"109": 1}
    assert f.evidence[0].text.endswith(X109) and f.evidence[0].source == "/.gpuwarden/logs/kmsg.txt"
    assert any(e.source == "data/xid.yaml" and "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR" in e.text for e in f.evidence)
    assert f.affected[0].name == GPU_UUID


@pytest.mark.rule("GPU-HW-001", "positive")
def test_hw001_xid154_takes_the_recovery_actions_severity(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X154)
    f = one(b, "GPU-HW-001")
    assert f.status is Status.CONFIRMED and f.severity is Severity.CRITICAL
    assert "node reboot required" in f.summary.lower()


@pytest.mark.rule("GPU-HW-001", "positive")
def test_hw001_repeated_application_xids_are_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X13, X31, X43)
    f = one(b, "GPU-HW-001")
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM
    assert f.data["xids"] == {"13": 1, "31": 1, "43": 1}


@pytest.mark.rule("GPU-HW-001", "negative")
def test_hw001_single_app_xid_and_routed_xids_are_not_its(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X13, X79, X48, X63, X74)  # one app Xid; the rest belong to GPU-HW-002/3/4/5
    assert found(b, "GPU-HW-001") == []


# --- GPU-HW-002 --------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-HW-002", "positive")
def test_hw002_xid79_confirmed_critical(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X79, FELL)
    f = one(b, "GPU-HW-002")
    assert f.status is Status.CONFIRMED and f.severity is Severity.CRITICAL
    assert [e.text.split(";", 1)[-1] for e in f.evidence[:2]] == [X79, FELL]
    assert f.affected[0].name == GPU_UUID and f.data["gpu"] == "0000:00:06"


@pytest.mark.rule("GPU-HW-002", "positive")
def test_hw002_config_space_all_ff_and_nvml_gpu_is_lost(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    sysfs_gpu(b, config=b"\xff" * 64)
    set_probes(b, {"init": "error", "error": "GPU is lost", "error_code": 15})
    f = one(b, "GPU-HW-002")
    assert f.status is Status.CONFIRMED
    texts = [e.text for e in f.evidence]
    assert any("all 0xff" in t for t in texts) and any("GPU is lost" in t for t in texts)


@pytest.mark.rule("GPU-HW-002", "positive")
def test_hw002_nvml_names_one_gpu_lost_while_it_answers(tmp_path: Path) -> None:
    """NVML initialises, but gives this GPU no handle (NVML_ERROR_GPU_IS_LOST): named by its bus-order index."""
    b = healthy(tmp_path)
    set_probes(b, {**nvml_snapshot(), "gpus": [{"index": 0, "error": "GPU is lost", "error_code": 15}]})
    f = one(b, "GPU-HW-002")
    assert f.status is Status.CONFIRMED and f.severity is Severity.CRITICAL
    assert f.affected[0].name == GPU_UUID and f.data["gpu"] == "0000:00:06"
    assert any("nvmlDeviceGetHandleByIndex: GPU is lost" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-HW-002", "negative")
def test_hw002_nvml_lost_index_not_named_when_counts_differ(tmp_path: Path) -> None:
    """NVML counts a GPU the driver's list lacks: the index cannot be tied to a bus id, so the lost GPU is
    reported unnamed (no device to fence); another NVML error on a handle is not 'lost'."""
    b = healthy(tmp_path)
    set_probes(b, {**nvml_snapshot(), "gpus": nvml_snapshot()["gpus"] + [{"index": 1, "error": "GPU is lost",
                                                                          "error_code": 15}]})
    assert [f.affected[0].name for f in found(b, "GPU-HW-002")] == ["unknown"]
    set_probes(b, {**nvml_snapshot(), "gpus": [{"index": 0, "error": "Insufficient Permissions", "error_code": 4}]})
    assert found(b, "GPU-HW-002") == []


@pytest.mark.rule("GPU-HW-002", "positive")
def test_hw002_before_the_last_reboot_is_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    # syslog form (journalctl -k / /var/log/kern.log) of a line from the day before this boot
    write(b, "/.gpuwarden/logs/kernel.log", f"Nov 21 10:00:00 gpu-node-a kernel: [ 5000.123456] {X79}\n")
    f = one(b, "GPU-HW-002")
    assert f.status is Status.AT_RISK and f.severity is Severity.HIGH
    assert "before the last reboot" in f.summary


@pytest.mark.rule("GPU-HW-002", "negative")
def test_hw002_silent_on_healthy_config_space_and_other_xids(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    sysfs_gpu(b, config=b"\xde\x10\x35\x23" + b"\x00" * 60)
    add_kmsg(b, X63)
    set_probes(b, nvml_snapshot())
    assert found(b, "GPU-HW-002") == []


# --- GPU-HW-003 --------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-HW-003", "positive")
def test_hw003_xid48_and_volatile_dbe(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X48)
    edit_smi(b, ("<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>2</dram_uncorrectable>"))
    f = one(b, "GPU-HW-003")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH and f.data["xids"] == [48]
    texts = [e.text for e in f.evidence]
    assert "gpu 00000000:00:06.0: ecc_errors/volatile uncorrectable total 2" in texts


@pytest.mark.rule("GPU-HW-003", "positive")
def test_hw003_nvml_probe_counter(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    set_probes(b, nvml_snapshot(ecc_uncorrected_volatile=1))
    f = one(b, "GPU-HW-003")
    assert f.status is Status.CONFIRMED and "volatile uncorrected ECC errors 1" in f.evidence[0].text


@pytest.mark.rule("GPU-HW-003", "positive")
def test_hw003_sram_threshold_is_rma_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    edit_smi(b, ("<sram_threshold_exceeded>No</sram_threshold_exceeded>",
                 "<sram_threshold_exceeded>Yes</sram_threshold_exceeded>"))
    f = one(b, "GPU-HW-003")
    assert f.status is Status.AT_RISK and f.severity is Severity.HIGH and "RMA" in f.summary


@pytest.mark.rule("GPU-HW-003", "negative")
def test_hw003_aggregate_correctable_only_is_fine(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    # correctable errors and a non-ECC Xid: nothing uncorrectable
    edit_smi(b, ("<dram_correctable>0</dram_correctable>", "<dram_correctable>177</dram_correctable>"))
    add_kmsg(b, X63)
    assert found(b, "GPU-HW-003") == []


def test_hw003_not_evaluated_without_any_source(tmp_path: Path) -> None:
    b = tmp_path / "empty"
    write(b, "/etc/os-release", "ID=x\n")
    (b / "meta.json").write_text('{"format": "gpuwarden.bundle/v1"}')
    assert "GPU-HW-003" in skipped(b, "GPU-HW-003")


# --- GPU-HW-004 --------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-HW-004", "positive")
def test_hw004_remap_pending_confirmed_medium(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X63)
    edit_smi(b, ("<remapped_row_pending>No</remapped_row_pending>", "<remapped_row_pending>Yes</remapped_row_pending>"))
    f = one(b, "GPU-HW-004")
    assert f.status is Status.CONFIRMED and f.severity is Severity.MEDIUM and f.data["state"] == "pending"


@pytest.mark.rule("GPU-HW-004", "positive")
def test_hw004_remap_failure_confirmed_high(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    edit_smi(b, ("<remapped_row_failure>No</remapped_row_failure>", "<remapped_row_failure>Yes</remapped_row_failure>"))
    f = one(b, "GPU-HW-004")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH and f.data["state"] == "failure"


@pytest.mark.rule("GPU-HW-004", "positive")
def test_hw004_xid63_without_state_is_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X63)
    (b / "files/.gpuwarden/commands/nvidia-smi-q-x.xml").unlink()
    f = one(b, "GPU-HW-004")
    assert f.status is Status.AT_RISK and f.data["state"] == "recorded"


@pytest.mark.rule("GPU-HW-004", "negative")
def test_hw004_xid63_already_applied_by_a_reset(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X63)  # the XML (real capture) says pending No, failure No: a reset applied it
    assert found(b, "GPU-HW-004") == []


# --- GPU-HW-005 --------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-HW-005", "positive")
def test_hw005_nvlink_xids(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X74, X145)
    f = one(b, "GPU-HW-005")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    # the Nonfatal NVLink5 line (no interrupt info to decode) is not what makes the finding CONFIRMED
    assert f.data["xids"] == [74] and f.data["links"] == ["1"]


@pytest.mark.rule("GPU-HW-005", "positive")
def test_hw005_nonfatal_nvlink5_line_alone_is_at_risk_low(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X145)
    f = one(b, "GPU-HW-005")
    assert f.status is Status.AT_RISK and f.severity is Severity.LOW
    assert f.data["xids"] == [145] and f.data["links"] == ["2"]


@pytest.mark.rule("GPU-HW-005", "negative")
def test_hw005_silent_without_nvlink_xids(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X13, X63)
    assert found(b, "GPU-HW-005") == []


# --- GPU-HW-006 --------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-HW-006", "positive")
def test_hw006_width_degraded_in_smi(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    edit_smi(b, ("<current_link_width>16x</current_link_width>", "<current_link_width>8x</current_link_width>"))
    f = one(b, "GPU-HW-006")
    assert f.status is Status.CONFIRMED and f.severity is Severity.MEDIUM
    assert "link width 8x, max 16x" in f.evidence[0].text


@pytest.mark.rule("GPU-HW-006", "positive")
def test_hw006_gen_counts_only_under_load(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    edit_smi(b, ("<current_link_gen>5</current_link_gen>", "<current_link_gen>3</current_link_gen>"),
             ("<gpu_util>0 %</gpu_util>", "<gpu_util>97 %</gpu_util>"),
             ("<clocks_event_reason_gpu_idle>Active</clocks_event_reason_gpu_idle>",
              "<clocks_event_reason_gpu_idle>Not Active</clocks_event_reason_gpu_idle>"))
    f = one(b, "GPU-HW-006")
    assert "PCIe gen 3 while busy" in f.evidence[0].text


@pytest.mark.rule("GPU-HW-006", "positive")
def test_hw006_kernel_width_limit_and_uncorrected_aer(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, BW_X8, AER_UNC)
    f = one(b, "GPU-HW-006")
    assert f.status is Status.CONFIRMED and f.data["degraded"] and f.data["uncorrected_aer"]


@pytest.mark.rule("GPU-HW-006", "positive")
def test_hw006_sysfs_width_and_many_corrected_errors(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    sysfs_gpu(b, width="4", aer={"aer_dev_correctable": "RxErr 0\nBadTLP 12\nBadDLLP 140\nTOTAL_ERR_COR 152\n"})
    f = one(b, "GPU-HW-006")
    assert any(e.source.endswith("/current_link_width") and e.text == "x4 (max_link_width x16)" for e in f.evidence)
    assert any("TOTAL_ERR_COR 152" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-HW-006", "positive")
def test_hw006_corrected_aer_lines_only_are_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, *[AER_COR] * 12)
    f = one(b, "GPU-HW-006")
    assert f.status is Status.AT_RISK and f.severity is Severity.LOW


@pytest.mark.rule("GPU-HW-006", "negative")
def test_hw006_idle_gen_drop_and_boot_speed_limit_are_normal(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    # idle GPU (gpu_util 0 %, idle clock reason Active) at gen 1, and the boot-time gen-1 training line
    edit_smi(b, ("<current_link_gen>5</current_link_gen>", "<current_link_gen>1</current_link_gen>"))
    add_kmsg(b, BW_GEN1, *[AER_COR] * 3)
    assert found(b, "GPU-HW-006") == []


# --- GPU-HW-007 --------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-HW-007", "positive")
def test_hw007_gpu_on_the_bus_not_in_the_driver(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    sysfs_gpu(b)
    sysfs_gpu(b, "0000:00:07.0")
    f = one(b, "GPU-HW-007")
    assert f.status is Status.CONFIRMED and f.data["gpu"] == "0000:00:07"
    assert "bound to nvidia; not in /proc/driver/nvidia/gpus" in f.evidence[0].text


@pytest.mark.rule("GPU-HW-007", "positive")
def test_hw007_kubelet_registered_more_gpus(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    other = "GPU-0b7dc1b5-3a6e-4c5d-9e8f-1a2b3c4d5e6f"
    checkpoint(b, lambda d: d["RegisteredDevices"]["nvidia.com/gpu"].append(other))
    f = one(b, "GPU-HW-007")
    assert f.status is Status.CONFIRMED and other in f.evidence[0].text


@pytest.mark.rule("GPU-HW-007", "positive")
def test_hw007_boot_enumeration_with_probe_failure(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    # the capture's own enumeration line, for a second function, and the driver core's probe failure
    add_kmsg(b, "pci 0000:00:07.0: [10de:2335] type 00 class 0x030200 PCIe Endpoint",
             "nvidia: probe of 0000:00:07.0 failed with error -1", level=6)
    f = one(b, "GPU-HW-007")
    assert f.status is Status.CONFIRMED and f.data["gpu"] == "0000:00:07"


@pytest.mark.rule("GPU-HW-007", "positive")
def test_hw007_boot_enumeration_alone_is_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, "pci 0000:00:07.0: [10de:2335] type 00 class 0x030200 PCIe Endpoint", level=6)
    f = one(b, "GPU-HW-007")
    assert f.status is Status.AT_RISK and "vfio-pci" in f.summary


@pytest.mark.rule("GPU-HW-007", "negative")
def test_hw007_vfio_bound_gpu_and_replicas_are_not_missing(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    sysfs_gpu(b)
    sysfs_gpu(b, "0000:00:07.0", driver="vfio-pci")
    # time-slicing replicas of the one GPU: one UUID
    checkpoint(b, lambda d: d["RegisteredDevices"].__setitem__(
        "nvidia.com/gpu", [f"{GPU_UUID}::{i}" for i in range(4)]))
    assert found(b, "GPU-HW-007") == []


# --- GPU-HW-002: the classic lost-GPU message in each form ------------------------------------------------

#: NVIDIA/NVSentinel#155 (dmesg of a fleet node, 570.158.01), the address rewritten to the node's GPU
LOST = ("NVRM: The NVIDIA GPU 0000:00:06.0", "NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.")


@pytest.mark.rule("GPU-HW-002", "positive")
def test_hw002_classic_message_one_kmsg_record_and_three_lines(tmp_path: Path) -> None:
    for i, records in enumerate(([r"\x0a".join(LOST)], list(LOST))):
        b = healthy(tmp_path / str(i))
        add_kmsg(b, *records)
        f = one(b, "GPU-HW-002")
        assert f.status is Status.CONFIRMED and f.severity is Severity.CRITICAL
        assert f.affected[0].name == GPU_UUID and f.data["gpu"] == "0000:00:06"
        assert any("fallen off the bus and is not responding" in e.text for e in f.evidence)


def test_hw002_lost_message_pairs_only_its_own_lines() -> None:
    from gpuwarden.logs.scan import LogEvent
    from gpuwarden.facts.xids import lost_gpus

    def ev(offset: int, msg: str, **fields: str) -> LogEvent:
        return LogEvent("kernel.gpu-lost", "kernel", "k", offset, None, None, "", msg, fields, msg)

    head = ev(0, LOST[0], device="0000:b3:00.0")
    # rsyslog's #012 within one line; a header far from any tail; a tail with no header before it
    one_line = ev(100, "#012".join(LOST), device="0000:b4:00.0")
    lonely = ev(5000, LOST[0], device="0000:b5:00.0")
    tail_far = ev(9000, LOST[2], tail="x")
    got = lost_gpus([head, ev(80, LOST[2], tail="x"), one_line, lonely, tail_far], None)
    assert [(g.key, len(g.events)) for g in got] == [("0000:b3:00", 2), ("0000:b4:00", 1)]


# --- GPU-HW-008 ---------------------------------------------------------------------------------------

#: NVIDIA/NVSentinel syslog-health-monitor sxid_handler_test.go and tests/syslog_health_monitor_test.go
SX_FATAL = "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)"
SX_NONFATAL = "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20009, Non-fatal, Link 28 RX Short Error Rate"


@pytest.mark.rule("GPU-HW-008", "positive")
def test_hw008_fatal_sxid_confirmed_per_switch_and_link(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, SX_NONFATAL, SX_FATAL)
    f = one(b, "GPU-HW-008")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert f.data["fatal"] == [24007] and f.data["non_fatal"] == [20009] and f.data["links"] == ["28"]
    assert f.affected[0].kind == "nvswitch" and f.affected[0].name == "0000:c3:00"
    assert "GPU-DRV-007" in f.remedy  # the fabric check that follows a fatal SXid


@pytest.mark.rule("GPU-HW-008", "negative")
def test_hw008_silent_without_sxids_and_for_earlier_boots(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X13)
    assert found(b, "GPU-HW-008") == []
    b2 = healthy(tmp_path / "old")
    # a dmesg -x line of 2025: an earlier boot than the capture's
    write(b2, "/.gpuwarden/logs/kernel.log",
          "kern  :err   : 2025-01-25T10:34:54,859532+00:00 nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Fatal, "
          "Link 08 egress nonposted PRIV error\n")
    assert found(b2, "GPU-HW-008") == []


#: leptonai/gpud component_nvsentinel_test.go: the line says Non-fatal, the guide (D.4) says GPU access hangs, restart
SX_12028 = "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)"
#: NVIDIA/nvtrust#124 (dmesg at driver load): the guide says 22013 can be safely ignored
SX_22013 = "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link {} Minion Link DLREQ interrupt"
#: synthesized in the driver's format (the guide's convention) for SXid 23001 of its "always fatal" table (D.6)
SX_23001 = "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 23001, Fatal, Link 12 ingress SRC-VC buffer overflow"


@pytest.mark.rule("GPU-HW-008", "positive")
def test_hw008_graded_by_the_guide_not_the_line_word(tmp_path: Path) -> None:
    """Issue 32's miss: 12028 logged "Non-fatal" is, by the Fabric Manager guide, a stalled GPU access whose
    recovery is a restart: CONFIRMED high with that action, the switch named, the GPU behind it not guessed."""
    b = healthy(tmp_path)
    add_kmsg(b, SX_12028)
    f = one(b, "GPU-HW-008")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert f.data["actions"] == ["RESTART"] and f.data["fatal"] == [12028] and f.data["links"] == ["32"]
    assert f.affected[0].kind == "nvswitch" and f.affected[0].name == "0000:05:00"
    assert "guide D.4" in f.summary and "restart" in f.remedy.lower()
    assert "not established" in f.summary and f.data["gpus"] == []  # no port map, no Xid 74: never guessed
    assert any(e.source == "data/sxid.yaml" and "GPU access hangs" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-HW-008", "positive")
def test_hw008_always_fatal_is_critical_and_names_every_gpu(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, SX_23001)
    f = one(b, "GPU-HW-008")
    assert f.status is Status.CONFIRMED and f.severity is Severity.CRITICAL and f.data["actions"] == ["FABRIC_FATAL"]
    assert [a.kind for a in f.affected] == ["nvswitch", "gpu"] and f.affected[1].uuid == GPU_UUID
    assert "all 1 GPU(s) of the node" in f.summary


@pytest.mark.rule("GPU-HW-008", "positive")
def test_hw008_port_fatal_names_the_gpu_that_logged_xid74_with_it(tmp_path: Path) -> None:
    """The guide: a fatal SXid on a GPU's port reaches that GPU as Xid 74; the GPU that logged one within
    60 s is named, with its line as evidence."""
    b = healthy(tmp_path)
    add_kmsg(b, SX_FATAL, X74)
    f = one(b, "GPU-HW-008")
    assert f.severity is Severity.HIGH and f.data["actions"] == ["PORT_FATAL"]
    assert f.data["gpus"] == [GPU_UUID] and "Xid 74" in f.summary
    assert any("74, pid" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-HW-008", "positive")
def test_hw008_non_fatal_sxids_count_against_the_window(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, SX_NONFATAL)
    f = one(b, "GPU-HW-008")
    assert f.status is Status.AT_RISK and f.severity is Severity.LOW and f.data["window"]["count"] == 1
    b2 = healthy(tmp_path / "three")
    add_kmsg(b2, SX_NONFATAL, SX_NONFATAL.replace("Link 28", "Link 29"), SX_NONFATAL.replace("Link 28", "Link 30"))
    f2 = one(b2, "GPU-HW-008")
    assert f2.status is Status.AT_RISK and f2.severity is Severity.MEDIUM and f2.data["window"]["count"] == 3


@pytest.mark.rule("GPU-HW-008", "clears")
def test_hw008_non_fatal_clears_once_the_window_passes(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, SX_NONFATAL, SX_NONFATAL, SX_NONFATAL)
    assert one(b, "GPU-HW-008").severity is Severity.MEDIUM
    _later(b, 25 * 3600)  # checked again a day later, no new line: cleared
    assert found(b, "GPU-HW-008") == []
    b2 = healthy(tmp_path / "fatal")
    add_kmsg(b2, SX_12028)
    _later(b2, 25 * 3600)  # a fatal one stays for the boot: its recovery is a restart
    assert one(b2, "GPU-HW-008").status is Status.CONFIRMED


@pytest.mark.rule("GPU-HW-008", "negative")
def test_hw008_ignorable_sxids_at_driver_load_are_silent(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, *(SX_22013.format(n) for n in (44, 45, 46, 47)))
    assert found(b, "GPU-HW-008") == []


def test_sxid_table_rows_cite_the_guide_and_grade_up_by_the_line() -> None:
    t = xidtable.sxid_table()
    assert t.guide["version"].startswith("DU-09883-001") and len(t.sxids) >= 90
    assert all(r.guide.startswith("D.") for r in t.sxids.values())
    assert t.get(12028).action.name == "RESTART" and t.get(24007).action.name == "PORT_FATAL"
    assert t.get(23001).action.severity is Severity.CRITICAL and t.get(22013).action.name == "IGNORE"
    assert t.get(22012, "Fatal").action.name == "PORT_FATAL" and t.get(22012, "Non-fatal").action.name == "LINK"
    assert (t.get(99999, "Fatal").action.name, t.get(99999, "Non-fatal").action.name, t.get(99999).action.name) == (
        "PORT_FATAL", "NONE", "ESCALATE")
    with pytest.raises(ValueError):
        xidtable.load_sxids("schema: gpuwarden.sxid/v1\nactions: {NONE: {severity: low}}\n")


@pytest.mark.rule("GPU-DRV-007", "positive")
def test_drv007_sxid_lines_prove_an_nvswitch_system(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, SX_FATAL)
    f = one(b, "GPU-DRV-007")  # no device node or sysfs switch captured; the SXid line is the evidence
    assert f.status is Status.AT_RISK and any("SXid" in e.text for e in f.evidence)


def test_garbage_driver_lines_never_confirm_or_raise(tmp_path: Path) -> None:
    """Lines that look like driver lines but are not (cut, binary, absurd numbers): no traceback,
    no CONFIRMED finding; what names an Xid shows up as unparsed, an absurd Xid is escalated."""
    b = healthy(tmp_path)
    add_kmsg(b, "NVRM: Xid (PCI:0000:00:06): 99999999999999999999999, x",
             "NVRM: Xid (PCI:zz:zz): 145, RLW_REMAP Fatal XC0 i0 Link 99 (0xZZ 0x1)",
             "nvidia-nvswitch: SXid (PCI:): , Fatal, Link",
             r"NVRM: The NVIDIA GPU 0000:00:06.0\x0aNVRM: \xff\xfe",
             "NVRM: Xid (PCI:0000:00:06): 149, " + "A" * 5000,
             "NVRM: fallen off the bus and is not responding to commands.")
    rep = report_of(gpu_root(b))
    assert rep.errors == []
    hw = [f for f in rep.findings if f.code.startswith("GPU-HW")]
    # the one exception: an undecodable NVLink5 line that says Fatal is taken at its word (GPU-HW-005)
    assert not [f for f in hw if f.status is Status.CONFIRMED and f.code != "GPU-HW-005"], [(f.code, f.summary) for f in hw]
    assert any(f.code == "GPU-HW-001" and f.data.get("unparsed") for f in hw)
    for x in (145, 149):
        d = xidtable.decode_nvlink5(x, "RLW_REMAP Fatal XC0 i0 Link 99 (0xZZ 0x1)", 580)
        assert not d.decoded
    assert not xidtable.decode_nvlink5(150, "", None).decoded


def test_unparsed_lines_of_an_earlier_boot_are_not_reported(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    write(b, "/.gpuwarden/logs/kernel.log",
          "kern  :err   : 2025-01-25T10:34:54,859532+00:00 NVRM: Xid (PCI:0000:66:00): abc, pid=2280636\n")
    assert found(b, "GPU-HW-001") == []
    add_kmsg(b, "NVRM: Xid (PCI:0000:66:00): abc, pid=2280636")  # kmsg.txt is not read while kernel.log is
    write(b, "/.gpuwarden/logs/kernel.log",
          "kern  :err   : 2026-11-22T02:12:30,000000+00:00 NVRM: Xid (PCI:0000:66:00): abc, pid=2280636\n")
    (f,) = found(b, "GPU-HW-001")
    assert f.data["unparsed"] == 1 and f.severity is Severity.LOW


# --- issue 32: catalog-driven verdicts (follow-on Xids, Xid 94, repeats per window, decode wording) --

X45_AFTER = "NVRM: Xid (PCI:0000:00:06): 45, pid=1818990, name=python3, Ch 0000000{} caused by previous Xid 149"
X45_PLAIN = "NVRM: Xid (PCI:0000:00:06): 45, pid=1818990, name=python3, Ch 0000000{}"
X94 = "NVRM: Xid (PCI:0000:00:06): 94, pid=1234, name=python3, Contained ECC error"
#: a V2-layout RLW_REMAP line whose status 0x40 NVIDIA decodes RESET_GPU, logged with the word Nonfatal
X145_RESET_NONFATAL = "NVRM: Xid (PCI:0000:00:06): 145, RLW_REMAP Nonfatal XC0 i0 Link 02 (0x00000004 0x00000040 0x0 0x0)"


def _later(b: Path, seconds: float) -> None:
    """Move the bundle's capture time `seconds` later (the node was checked again that much later)."""
    import json
    meta = b / "meta.json"
    m = json.loads(meta.read_text())
    m["captured_at"] = float(m["captured_at"]) + seconds
    meta.write_text(json.dumps(m))


@pytest.mark.rule("GPU-HW-001", "negative")
def test_hw001_follow_on_xid45_is_tied_to_its_cause_by_time(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X109, *(X45_PLAIN.format(i) for i in range(1, 5)))  # 45s right after a 109, no cause named
    f = one(b, "GPU-HW-001")
    assert f.data["xids"] == {"109": 1} and f.data["follow_on"] == {"45": 4}
    assert any("follow-on" in e.text and "caused by Xid 109" in e.text for e in f.evidence)


@pytest.mark.rule("GPU-HW-001", "positive")
def test_hw001_solo_xid45_still_counts_as_application_class(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, *(X45_PLAIN.format(i) for i in range(1, 4)))  # nothing before them: solo (catalog: RESTART_FM)
    f = one(b, "GPU-HW-001")
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM and f.data["xids"] == {"45": 3}


@pytest.mark.rule("GPU-HW-001", "clears")
def test_hw001_repeated_application_xids_clear_once_the_window_passes(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X13, X31, X43)
    assert one(b, "GPU-HW-001").severity is Severity.MEDIUM
    _later(b, xidtable.table().repeat.window_s + 3600)
    assert found(b, "GPU-HW-001") == []


@pytest.mark.rule("GPU-HW-003", "positive")
def test_hw003_xid94_once_is_restart_the_application_low(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X94)
    f = one(b, "GPU-HW-003")
    assert f.status is Status.AT_RISK and f.severity is Severity.LOW
    assert "restart it" in f.summary and "reset" not in f.summary.lower()


@pytest.mark.rule("GPU-HW-003", "positive")
def test_hw003_xid94_repeated_is_medium_and_clears_after_the_window(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X94, X94, X94)
    f = one(b, "GPU-HW-003")
    assert f.severity is Severity.MEDIUM and f.data["repeated"] is True and f.data["count"] == 3
    _later(b, xidtable.table().repeat.window_s + 3600)
    f = one(b, "GPU-HW-003")
    assert f.severity is Severity.LOW and f.data["repeated"] is False


@pytest.mark.rule("GPU-HW-005", "positive")
def test_hw005_summary_agrees_with_a_reset_gpu_decode_on_a_nonfatal_line(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X145_RESET_NONFATAL)
    f = one(b, "GPU-HW-005")
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM
    assert "RESET_GPU" in f.summary and "no reset" not in f.summary
    assert f.data["decoded"] == ["RESET_GPU"]


@pytest.mark.rule("GPU-HW-005", "positive")
def test_hw005_quotes_the_follow_on_xid45_it_caused(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, "NVRM: Xid (PCI:0000:00:06): 146, TLW_RX/TLW_RX_PIPE0 Fatal XC0 i0 Link 00 (0x0000000a 0x00000004 0x0 0x0)",
             *(X45_AFTER.replace("149", "146").format(i) for i in range(1, 4)))
    f = one(b, "GPU-HW-005")
    assert f.status is Status.CONFIRMED and f.data["follow_on"] == {"45": 3}
    assert found(b, "GPU-HW-001") == []


# --- issue 32: every GPU finding names its GPU (index, UUID, PCI bus id, minor) ---------------------

SECOND_UUID = "GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456789"


def _two_gpus(tmp_path: Path) -> Path:
    """The healthy example with a second GPU at 0000:00:07.0 (minor 1), as /proc/driver/nvidia lists it."""
    b = healthy(tmp_path)
    info = bundle_file(b, "/proc/driver/nvidia/gpus/0000:00:06.0/information").read_text()
    second = info.replace("0000:00:06.0", "0000:00:07.0").replace("Device Minor: \t 0", "Device Minor: \t 1")
    second = second.replace(info.split("GPU UUID: \t ")[1].split("\n")[0], SECOND_UUID)
    write(b, "/proc/driver/nvidia/gpus/0000:00:07.0/information", second)
    edit_meta(b, lambda m: m["listdir"].__setitem__(
        "/proc/driver/nvidia/gpus", sorted(set(m["listdir"].get("/proc/driver/nvidia/gpus", [])) | {"0000:00:07.0"})))
    return b


@pytest.mark.rule("GPU-HW-001", "positive")
def test_gpu_findings_name_index_uuid_bus_id_and_minor_on_a_two_gpu_node(tmp_path: Path) -> None:
    from gpuwarden.agent.conditions import fault_message
    from gpuwarden.agent.metrics import AgentMetrics
    from gpuwarden.render.text import headline

    b = _two_gpus(tmp_path)
    add_kmsg(b, X109.replace("0000:00:06", "0000:00:07"))
    f = one(b, "GPU-HW-001")
    gpu = f.gpus()[0]
    assert (gpu.index, gpu.uuid, gpu.bus_id, gpu.minor) == (1, SECOND_UUID, "0000:00:07.0", 1)
    assert {"index": 1, "uuid": SECOND_UUID, "bus_id": "0000:00:07.0", "minor": 1}.items() <= \
        f.to_json()["affected"][0].items()
    assert "GPU 1 (0000:00:07.0)" in "\n".join(headline(f, "node-a"))
    assert f"[GPU 1 (0000:00:07.0) {SECOND_UUID}]" in fault_message([f])[1]
    m = AgentMetrics()
    m.set_findings([f])
    assert m["gpuwarden_findings"].labels(f.code, f.severity.label, f.status.value, f.family, "1")._value.get() == 1
