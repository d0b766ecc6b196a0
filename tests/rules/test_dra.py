"""GPU-DRA-010/011/012 on DRA variants of the example nodes (tests/support/dranode.py says where each
file's format comes from).

`uvm-missing` gives a GPU container whose device cgroup lacks nvidia-uvm (incident 1's devices.list);
made a DRA node, its claim's spec lacks the node too: incident 1 in its DRA form. `healthy` gives a
container allowed every node: the claim spec's omission is then only AT-RISK.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwarden.findings import Severity, Status
from tests.support.bundles import CHECKPOINT, GPU_UUID, POD_UID, bundle_file, edit_meta, ev_lines, open_dir, report_of, write
from tests.support.dranode import (
    EXAMPLE_CLAIM_UID,
    EXAMPLE_SPEC_PATH,
    CLAIM_NAME,
    CLAIM_UID,
    DRIVER_CP,
    NAMESPACE,
    SPEC_PATH,
    STATE,
    claim_spec,
    driver_checkpoint,
    kubelet_state,
    make_dra,
)
from tests.support.gpunode import cri, found, healthy, one, skipped

DRA_POD_LOG = ("/var/log/pods/nvidia-dra-driver-gpu_nvidia-dra-driver-gpu-kubelet-plugin-4xk9z_"
               "7c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f/gpus")

CLAIM = f"{NAMESPACE}/{CLAIM_NAME}"


# --- GPU-DRA-010 -------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-DRA-010", "positive")
def test_dra010_claim_spec_without_uvm_and_container_denied(tmp_path: Path) -> None:
    b = healthy(tmp_path, "uvm-missing")
    make_dra(b, spec=claim_spec(uvm=False))
    f = one(b, "GPU-DRA-010")
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert f.data["missing"] == ["/dev/nvidia-uvm"] and f.data["claim"] == CLAIM_UID
    assert f.data["pods"] == ["ml/trainer-0"]
    assert CLAIM in f.summary and "ml/trainer-0" in f.summary
    kinds = {(a.kind, a.name) for a in f.affected}
    assert ("claim", CLAIM_NAME) in kinds and ("container", "trainer-0/trainer") in kinds
    lines = ev_lines(f)
    assert any(line.startswith(SPEC_PATH + ": deviceNodes:") and "(no /dev/nvidia-uvm)" in line for line in lines)
    assert any("devices.list" in line and "/dev/nvidia-uvm" in line for line in lines)


@pytest.mark.rule("GPU-DRA-010", "positive")
def test_dra010_spec_without_uvm_but_container_allowed_is_at_risk(tmp_path: Path) -> None:
    """The healthy container's cgroup allows nvidia-uvm (it was not made from this spec, or the
    policy came from elsewhere): the spec's omission is not proven to hurt anyone yet."""
    b = healthy(tmp_path)
    make_dra(b, spec=claim_spec(uvm=False))
    f = one(b, "GPU-DRA-010")
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM


@pytest.mark.rule("GPU-DRA-010", "positive")
def test_dra010_spec_without_the_gpus_node(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    make_dra(b, spec=claim_spec(gpu=None), containers_devices=["/dev/nvidiactl"])
    f = one(b, "GPU-DRA-010")
    assert f.data["missing"] == ["/dev/nvidia0"]
    assert f.status is Status.AT_RISK  # the container's GPU is unknown to gpu_access: not proven denied


@pytest.mark.rule("GPU-DRA-010", "negative")
def test_dra010_complete_spec(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    make_dra(b)
    assert found(b, "GPU-DRA-010") == []


@pytest.mark.rule("GPU-DRA-010", "negative")
def test_dra010_not_a_dra_node(tmp_path: Path) -> None:
    b = healthy(tmp_path, "uvm-missing")
    assert found(b, "GPU-DRA-010") == []
    # no claim state and no registry: not a DRA node, so the rule does not apply (issue 44: no gap)
    assert skipped(b, "GPU-DRA-010") == {}
    assert "no DRA on this node" in not_applicable(b, "GPU-DRA-010")["GPU-DRA-010"]
    edit_meta(b, lambda m: m["listdir"].__setitem__("/var/lib/kubelet/plugins_registry", []))
    assert found(b, "GPU-DRA-010") == [] and skipped(b, "GPU-DRA-010") == {}  # the kubelet has no DRA driver
    assert "lists no DRA driver" in not_applicable(b, "GPU-DRA-010")["GPU-DRA-010"]


def not_applicable(b: Path, code: str) -> dict[str, str]:
    rep = report_of(open_dir(b), (code,))
    return {s.code: s.reason for s in rep.not_applicable}


@pytest.mark.rule("GPU-DRA-010", "clears")
def test_dra010_clears_once_the_pod_is_recreated(tmp_path: Path) -> None:
    """The remedy: the pod is deleted (its claim unprepared, the spec deleted) and a new one gets a
    complete spec and a device cgroup that allows nvidia-uvm: the finding is gone."""
    b = healthy(tmp_path, "uvm-missing")
    make_dra(b, spec=claim_spec(uvm=False))
    assert one(b, "GPU-DRA-010").status is Status.CONFIRMED
    fixed = healthy(tmp_path / "after")
    make_dra(fixed)
    assert found(fixed, "GPU-DRA-010") == []


# --- GPU-DRA-011 -------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-DRA-011", "positive")
def test_dra011_claim_spec_of_an_old_driver(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    make_dra(b, spec=claim_spec(version="570.158.01"))
    f = one(b, "GPU-DRA-011")
    assert f.status is Status.CONFIRMED and f.data["claim"] == CLAIM_UID and f.data["pods"] == ["ml/trainer-0"]
    assert any("mounts driver libraries of version 570.158.01; the loaded module is 580.159.04" in line
               for line in ev_lines(f))
    assert found(b, "GPU-DEV-004") == []  # the claim's spec is this rule's, not the node spec's


@pytest.mark.rule("GPU-DRA-011", "positive")
def test_dra011_claim_spec_names_a_gpu_gone(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    make_dra(b, spec=claim_spec(gpu="/dev/nvidia3"), containers_devices=["/dev/nvidiactl"])
    f = one(b, "GPU-DRA-011")
    assert any("/dev/nvidia3 does not exist on the host" in line for line in ev_lines(f))


@pytest.mark.rule("GPU-DRA-011", "positive")
def test_dra011_claim_spec_with_an_old_caps_major(tmp_path: Path) -> None:
    b = healthy(tmp_path)  # /proc/devices: 241 nvidia-caps
    make_dra(b, spec=claim_spec(caps_major=237))
    f = one(b, "GPU-DRA-011")
    assert any("nvidia-cap21 major 237, but /proc/devices says 241 nvidia-caps" in line for line in ev_lines(f))


@pytest.mark.rule("GPU-DRA-011", "negative")
def test_dra011_current_spec(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    make_dra(b)
    assert found(b, "GPU-DRA-011") == []


@pytest.mark.rule("GPU-DRA-011", "clears")
def test_dra011_clears_when_the_claim_is_prepared_again(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    make_dra(b, spec=claim_spec(version="570.158.01"))
    assert found(b, "GPU-DRA-011")
    write(b, SPEC_PATH, claim_spec())
    assert found(b, "GPU-DRA-011") == []


# --- GPU-DRA-012 -------------------------------------------------------------------------------------

@pytest.mark.rule("GPU-DRA-012", "positive")
def test_dra012_one_gpu_held_by_both(tmp_path: Path) -> None:
    """The device plugin's allocation of the GPU to the pod is kept, and a second pod's claim holds
    the same GPU through DRA."""
    b = healthy(tmp_path)
    make_dra(b, device_plugin=True)
    other = "0b1c2d3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e"
    write(b, STATE, kubelet_state([(CLAIM_UID, CLAIM_NAME, NAMESPACE, [other], "gpu-0", [f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-0"])]))
    f = one(b, "GPU-DRA-012")
    assert f.status is Status.CONFIRMED and f.data["gpus"] == [GPU_UUID]
    assert any(line.startswith(CHECKPOINT) and GPU_UUID in line and POD_UID in line for line in ev_lines(f))


@pytest.mark.rule("GPU-DRA-012", "positive")
def test_dra012_both_registered(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    make_dra(b)  # the device plugin's socket and registered devices remain; no GPU held by both
    f = one(b, "GPU-DRA-012")
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM


@pytest.mark.rule("GPU-DRA-012", "negative")
def test_dra012_dra_only(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    make_dra(b)
    cp = bundle_file(b, CHECKPOINT)
    doc = json.loads(cp.read_text())
    doc["Data"]["RegisteredDevices"] = {}
    cp.write_text(json.dumps(doc))
    edit_meta(b, lambda m: m["listdir"]["/var/lib/kubelet/device-plugins"].remove("nvidia-gpu.sock"))
    assert found(b, "GPU-DRA-012") == []


@pytest.mark.rule("GPU-DRA-012", "clears")
def test_dra012_clears_when_the_device_plugin_is_gone(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    make_dra(b)
    assert found(b, "GPU-DRA-012")
    test_dra012_dra_only(tmp_path / "after")


# --- the fact on garbage -------------------------------------------------------------------------------

@pytest.mark.parametrize("garbage", ["", "{", "[]", '{"Data": 5}', '{"Data": "[1,2]"}', '{"Data": "{\\"Entries\\": 7}"}',
                                     '{"v2": {"preparedClaims": [1]}}', "\x00\xff" * 40])
def test_dra_rules_survive_garbage_state(tmp_path: Path, garbage: str) -> None:
    b = healthy(tmp_path, "uvm-missing")
    make_dra(b, spec=claim_spec(uvm=False))
    write(b, STATE, garbage)
    write(b, DRIVER_CP, garbage)
    for code in ("GPU-DRA-010", "GPU-DRA-011", "GPU-DRA-012"):
        for f in found(b, code):
            assert f.status is not Status.CONFIRMED or code == "GPU-DRA-012"


def test_dra_claim_spec_garbage_is_not_a_finding(tmp_path: Path) -> None:
    b = healthy(tmp_path, "uvm-missing")
    make_dra(b)
    for text in ("", "kind: [", "{\"kind\": 5}", "- a\n- b\n", "kind: k8s.gpu.nvidia.com/claim\ndevices: 7\n"):
        write(b, SPEC_PATH, text)
        assert found(b, "GPU-DRA-010") == [] and found(b, "GPU-DRA-011") == []


def test_dra_driver_checkpoint_alone_names_the_claim(tmp_path: Path) -> None:
    """The kubelet's state unread (an older kubelet, or denied): the driver's checkpoint still names
    the claim; no pod is known, so nothing can be CONFIRMED."""
    b = healthy(tmp_path, "uvm-missing")
    make_dra(b, spec=claim_spec(uvm=False))
    write(b, STATE, "")
    f = one(b, "GPU-DRA-010")
    assert f.status is Status.AT_RISK and CLAIM in f.summary
    write(b, DRIVER_CP, driver_checkpoint([(CLAIM_UID, CLAIM_NAME, NAMESPACE, "gpu-0", GPU_UUID)], state="PrepareStarted"))
    assert one(b, "GPU-DRA-010").status is Status.AT_RISK


# --- GPU-DRA-013 -------------------------------------------------------------------------------------

def _kubelet(version: str, *extra: str) -> str:
    lines = [f'"Kubelet version" kubeletVersion="{version}"'] + list(extra)
    return "".join(f"Nov 22 02:12:{20 + i:02d} gpu-node-a kubelet[1200]: I1122 02:12:{20 + i:02d}.123456    1200 "
                   f"server.go:530] {x}\n" for i, x in enumerate(lines))


def _waiting(b: Path) -> None:
    """The kubelet recorded the claim for the pod (DriverState without devices) and the driver never saw it."""
    doc = json.loads(kubelet_state([(CLAIM_UID, CLAIM_NAME, NAMESPACE, [POD_UID], "gpu-0", [])]))
    data = json.loads(doc["Data"])
    data["Entries"][0]["DriverState"]["gpu.nvidia.com"]["Devices"] = []
    doc["Data"] = json.dumps(data)
    write(b, STATE, json.dumps(doc))
    write(b, DRIVER_CP, driver_checkpoint([]))


@pytest.mark.rule("GPU-DRA-013", "positive")
def test_dra013_affected_kubelet_and_a_claim_never_prepared(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    make_dra(b)
    _waiting(b)
    write(b, "/.gpuwarden/logs/kubelet.log", _kubelet("v1.34.1"))
    f = one(b, "GPU-DRA-013")
    assert f.status is Status.AT_RISK and f.severity is Severity.HIGH
    assert f.data == {"kubelet": "v1.34.1", "claims": [CLAIM_UID]} and "upgrade to 1.34.2" in f.summary


@pytest.mark.rule("GPU-DRA-013", "positive")
def test_dra013_affected_kubelet_idle(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    make_dra(b)
    write(b, "/.gpuwarden/logs/kubelet.log", _kubelet("v1.34.0"))
    f = one(b, "GPU-DRA-013")
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM and f.data["claims"] == []


@pytest.mark.rule("GPU-DRA-013", "negative")
def test_dra013_fixed_kubelet(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    make_dra(b)
    _waiting(b)
    for v in ("v1.34.2", "v1.35.0", "v1.33.5"):
        write(b, "/.gpuwarden/logs/kubelet.log", _kubelet(v))
        assert found(b, "GPU-DRA-013") == []


@pytest.mark.rule("GPU-DRA-013", "negative")
def test_dra013_claim_the_driver_prepared_is_not_waiting(tmp_path: Path) -> None:
    """The driver's log shows it prepared the claim: the call reached it (the kubelet's state lagging)."""
    b = healthy(tmp_path)
    make_dra(b)
    _waiting(b)
    write(b, "/.gpuwarden/logs/kubelet.log", _kubelet("v1.34.1"))
    write(b, f"{DRA_POD_LOG}/0.log", cri(f"I1122 02:12:31.000000       1 driver.go:422] Returning newly prepared devices "
                                         f"for claim '{NAMESPACE}/{CLAIM_NAME}:{CLAIM_UID}': [gpu-0]"))
    f = one(b, "GPU-DRA-013")
    assert f.data["claims"] == [] and f.severity is Severity.MEDIUM


@pytest.mark.rule("GPU-DRA-013", "clears")
def test_dra013_clears_after_the_upgrade(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    make_dra(b)
    _waiting(b)
    write(b, "/.gpuwarden/logs/kubelet.log", _kubelet("v1.34.1"))
    assert found(b, "GPU-DRA-013")
    write(b, "/.gpuwarden/logs/kubelet.log", _kubelet("v1.34.1") + _kubelet("v1.34.2").replace("02:12:2", "02:12:3"))
    assert found(b, "GPU-DRA-013") == []


# --- the device-plugin rules on a DRA node ------------------------------------------------------------

@pytest.mark.rule("GPU-K8S-002", "negative")
def test_k8s002_not_raised_on_a_dra_node(tmp_path: Path) -> None:
    """No device plugin runs on a DRA node: the DRA driver serves the GPUs, nothing is unregistered."""
    b = healthy(tmp_path, "dra-uvm-missing")
    assert found(b, "GPU-K8S-002") == []


def test_dev001_leaves_a_claims_container_to_dra010(tmp_path: Path) -> None:
    b = healthy(tmp_path, "dra-uvm-missing")
    assert found(b, "GPU-DEV-001") == [] and one(b, "GPU-DRA-010").status is Status.CONFIRMED


def test_dev001_still_sees_a_denial_the_claim_spec_does_not_explain(tmp_path: Path) -> None:
    """The claim's spec has nvidia-uvm, yet the container's cgroup denies it (dropped later, or by
    someone else): not GPU-DRA-010's, so GPU-DEV-001 still reports it."""
    b = healthy(tmp_path, "dra-uvm-missing")
    write(b, EXAMPLE_SPEC_PATH, claim_spec(EXAMPLE_CLAIM_UID))
    assert found(b, "GPU-DRA-010") == []
    assert one(b, "GPU-DEV-001").status is Status.CONFIRMED


# --- MPS on a DRA node -----------------------------------------------------------------------------------

DRA_MPS_LOG = ("/var/log/pods/nvidia-dra-driver-gpu_mps-control-daemon-5d3e1b2a-6b9f7c8d4-x2x4k_"
               "2b3c4d5e-6f70-4a81-9b2c-3d4e5f607182/mps-control-daemon/0.log")


@pytest.mark.rule("GPU-K8S-007", "positive")
def test_k8s007_sees_the_dra_drivers_mps_daemon(tmp_path: Path) -> None:
    """The DRA driver's per-claim MPS daemon (its template runs `sh -c "nvidia-cuda-mps-control -d"` in
    the driver root) fails the same way after a driver upgrade that dropped the binary (incident 5b)."""
    b = healthy(tmp_path)
    make_dra(b)
    write(b, DRA_MPS_LOG, cri("sh: 1: nvidia-cuda-mps-control: not found"))
    f = one(b, "GPU-K8S-007")
    assert f.status is Status.CONFIRMED
    assert any("mps-control-daemon-5d3e1b2a" in str(a) for a in f.affected) or any(
        "mps-control-daemon-5d3e1b2a" in line for line in ev_lines(f))


MPS_ID = f"{CLAIM_UID[:8]}-mps"
MPS_DIR = f"/var/lib/kubelet/plugins/gpu.nvidia.com/mps/{MPS_ID}"


def _dra_mps(b: Path, *, running: bool = False) -> None:
    """The DRA driver's MPS daemon for the claim started (startup.log) and served (pid file, control log);
    the claim's spec mounts its pipe directory into the container at /tmp/nvidia-mps (sharing.go)."""
    spec = claim_spec().replace(
        f"  name: {CLAIM_UID}-gpu-0\n",
        f"    env:\n    - CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps\n    mounts:\n    - containerPath: /tmp/nvidia-mps\n"
        f"      hostPath: {MPS_DIR}/pipe\n      options: [rw, nosuid, nodev, bind]\n  name: {CLAIM_UID}-gpu-0\n")
    make_dra(b, spec=spec)
    write(b, f"{MPS_DIR}/log/startup.log", "startup complete\n")
    write(b, f"{MPS_DIR}/log/control.log", "[2026-11-22 02:12:29.100 Control    57] Accepting connection...\n"
                                           "[2026-11-22 02:12:29.101 Control    57] NEW CLIENT 3400 from user 0: Server is not ready, push client to pending list\n")
    write(b, f"{MPS_DIR}/pipe/nvidia-cuda-mps-control.pid", "57\n")
    edit_meta(b, lambda m: m["listdir"].update({f"{MPS_DIR}/pipe": ["control", "log", "nvidia-cuda-mps-control.pid"],
                                                f"{MPS_DIR}": ["log", "pipe", "shm"]}))
    f = bundle_file(b, "/run/containerd/io.containerd.runtime.v2.task/k8s.io/"
                       "4c2f0b8e9a7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c6b5a4938271605f4e3d/config.json")
    oci = json.loads(f.read_text())
    oci["process"]["env"].append("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps")
    f.write_text(json.dumps(oci))
    if running:
        write(b, "/proc/4242/cmdline", "nvidia-cuda-mps-control\0-d\0")


@pytest.mark.rule("GPU-K8S-011", "positive")
def test_k8s011_the_dra_drivers_mps_daemon_died(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    _dra_mps(b)
    f = one(b, "GPU-K8S-011")
    assert f.status is Status.CONFIRMED and f.data["resource"] == f"gpu.nvidia.com/mps/{MPS_ID}"
    assert f.data["clients"] == ["ml/trainer-0/trainer"]
    assert f"{MPS_DIR}/log/startup.log: present: the daemon started MPS for this resource and never stopped it" in ev_lines(f)


@pytest.mark.rule("GPU-K8S-011", "negative")
def test_k8s011_the_dra_drivers_mps_daemon_runs(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    _dra_mps(b, running=True)
    assert found(b, "GPU-K8S-011") == []
    fresh = healthy(tmp_path / "never")
    _dra_mps(fresh)
    write(fresh, f"{MPS_DIR}/log/startup.log", "")  # the template's daemon never got past `-d`
    assert found(fresh, "GPU-K8S-011") == []
