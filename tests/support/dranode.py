"""A DRA node built on the example nodes: the kubelet's claim state, the NVIDIA DRA driver's
checkpoint and registration socket, and the claim's CDI spec, in the formats of their upstream
writers, for tests that need a claim of their own (the dra-uvm-missing example is built from the real
plugin's captures instead; tools/build_dra_examples.py); each format's source below.

- `dra_manager_state`: kubernetes pkg/kubelet/cm/dra/state (checkpointer_test.go shows the file:
  `{"Data": "<JSON of kind DRACheckpoint>", "Checksum": N}`).
- `plugins/gpu.nvidia.com/checkpoint.json`: kubernetes-sigs/dra-driver-nvidia-gpu
  cmd/gpu-kubelet-plugin/checkpointv.go and prepared.go (V2 with its V1 copy).
- the claim's spec `k8s.gpu.nvidia.com-claim_<uid>.yaml`: cmd/gpu-kubelet-plugin/cdi.go
  (CreateClaimSpecFile: the toolkit's nvcdi common edits + one device `<uid>-gpu-0`, kind
  `k8s.gpu.nvidia.com/claim`, written under --cdi-root, /var/run/cdi in the Helm chart).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.bundles import CHECKPOINT, GPU_SPEC, GPU_UUID, POD_UID, bundle_file, edit_meta, write

CLAIM_UID = "5d3e1b2a-8c7f-4e6d-9a0b-1c2d3e4f5a6b"
CLAIM_NAME = "trainer-0-gpu-7xk2q"
NAMESPACE = "ml"
DRIVER = "gpu.nvidia.com"
CDI_ID = f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-0"
SPEC_PATH = f"/var/run/cdi/k8s.gpu.nvidia.com-claim_{CLAIM_UID}.yaml"
STATE = "/var/lib/kubelet/dra_manager_state"
DRIVER_CP = "/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json"
REG_SOCK = "/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock"
DRA_SOCK = "/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock"
# the dra-uvm-missing example's claim: the real plugin's ml/gpu-no-uvm (tests/fixtures/dra/gpu-h200x2/uvm-missing)
EXAMPLE_CLAIM_UID = "a9630d8a-a387-46b3-9a58-596caeec4da1"
EXAMPLE_SPEC_PATH = f"/var/run/cdi/k8s.gpu.nvidia.com-claim_{EXAMPLE_CLAIM_UID}.yaml"
VERSION = "580.159.04"
LIBDIR = "/usr/lib/x86_64-linux-gnu"


def kubelet_state(claims: list[tuple[str, str, str, list[str], str, list[str]]]) -> str:
    """(uid, name, namespace, pod uids, device, cdi ids) per claim, as the kubelet writes it."""
    entries = [{"ClaimUID": uid, "ClaimName": name, "Namespace": ns, "PodUIDs": {p: {} for p in pods},
                "DriverState": {DRIVER: {"Devices": [{"PoolName": "gpu-node-1", "DeviceName": dev,
                                                      "RequestNames": ["gpu"], "CDIDeviceIDs": ids}]}}}
               for uid, name, ns, pods, dev, ids in claims]
    data = json.dumps({"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1", "Entries": entries},
                      separators=(",", ":"))
    return json.dumps({"Data": data, "Checksum": 1597924435}, separators=(",", ":"))


def driver_checkpoint(claims: list[tuple[str, str, str, str, str]], state: str = "PrepareCompleted") -> str:
    """(uid, name, namespace, device, gpu uuid) per claim, as gpu-kubelet-plugin writes it."""
    prepared = {}
    for uid, name, ns, dev, uuid in claims:
        device = {"Requests": ["gpu"], "PoolName": "gpu-node-1", "DeviceName": dev,
                  "CDIDeviceIDs": [f"k8s.gpu.nvidia.com/claim={uid}-{dev}"]}
        prepared[uid] = {"checkpointState": state, "status": {},
                         "preparedDevices": [{"devices": [{"gpu": {"info": {"uuid": uuid}, "device": device}, "mig": None}],
                                              "configState": {}}],
                         "name": name, "namespace": ns}
    v1 = {"preparedClaims": {u: {"status": {}, "preparedDevices": c["preparedDevices"]} for u, c in prepared.items()}}
    return json.dumps({"checksum": 2462215416, "v1": v1,
                       "v2": {"checksum": 1211421384, "preparedClaims": prepared,
                              "nodeBootID": "3f7f2a58-9e0e-4b8a-a1f6-2d33c5e0b6f1"}})


def claim_spec(uid: str = CLAIM_UID, *, uvm: bool = True, ctl: bool = True, gpu: str | None = "/dev/nvidia0",
               version: str = VERSION, caps_major: int | None = None) -> str:
    """The claim's CDI spec in nvcdi's YAML shape (common edits, then the claim's one device)."""
    common = (["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] if uvm else []) + (
        ["/dev/nvidiactl"] if ctl else [])
    nodes = "".join(f"  - path: {p}\n    hostPath: {p}\n" for p in common)
    dev_nodes = f"    - path: {gpu}\n      hostPath: {gpu}\n" if gpu else ""
    if caps_major is not None:
        dev_nodes += (f"    - path: /dev/nvidia-caps/nvidia-cap21\n      hostPath: /dev/nvidia-caps/nvidia-cap21\n"
                      f"      type: c\n      major: {caps_major}\n      minor: 21\n")
    libs = "".join(f"  - containerPath: {LIBDIR}/{lib}.so.{version}\n    hostPath: {LIBDIR}/{lib}.so.{version}\n"
                   "    options:\n    - ro\n    - nosuid\n    - nodev\n    - rbind\n    - rprivate\n"
                   for lib in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"))
    return (f"---\ncdiVersion: 0.5.0\ncontainerEdits:\n  env:\n  - NVIDIA_VISIBLE_DEVICES=void\n  deviceNodes:\n{nodes}"
            "  hooks:\n  - hookName: createContainer\n    path: /usr/bin/nvidia-cdi-hook\n"
            "    args:\n    - nvidia-cdi-hook\n    - update-ldcache\n    - --folder\n    - /usr/lib/x86_64-linux-gnu\n"
            f"  mounts:\n{libs}devices:\n- containerEdits:\n    deviceNodes:\n{dev_nodes}  name: {uid}-gpu-0\n"
            "kind: k8s.gpu.nvidia.com/claim\n")


def make_dra(b: Path, *, spec: str | None = None, containers_devices: list[str] | None = None,
             device_plugin: bool = False) -> None:
    """Turn an example node into a DRA node whose GPU pod got its GPU through claim CLAIM_UID.

    The device plugin's allocation of the pod is dropped from the kubelet's device checkpoint (it came
    through DRA), unless `device_plugin`; the pod's runtime spec lists the claim spec's device nodes
    `containers_devices` (default: those of `spec`) and carries NVIDIA_VISIBLE_DEVICES=void, as nvcdi sets it.
    """
    spec = spec if spec is not None else claim_spec()
    write(b, SPEC_PATH, spec)
    write(b, STATE, kubelet_state([(CLAIM_UID, CLAIM_NAME, NAMESPACE, [POD_UID], "gpu-0", [CDI_ID])]))
    write(b, DRIVER_CP, driver_checkpoint([(CLAIM_UID, CLAIM_NAME, NAMESPACE, "gpu-0", GPU_UUID)]))

    def sockets(m: dict) -> None:
        for p in (REG_SOCK, DRA_SOCK):
            m["stat"][p] = {"path": p, "kind": "other", "major": None, "minor": None, "mode": 0o140755,
                            "ctime": 1795313540.0, "mtime": 1795313540.0, "size": 0}
        m.setdefault("listdir", {})["/var/lib/kubelet/plugins_registry"] = ["gpu.nvidia.com-reg.sock"]
    edit_meta(b, sockets)
    if not device_plugin:
        cp = bundle_file(b, CHECKPOINT)
        doc = json.loads(cp.read_text())
        doc["Data"]["PodDeviceEntries"] = [e for e in doc["Data"]["PodDeviceEntries"] if e.get("PodUID") != POD_UID]
        cp.write_text(json.dumps(doc))
    f = bundle_file(b, GPU_SPEC)
    oci = json.loads(f.read_text())
    if containers_devices is not None:
        want = containers_devices
        oci["linux"]["devices"] = [d for d in oci["linux"]["devices"] if d["path"] in want]
    oci["process"]["env"] = [e for e in oci["process"]["env"] if not e.startswith("NVIDIA_VISIBLE_DEVICES=")] + [
        "NVIDIA_VISIBLE_DEVICES=void"]
    f.write_text(json.dumps(oci))
