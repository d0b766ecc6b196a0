#!/usr/bin/env python3
"""Build the DRA example nodes: the device-access examples turned into nodes that allocate their GPU
through the NVIDIA DRA driver and inject it through a per-claim CDI spec.

The DRA files are the real gpu-kubelet-plugin's captures from the GPU machine
(tests/fixtures/dra/gpu-h200x2/, see its ORIGIN.md), copied byte for byte except the few identities the base
example's pod, container and GPU must share with them; each example's ORIGIN.md says what was rewritten.

    python tools/build_dra_examples.py    # rewrites src/gpuwarden/examples/dra-uvm-missing
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from build_examples import CID_GPU, GPU_UUID, POD_UID, Example, oci_spec  # noqa: E402
from tests.support.dranode import DRA_SOCK, DRIVER_CP, REG_SOCK, STATE  # noqa: E402
from tests.support.dranode import EXAMPLE_CLAIM_UID as CLAIM_UID  # noqa: E402
from tests.support.dranode import EXAMPLE_SPEC_PATH as SPEC_PATH  # noqa: E402

CAPTURE = REPO / "tests/fixtures/dra/gpu-h200x2/uvm-missing"
CAPTURED = "tests/fixtures/dra/gpu-h200x2/uvm-missing/"
# The captured claim ml/gpu-no-uvm and what of it the base example's node must share.
NAMESPACE = "ml"
POD = ("e7df3316-8dc1-4e5c-bb4c-3f4aaee2f68b", "dra-no-uvm")  # captured pod uid, name -> the base's ml/trainer-0
GPU = ("GPU-587fd7a0-8b31-22f0-2021-0f2036cbdadd", "gpu-1")  # captured GPU uuid, device -> the base's one GPU
HEALTHY_CLAIM = "66bed046-237e-43e0-b811-749785976024"  # the other claim of the capture, not on this node


def _rewrite(text: str) -> str:
    """The captured pod and GPU made the base example's (ml/trainer-0, its GPU at minor 0)."""
    return (text.replace(POD[0], POD_UID).replace(f'"{POD[1]}"', '"trainer-0"')
            .replace(GPU[0], GPU_UUID).replace(f"{CLAIM_UID}-{GPU[1]}", f"{CLAIM_UID}-gpu-0")
            .replace(f'"{GPU[1]}"', '"gpu-0"').replace(f'\\"{GPU[1]}\\"', '\\"gpu-0\\"'))


def _checkpoint() -> str:
    """The driver's checkpoint without the capture's other claim (ml/gpu-healthy, whose pod is not on this node)."""
    doc = json.loads((CAPTURE / "checkpoint.json").read_text())
    for part in (doc["v1"], doc["v2"]):
        del part["preparedClaims"][HEALTHY_CLAIM]
    return _rewrite(json.dumps(doc, separators=(",", ":")))


def _claim_spec() -> str:
    text = (CAPTURE / f"var_run_cdi__k8s.gpu.nvidia.com-claim_{CLAIM_UID}.yaml").read_text()
    node = "            - path: /dev/nvidia1\n              major: 195\n              minor: 1\n"
    assert node in text, "the captured spec's GPU node"
    return _rewrite(text.replace(node, node.replace("nvidia1", "nvidia0").replace("minor: 1", "minor: 0")))


def _socket(path: str, t: float) -> dict:
    return {"path": path, "kind": "other", "major": None, "minor": None, "mode": 0o140755, "ctime": t, "mtime": t,
            "size": 0}


def build_dra_uvm_missing() -> Example:
    ex = Example("dra-uvm-missing", "The DRA form of incident 1: the NVIDIA DRA driver prepared the pod's claim "
                 "while /dev/nvidia-uvm did not exist yet, so the claim's CDI spec lacks it and the container's device "
                 "cgroup (made from the spec) denies it; CUDA fails while nvidia-smi works.", "uvm-missing")
    rewritten = (f"pod uid {POD[0]} -> {POD_UID} and pod name {POD[1]} -> trainer-0 (the base's ml/trainer-0), "
                 f"GPU {GPU[0]} -> {GPU_UUID} and device {GPU[1]} -> gpu-0 (the base's one GPU, /dev/nvidia0)")
    ex.origin.append("The DRA files come from the real gpu-kubelet-plugin on the GPU machine (2x H200, driver 580.159.04, "
                     "2026-11-26; tests/fixtures/dra/ORIGIN.md), copied byte for byte except what each line below says "
                     "was rewritten so that the claim's pod and GPU are the base example's.\n")
    ex.file(STATE, _rewrite((CAPTURE / "dra_manager_state").read_text()),
            f"the kubelet DRA stand-in's claim state, `{CAPTURED}dra_manager_state` with {rewritten}; "
            "everything else (claim ml/gpu-no-uvm, its uid, pool gw-gpu-node) as captured")
    ex.file(DRIVER_CP, _checkpoint(),
            f"the real plugin's checkpoint, `{CAPTURED}checkpoint.json` without its other claim (ml/gpu-healthy, "
            f"uid {HEALTHY_CLAIM}, whose pod is not on this node) and with {rewritten}; re-serialized compactly as the "
            "plugin writes it, so its checksums are the capture's and no longer match (gpuwarden does not verify them)")
    ex.file(SPEC_PATH, _claim_spec(),
            f"the real plugin's claim spec written without /dev/nvidia-uvm (deviceNodes /dev/nvidiactl and the GPU only), "
            f"`{CAPTURED}var_run_cdi__k8s.gpu.nvidia.com-claim_{CLAIM_UID}.yaml` with the CDI device "
            f"`{CLAIM_UID}-{GPU[1]}` -> `{CLAIM_UID}-gpu-0` and its node /dev/nvidia1 (195:1) -> /dev/nvidia0 (195:0); "
            "its mounts still name the capture's driver root (/tmp/gw-dra/driver-root)")
    ex.file(f"/run/containerd/io.containerd.runtime.v2.task/k8s.io/{CID_GPU}/config.json",
            oci_spec("trainer", "trainer-0", NAMESPACE, POD_UID, "container",
                     [("/dev/nvidiactl", 195, 255), ("/dev/nvidia0", 195, 0)],
                     {"NVIDIA_VISIBLE_DEVICES": "void", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}),
            "the container's runtime spec: the claim spec's device nodes (no uvm) and NVIDIA_VISIBLE_DEVICES=void "
            "as nvcdi's common edits set it; the devices.list is uvm-missing's (incident 1's, no uvm line)")
    ex.file("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint",
            json.dumps({"Data": {"PodDeviceEntries": [], "RegisteredDevices": {}}, "Checksum": 0}),
            "no device-plugin allocation: the GPU came through DRA")
    ex.file("/proc/2301/cmdline", "gpu-kubelet-plugin\0--cdi-root=/var/run/cdi\0",
            "uvm-missing's plugin process (its /dev without nvidia-uvm) is the DRA kubelet plugin here")
    ex.meta["stat"][REG_SOCK] = _socket(REG_SOCK, 1795313556.0)  # sockets.txt of the capture
    ex.meta["stat"][DRA_SOCK] = _socket(DRA_SOCK, 1795313556.0)
    ex.meta["listdir"]["/var/lib/kubelet/plugins_registry"] = ["gpu.nvidia.com-reg.sock"]
    ex.meta["listdir"]["/var/lib/kubelet/device-plugins"] = ["DEPRECATION", "kubelet.sock", "kubelet_internal_checkpoint"]
    plugin_pod = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"  # the device plugin's pod of the base examples
    ex.meta["remove"] = ["/proc/2301/environ", "/var/lib/kubelet/device-plugins/nvidia-gpu.sock",
                         f"/var/log/pods/kube-system_nvidia-device-plugin-x7k2p_{plugin_pod}"]
    ex.origin.append("- the DRA sockets (`plugins_registry/gpu.nvidia.com-reg.sock`, `plugins/gpu.nvidia.com/dra.sock`) "
                     "are recorded as sockets in meta.json; the device plugin's socket and pod log are removed")
    return ex


def main() -> None:
    for ex in (build_dra_uvm_missing(),):
        ex.write()
        origin = ex.dir / "ORIGIN.md"
        origin.write_text(origin.read_text().replace("Generated by `tools/build_examples.py`.",
                                                     "Generated by `tools/build_dra_examples.py`."))
        print("wrote", ex.dir.relative_to(REPO))


if __name__ == "__main__":
    main()
