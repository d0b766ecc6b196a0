"""GPU-DEV-001 in the device plugin's CDI modes (incident 1 with a node CDI spec generated before
nvidia-uvm existed): the spec is named as the cause and regenerating it is the fix.

The same cause, measured through real containerd and runc, is in tests/interop/test_cri_runtime.py.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from gpuwarden.findings import Status
from gpuwarden.grpcapi import deviceplugin_v1beta1_pb2 as dp
from tests.support.bundles import (
    CHECKPOINT,
    GPU_SPEC,
    GPU_UUID,
    PLUGIN_PID,
    copy_example,
    ev_lines,
    findings,
    open_dir,
    write,
)

SPEC = "/var/run/cdi/nvidia.yaml"
PLUGIN_SPEC = "/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json"


def _node(kind: str = "nvidia.com/gpu", uvm: bool = False) -> dict:
    common = [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}]
    if uvm:
        common.append({"path": "/dev/nvidia-uvm", "type": "c", "major": 238, "minor": 0})
    return {"cdiVersion": "0.6.0", "kind": kind, "containerEdits": {"deviceNodes": common, "env": ["NVIDIA_VISIBLE_DEVICES=void"]},
            "devices": [{"name": n, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "type": "c", "major": 195,
                                                                          "minor": 0}]}} for n in ("0", GPU_UUID)]}


def _checkpoint(b: Path, resp: dp.ContainerAllocateResponse) -> None:
    path = b / "files" / CHECKPOINT.lstrip("/")
    data = json.loads(path.read_text())
    data["Data"]["PodDeviceEntries"][0]["AllocResp"] = base64.b64encode(resp.SerializeToString()).decode()
    write(b, CHECKPOINT, json.dumps(data))


def _cdi_node(tmp_path: Path, strategy: str = "cdi-cri", uvm_in_spec: bool = False) -> Path:
    """uvm-missing in CDI mode: the plugin passes CDI names, the node spec lacks nvidia-uvm."""
    b = copy_example("uvm-missing", tmp_path)
    write(b, SPEC, json.dumps(_node(uvm=uvm_in_spec)))
    write(b, f"/proc/{PLUGIN_PID}/environ", f"DEVICE_LIST_STRATEGY={strategy}\0FAIL_ON_INIT_ERROR=true\0")
    name = f"nvidia.com/gpu={GPU_UUID}"
    if strategy == "cdi-cri":
        _checkpoint(b, dp.ContainerAllocateResponse(cdi_devices=[dp.CDIDevice(name=name)]))
    else:
        _checkpoint(b, dp.ContainerAllocateResponse(annotations={"cdi.k8s.io/nvidia-device-plugin_x": name}))
    return b


def dev001(b: Path) -> list:
    return [f for f in findings(open_dir(b)) if f.code == "GPU-DEV-001"]


@pytest.mark.rule("GPU-DEV-001", "positive")
@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations"])
def test_cdi_mode_names_the_node_spec_from_the_checkpoint(tmp_path: Path, strategy: str) -> None:
    (f,) = dev001(_cdi_node(tmp_path, strategy))
    assert f.status is Status.CONFIRMED
    assert f.data["cause"] == "stale-cdi-spec" and f.data["stale_plugin"] is False
    assert f.mechanism == "node CDI spec generated before nvidia-uvm existed"
    assert f"the node CDI spec {SPEC} has no /dev/nvidia-uvm" in f.summary
    ev = ev_lines(f)
    assert (f"{GPU_SPEC}: trainer-0/trainer: the plugin's Allocate named CDI device nvidia.com/gpu={GPU_UUID} "
            "(kubelet checkpoint)") in ev
    assert f"{SPEC}: nvidia.com/gpu={GPU_UUID} gives /dev/nvidia0, /dev/nvidiactl: no /dev/nvidia-uvm" in ev
    assert f"/proc/{PLUGIN_PID}/environ: device plugin DEVICE_LIST_STRATEGY={strategy}" in ev
    assert "nvidia-ctk cdi generate" in f.remedy and "Restart the device-plugin" not in f.remedy
    # the plugin's own /dev (stale in this example) is not offered as the cause, nor an Allocate that
    # "returned devices" (it returned CDI names only)
    assert not any("has no nvidia-uvm in its /dev" in e for e in ev)
    assert not any("plugin's Allocate returned devices" in e for e in ev)


@pytest.mark.rule("GPU-DEV-001", "positive")
def test_cdi_mode_without_a_checkpoint_matches_the_spec_devices(tmp_path: Path) -> None:
    """containerd keeps no CDI name in config.json: the container's devices equal one device's edits."""
    b = _cdi_node(tmp_path)
    (b / "files" / CHECKPOINT.lstrip("/")).unlink()
    (f,) = dev001(b)
    assert f.data["cause"] == "stale-cdi-spec"
    assert (f"{GPU_SPEC}: trainer-0/trainer: its /dev/nvidia* spec devices (/dev/nvidia0, /dev/nvidiactl) are "
            "exactly what nvidia.com/gpu=0 gives") in ev_lines(f)


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_a_spec_that_lists_uvm_is_not_named(tmp_path: Path) -> None:
    """The spec was regenerated since the pod started: the spec is not the cause (any more)."""
    (f,) = dev001(_cdi_node(tmp_path, uvm_in_spec=True))
    assert f.data["cause"] not in ("stale-cdi-spec", "allocate-omitted")  # it returned CDI names, omitted no node
    assert "nvidia-ctk cdi generate" not in (f.remedy or "")


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_devicespecs_mode_keeps_the_stale_plugin_cause_beside_a_spec_without_uvm(tmp_path: Path) -> None:
    b = copy_example("uvm-missing", tmp_path)
    write(b, SPEC, json.dumps(_node(uvm=False)))
    (f,) = dev001(b)
    assert f.data["cause"] == "stale-plugin" and f.data["stale_plugin"] is True


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_spec_devices_match_alone_is_not_enough_without_a_cdi_strategy(tmp_path: Path) -> None:
    b = _cdi_node(tmp_path)
    (b / "files" / CHECKPOINT.lstrip("/")).unlink()
    write(b, f"/proc/{PLUGIN_PID}/environ", "PASS_DEVICE_SPECS=true\0DEVICE_LIST_STRATEGY=envvar\0")
    (f,) = dev001(b)
    assert f.data["cause"] != "stale-cdi-spec"


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_a_healthy_container_in_cdi_mode_gives_no_finding(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    write(b, SPEC, json.dumps(_node(uvm=True)))
    write(b, f"/proc/{PLUGIN_PID}/environ", "DEVICE_LIST_STRATEGY=cdi-cri\0")
    assert dev001(b) == []


@pytest.mark.rule("GPU-DEV-001", "positive")
@pytest.mark.parametrize("kind", ["nvidia.com/gpu", "k8s.device-plugin.nvidia.com/gpu"])
def test_at_risk_when_the_plugin_passes_cdi_names_and_the_node_spec_lacks_uvm(tmp_path: Path, kind: str) -> None:
    """No pod affected yet: the next one will be (the toolkit's spec: regenerate; the plugin's own: restart it)."""
    b = copy_example("healthy", tmp_path)
    spec = PLUGIN_SPEC if kind.startswith("k8s.device-plugin") else SPEC
    write(b, spec, json.dumps(_node(kind=kind, uvm=False)))
    write(b, f"/proc/{PLUGIN_PID}/environ", "DEVICE_LIST_STRATEGY=cdi-cri\0")
    (f,) = dev001(b)
    own = spec == PLUGIN_SPEC
    assert f.status is Status.AT_RISK
    assert f.data["cause"] == ("stale-plugin-cdi-spec" if own else "stale-cdi-spec") and f.data["stale_plugin"] is own
    assert f.summary.startswith(f"The node CDI spec {spec} gives no device /dev/nvidia-uvm")
    assert f"{spec}: {kind}: 2 device(s), none given /dev/nvidia-uvm" in ev_lines(f)
    assert ("Restart the device-plugin pod" in f.remedy) is own and ("nvidia-ctk cdi generate" in f.remedy) is not own


@pytest.mark.rule("GPU-DEV-001", "positive")
def test_the_plugins_own_cdi_spec_without_uvm_is_fixed_by_restarting_the_plugin(tmp_path: Path) -> None:
    """k8s-device-plugin in cdi-cri writes /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json when it starts,
    from its /dev, and passes its own names: a plugin that started before nvidia-uvm existed."""
    b = copy_example("uvm-missing", tmp_path)
    write(b, PLUGIN_SPEC, json.dumps(_node(kind="k8s.device-plugin.nvidia.com/gpu", uvm=False)))
    write(b, f"/proc/{PLUGIN_PID}/environ", "DEVICE_LIST_STRATEGY=cdi-cri\0")
    _checkpoint(b, dp.ContainerAllocateResponse(cdi_devices=[dp.CDIDevice(name=f"k8s.device-plugin.nvidia.com/gpu={GPU_UUID}")]))
    (f,) = dev001(b)
    assert f.status is Status.CONFIRMED
    assert f.data["cause"] == "stale-plugin-cdi-spec" and f.data["stale_plugin"] is True  # remediation restarts it
    assert f"the device plugin's own CDI spec {PLUGIN_SPEC} (written when it started" in f.summary
    assert "Restart the device-plugin pod" in f.remedy and "nvidia-ctk" not in f.remedy


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_no_cdi_risk_when_the_plugin_passes_device_specs(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    write(b, SPEC, json.dumps(_node(uvm=False)))  # a spec nobody uses for this plugin's pods
    assert dev001(b) == []


@pytest.mark.rule("GPU-DEV-001", "negative")
def test_no_cdi_risk_when_the_spec_lists_uvm_or_is_a_claims(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    write(b, SPEC, json.dumps(_node(uvm=True)))
    write(b, "/var/run/cdi/k8s.gpu.nvidia.com-claim_a9630d8a-a387-46b3-9a58-596caeec4da1.yaml",
          json.dumps(_node(kind="k8s.gpu.nvidia.com/claim", uvm=False)))
    write(b, f"/proc/{PLUGIN_PID}/environ", "DEVICE_LIST_STRATEGY=cdi-annotations\0")
    assert dev001(b) == []
