"""GPU-K8S-012: one lost GPU makes the device plugin fail every allocation of its node.

The failure lines are the upstream format strings chained as the kubelet quotes them: the plugin's
GetPreferredAllocation ("error getting list of preferred allocation devices: %v",
internal/plugin/server.go v0.20.0) over go-gpuallocator's NewDevices ("unable to get device link
information: %w" … "failed to get device uuid: %v"), wrapped by the kubelet's device manager
("device plugin GetPreferredAllocation rpc failed with err: %v") and admission ("Allocate failed
due to %v, which is unexpected"); the NVLink form is a line posted in a public troubleshooting
guide. The plugin's health line is internal/rm/health.go's "Marking device %v as unhealthy: %v".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.findings import Severity, Status
from tests.rules.test_hardware import FELL, SECOND_UUID, X79, _later, _two_gpus
from tests.support.bundles import GPU_UUID, bundle_file, write
from tests.support.gpunode import add_kmsg, checkpoint, found, healthy, one, plugin_log, set_probes

CODE = "GPU-K8S-012"
KUBELET_LOG = "/.gpuwarden/logs/kubelet.log"
GPA_LOST = ("Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: rpc error: code = Unknown "
            "desc = error getting list of preferred allocation devices: unable to get device link information: "
            "failed to construct linked device: failed to get device uuid: GPU is lost, which is unexpected")
NVLINK_LOST = ("Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: rpc error: code = Unknown "
               "desc = error getting list of preferred allocation devices: unable to get device link information: "
               "error getting NVLink for devices (1, 0): failed to get nvlink remote pci info: failed to get nvlink "
               "state: GPU is lost, which is unexpected")


def kubelet_event(msg: str, t: str = "02:12:40", pod: str = "ml/trainer-1") -> str:
    """The kubelet's event log line (V3) for a rejected pod, in journalctl's short format."""
    return (f'Nov 22 {t} gpu-node-a kubelet[1234]: I1122 {t}.100000    1234 event.go:389] "Event occurred" '
            f'object="{pod}" fieldPath="" kind="Pod" apiVersion="v1" type="Warning" '
            f'reason="UnexpectedAdmissionError" message="{msg}"\n')


def klog(msg: str) -> str:
    return f"I1122 02:12:30.123456       1 health.go:109] {msg}"


@pytest.mark.rule(CODE, "positive")
def test_k8s012_kubelet_rejects_on_a_lost_gpu_confirmed_critical(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X79, FELL)
    write(b, KUBELET_LOG, kubelet_event(GPA_LOST) + kubelet_event(GPA_LOST, pod="ml/trainer-2"))
    f = one(b, CODE)
    assert f.status is Status.CONFIRMED and f.severity is Severity.CRITICAL
    # the pod holding the lost GPU (the capture's checkpoint) is named with it
    assert f.summary.startswith("GPU 0 (0000:00:06.0) of 1 (held by pod(s) ml/trainer-0) is lost and the device "
                                "plugin fails every allocation")
    assert f.data["failures"] == 2 and f.data["gpus"] == ["0000:00:06"]
    assert f.affected[0].uuid == GPU_UUID and f.affected[0].index == 0
    assert any("GPU is lost, which is unexpected" in e.text for e in f.evidence)
    assert any("fallen off the bus" in e.text for e in f.evidence)


@pytest.mark.rule(CODE, "positive")
def test_k8s012_names_the_lost_gpu_of_two_and_takes_the_plugin_health_line(tmp_path: Path) -> None:
    b = _two_gpus(tmp_path)
    plugin_log(b, klog(f"Marking device {SECOND_UUID} as unhealthy: GPU is lost"))
    write(b, KUBELET_LOG, kubelet_event(NVLINK_LOST))
    f = one(b, CODE)
    assert f.status is Status.CONFIRMED
    assert "GPU 1 (0000:00:07.0) of 2 is lost" in f.summary
    assert f.affected[0].uuid == SECOND_UUID and f.data["gpus"] == ["0000:00:07"]


@pytest.mark.rule(CODE, "positive")
def test_k8s012_without_lost_gpu_evidence_names_the_pair_from_the_line(tmp_path: Path) -> None:
    b = _two_gpus(tmp_path)
    write(b, KUBELET_LOG, kubelet_event(NVLINK_LOST))
    f = one(b, CODE)
    assert f.status is Status.CONFIRMED and f.summary.startswith("GPU 1 (0000:00:07.0) or GPU 0 (0000:00:06.0) (of 2)") \
        or f.summary.startswith("GPU 0 (0000:00:06.0) or GPU 1 (0000:00:07.0) (of 2)")


@pytest.mark.rule(CODE, "positive")
def test_k8s012_lost_gpu_still_advertised_with_replicas_is_at_risk(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    set_probes(b, {"init": "error", "error": "GPU is lost", "error_code": 15})
    checkpoint(b, lambda d: d["RegisteredDevices"].__setitem__("nvidia.com/gpu", [f"{GPU_UUID}::{i}" for i in range(4)]))
    f = one(b, CODE)
    assert f.status is Status.AT_RISK and f.severity is Severity.HIGH
    assert f.data["advertised"] == [f"{GPU_UUID}::{i}" for i in range(4)]
    assert "replicas of the lost GPU" in f.summary
    assert any("still lists" in e.text for e in f.evidence)


#: the healthy capture's GPU pod (its checkpoint's PodDeviceEntries and /var/log/pods)
TRAINER_UID = "8f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"
#: MIG device UUIDs in the form `nvidia-smi -L` prints them (the mig-nvml-hang example's write-up)
MIG_UUIDS = ["MIG-2b1a0c6e-7a4e-5b8e-9a31-0d3c5f1e2a01", "MIG-2b1a0c6e-7a4e-5b8e-9a31-0d3c5f1e2a02"]
#: two <mig_device> entries in the schema of the mig-nvml-hang example's nvidia-smi -q -x (itself the real
#: H200 capture's schema with MIG devices as nvidia-smi 570/575 prints them: no MIG UUID among their fields)
MIG_BLOCK = "".join(f"<mig_device><index>{i}</index><gpu_instance_id>{g}</gpu_instance_id>"
                    f"<compute_instance_id>0</compute_instance_id></mig_device>" for i, g in ((0, 2), (1, 3)))


def _replicas_held(d: dict) -> None:
    d["RegisteredDevices"]["nvidia.com/gpu"] = [f"{GPU_UUID}::{i}" for i in range(4)]
    d["PodDeviceEntries"][0]["DeviceIDs"] = {"-1": [f"{GPU_UUID}::1"]}


@pytest.mark.rule(CODE, "positive")
def test_k8s012_names_every_replica_of_the_lost_gpu_and_the_pods_holding_them(tmp_path: Path) -> None:
    """k8s-device-plugin#1929: the time-slicing/MPS replicas of a broken GPU are broken too."""
    b = healthy(tmp_path)
    add_kmsg(b, X79, FELL)
    checkpoint(b, _replicas_held)
    write(b, KUBELET_LOG, kubelet_event(GPA_LOST))
    f = one(b, CODE)
    assert f.status is Status.CONFIRMED
    assert "GPU 0 (0000:00:06.0) of 1 and its 4 replica(s) (held by pod(s) " in f.summary
    held = f.data["held"]["0000:00:06"]
    assert held["replicas"] == 4 and held["devices"] == [f"{GPU_UUID}::{i}" for i in range(4)]
    pods = [a for a in f.affected if a.kind == "pod"]
    assert [a.uid for a in pods] == [TRAINER_UID] and f"{GPU_UUID}::1" in pods[0].detail
    assert any("PodDeviceEntries" in e.text and "::1" in e.text for e in f.evidence)


def _mig(b: Path, gpus_with_mig: int = 1) -> None:
    text = bundle_file(b, "/.gpuwarden/commands/nvidia-smi-q-x.xml").read_text()
    assert "<mig_devices>" in text or "</mig_mode>" in text
    text = text.replace("<current_mig>Disabled</current_mig>", "<current_mig>Enabled</current_mig>")
    if "<mig_devices>" in text:
        import re
        text = re.sub(r"<mig_devices>.*?</mig_devices>", f"<mig_devices>{MIG_BLOCK}</mig_devices>", text, count=1, flags=re.S)
    else:
        text = text.replace("</mig_mode>", f"</mig_mode><mig_devices>{MIG_BLOCK}</mig_devices>", 1)
    write(b, "/.gpuwarden/commands/nvidia-smi-q-x.xml", text)


def _mig_held(d: dict) -> None:
    """The plugin's mixed strategy: the MIG devices under their profile's resource, the pod holding the first."""
    d["RegisteredDevices"]["nvidia.com/mig-1g.18gb"] = MIG_UUIDS
    d["PodDeviceEntries"][0].update(ResourceName="nvidia.com/mig-1g.18gb", DeviceIDs={"-1": [MIG_UUIDS[0]]})


@pytest.mark.rule(CODE, "positive")
def test_k8s012_mig_slices_of_the_nodes_only_mig_gpu_are_its(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    _mig(b)
    add_kmsg(b, X79, FELL)
    checkpoint(b, _mig_held)
    write(b, KUBELET_LOG, kubelet_event(GPA_LOST))
    f = one(b, CODE)
    held = f.data["held"]["0000:00:06"]
    assert held["mig"] == 2 and held["mig_slices"] == 2 and set(MIG_UUIDS) <= set(held["devices"])
    assert "and its 2 MIG slice(s) (held by pod(s)" in f.summary
    assert [a.uid for a in f.affected if a.kind == "pod"] == [TRAINER_UID]


@pytest.mark.rule(CODE, "negative")
def test_k8s012_mig_parent_not_established_is_said_never_guessed(tmp_path: Path) -> None:
    """Two GPUs run MIG: nvidia-smi -q names no MIG UUID, so no MIG device is given to the lost GPU."""
    from tests.rules.test_hardware import _two_gpus
    b = _two_gpus(tmp_path)
    _mig(b)
    text = bundle_file(b, "/.gpuwarden/commands/nvidia-smi-q-x.xml").read_text()
    i = text.index("<gpu id=")
    j = text.index("</gpu>", i) + len("</gpu>")
    second = text[i:j].replace("00000000:00:06.0", "00000000:00:07.0").replace(GPU_UUID, SECOND_UUID)
    write(b, "/.gpuwarden/commands/nvidia-smi-q-x.xml", text[:j] + second + text[j:])
    plugin_log(b, klog(f"Marking device {SECOND_UUID} as unhealthy: GPU is lost"))
    checkpoint(b, _mig_held)
    write(b, KUBELET_LOG, kubelet_event(NVLINK_LOST))
    f = one(b, CODE)
    held = f.data["held"]["0000:00:07"]
    assert held["mig"] == 0 and held["mig_not_established"] == MIG_UUIDS and held["pods"] == []
    assert "MIG device UUIDs: parent not established" in f.summary
    assert not [a for a in f.affected if a.kind == "pod"]
    assert any("not established" in e.text for e in f.evidence)


@pytest.mark.rule(CODE, "positive")
def test_k8s012_plugin_marked_it_unhealthy_but_serves_the_other_whole_gpu_is_at_risk(tmp_path: Path) -> None:
    b = _two_gpus(tmp_path)
    plugin_log(b, klog(f"Marking device {SECOND_UUID} as unhealthy: GPU is lost"))
    f = one(b, CODE)  # the checkpoint lists only GPU 0: the preferred allocation still reads GPU 1 through NVML
    assert f.status is Status.AT_RISK and "reads every GPU through NVML" in f.summary


@pytest.mark.rule(CODE, "negative")
def test_k8s012_silent_on_healthy_and_on_other_allocation_errors(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    assert found(b, CODE) == []
    write(b, KUBELET_LOG, kubelet_event(GPA_LOST.replace("GPU is lost", "Insufficient Permissions")))
    plugin_log(b, klog("Error waiting for event: ERROR_UNKNOWN; Marking all devices as unhealthy"))
    assert found(b, CODE) == []


@pytest.mark.rule(CODE, "clears")
def test_k8s012_clears_once_failures_age_out_and_the_gpu_is_back(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    write(b, KUBELET_LOG, kubelet_event(GPA_LOST))
    assert one(b, CODE).status is Status.CONFIRMED
    _later(b, 601)  # ten minutes without a new failure, nothing lost now: the storm is over
    assert found(b, CODE) == []


@pytest.mark.rule(CODE, "clears")
def test_k8s012_a_plugin_restart_after_the_gpu_returned_clears_it(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_log(b, klog(f"Marking device {GPU_UUID} as unhealthy: GPU is lost"), n=0)
    assert one(b, CODE).status is Status.AT_RISK
    plugin_log(b, klog("Starting to serve 'nvidia.com/gpu'"), n=1)  # the plugin restarted: a new log file
    assert found(b, CODE) == []


@pytest.mark.rule(CODE, "positive")
def test_k8s012_on_a_one_gpu_node_the_failure_alone_names_its_gpu(tmp_path: Path) -> None:
    """The kubelet's line as its event log writes it without a journal prefix (klog), the GPU lost only to NVML."""
    b = healthy(tmp_path)
    write(b, KUBELET_LOG, f'I1122 02:12:40.841387   31135 event.go:389] "Event occurred" object="ml/storm-1" '
                          f'fieldPath="" kind="Pod" apiVersion="v1" type="Warning" reason="UnexpectedAdmissionError" '
                          f'message="{GPA_LOST}"\n')
    f = one(b, CODE)
    assert f.status is Status.CONFIRMED and f.summary.startswith("GPU 0 (0000:00:06.0) of 1 (held by pod(s) ml/trainer-0) is lost")
    assert f.affected[0].uuid == GPU_UUID


def test_a_failure_logged_just_before_the_plugin_restarted_no_longer_counts() -> None:
    """Run 13 on the GPU hosts: the plugin restarted ~1 s after the last failure; a microsecond klog time
    before the restart must not count (a second's slack only for a whole-second syslog time)."""
    from gpuwarden.logs.scan import LogEvent
    from gpuwarden.rules.lost_gpu import _recent

    def at(t: float) -> LogEvent:
        return LogEvent("kubelet.gpa-gpu-lost", "kubelet", "/var/log/kubelet.log", 0, t, None, "I", "", {}, "")

    since, now = 1000.5, 1010.0
    assert not _recent(at(999.63), now, since)  # microseconds, 0.87 s before the restart
    assert _recent(at(1000.6), now, since)  # after it
    assert _recent(at(1000.0), now, since)  # a whole second: the restart may have come later in it
    assert not _recent(at(998.0), now, since)


# --- the same trace on the other findings of a broken GPU (GPU-HW-002, GPU-DRV-005) ---------------------

@pytest.mark.rule("GPU-HW-002", "positive")
def test_hw002_names_the_replicas_of_the_gpu_that_fell_off_and_their_pods(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    add_kmsg(b, X79)
    checkpoint(b, _replicas_held)
    f = one(b, "GPU-HW-002")
    assert "and its 4 replica(s) (held by pod(s) ml/trainer-0) fell off the bus" in f.summary
    assert f.data["held"]["replicas"] == 4 and [a.uid for a in f.affected if a.kind == "pod"] == [TRAINER_UID]


@pytest.mark.rule("GPU-HW-002", "clears")
def test_hw002_replicas_of_a_gpu_lost_before_the_reboot_are_not_named(tmp_path: Path) -> None:
    """The GPU came back with the reboot: its replicas work again, and the earlier-boot finding names none."""
    b = healthy(tmp_path)
    write(b, "/.gpuwarden/logs/kernel.log", f"Nov 21 10:00:00 gpu-node-a kernel: [ 5000.123456] {X79}\n")
    checkpoint(b, _replicas_held)
    f = one(b, "GPU-HW-002")
    assert f.status is Status.AT_RISK and "replica" not in f.summary and not [a for a in f.affected if a.kind == "pod"]


def _reset_required(tmp_path: Path, edit) -> "object":
    """GPU-DRV-005 on the healthy node after the driver's reset-required assertion, its checkpoint edited."""
    from tests.rules.test_driver import RESET_REQUIRED
    b = healthy(tmp_path)
    add_kmsg(b, RESET_REQUIRED)
    checkpoint(b, edit)
    return one(b, "GPU-DRV-005")


@pytest.mark.rule("GPU-DRV-005", "positive")
def test_drv005_reset_required_names_the_replicas_and_their_pods(tmp_path: Path) -> None:
    f = _reset_required(tmp_path, _replicas_held)
    assert "and its 4 replica(s) (held by pod(s) ml/trainer-0) needs a reset" in f.summary
    assert f.data["held"]["devices"] == [f"{GPU_UUID}::{i}" for i in range(4)]


@pytest.mark.rule("GPU-DRV-005", "negative")
def test_drv005_a_gpu_nobody_holds_names_no_pod(tmp_path: Path) -> None:
    f = _reset_required(tmp_path, lambda d: d.__setitem__("PodDeviceEntries", []))
    assert "held by" not in f.summary and f.data["held"]["pods"] == []
