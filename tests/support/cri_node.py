"""Incidents 1, 2 and 3 through real containerd and runc (tests/support/cri.py), read by gpuwarden.

A node tree is the built-in `healthy` example materialized (its /proc, its nvidia-smi capture, its
/dev nodes made with mknod: nvidia0 195:0, nvidiactl 195:255, nvidia-uvm 238:0), with its
synthesized pods, containerd state and device-plugin checkpoint taken out. Real pods then run from
containerd through CRI (`Kubelet`), with those /dev nodes as their devices, in cgroups under a
scratch top `gpuwarden-cri-<pid>` of this host's hierarchies (cgroupfs parents
`/gpuwarden-cri-<pid>/kubepods/pod<uid>`). gpuwarden reads the result as it would on the node: a
child joins the scratch cgroup, enters new cgroup and mount namespaces, mounts the v1 devices
hierarchy (whose root is now the scratch top: `kubepods/pod<uid>/<id>`) and containerd's real state
directory (`/run/containerd`: the task's config.json) into the tree, and runs `gpuwarden check
--root <tree>`; nothing of it outlives the child.

How each form gets its devices, as kubelet passes them (`FORMS`):
- ``devicespecs``: the plugin's DeviceSpecs as CRI Devices (PASS_DEVICE_SPECS=true).
- ``cdi-cri``: CDI device names in CreateContainer's CDI_devices (DEVICE_LIST_STRATEGY=cdi-cri);
  containerd's CRI plugin resolves them against the node's CDI spec (enable_cdi).
- ``cdi-annotations``: the same names in a `cdi.k8s.io/` annotation (cdi-annotations).
- ``hook``: NVIDIA_VISIBLE_DEVICES only; the devices are then allowed behind the runtime's back by
  writing the v1 `devices.allow` of the container's cgroup, which is what libnvidia-container's
  prestart hook does on cgroup v1 (the legacy NVIDIA runtime). The hook itself is not run here.

v1 hosts only (the devices controller at /sys/fs/cgroup/devices); elsewhere `why_not` says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from tests.support import cri
from tests.support.bundles import PLUGIN_PID, REPO, example_root, materialize

GPU_UUID = "GPU-517551a5-9054-f7d5-9cfb-b9575e192f6f"  # the healthy example's H200
NODES = {"nvidia0": (195, 0), "nvidiactl": (195, 255), "nvidia-uvm": (238, 0), "nvidia-uvm-tools": (238, 1)}
GPU_RULES = ("c 195:0 ", "c 195:255 ", "c 238:0 ")
FORMS = ("devicespecs", "cdi-cri", "cdi-annotations", "hook")
CDI_KIND = "nvidia.com/gpu"  # the toolkit's (nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml)
PLUGIN_CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"  # the device plugin's own, written at its start in cdi-*
SPEC_NAMES = {CDI_KIND: "nvidia.yaml", PLUGIN_CDI_KIND: "k8s.device-plugin.nvidia.com-gpu.json"}

_CHECK_CHILD = r"""
import ctypes, json, os, sys
procs, node, state, argv = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
with open(procs, "w") as fh:
    fh.write(str(os.getpid()))
libc = ctypes.CDLL(None, use_errno=True)
def ok(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, what + ": " + os.strerror(e))
ok(libc.unshare(0x00020000 | 0x02000000), "unshare")
ok(libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None), "make-rprivate /")
ok(libc.mount(b"cgroup", (node + "/sys/fs/cgroup/devices").encode(), b"cgroup", 0, b"devices"), "mount devices")
ok(libc.mount(state.encode(), (node + "/run/containerd").encode(), None, 0x1000, None), "bind containerd state")
os.execv(sys.executable, [sys.executable, "-m", "gpuwarden", "check", "--root", node] + argv)
"""


def why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (containerd, runc, cgroups, mknod, mount namespaces)"
    if cri.cgroup_mode() != "v1" or not os.path.isfile(f"{cri.V1_DEVICES}/devices.list"):
        return "not a cgroup v1/hybrid host: runc uses BPF device programs here (the GPU scenario covers v2)"
    return None


class Node:
    """The tree gpuwarden reads, and the CDI spec directory containerd resolves names in."""

    def __init__(self, work: Path, runc_version: str, cpu_policy: str = "static"):
        self.work = work
        self.root = materialize(example_root("healthy"), work / "node")
        for p in list((self.root / "sys/fs/cgroup").iterdir()):
            shutil.rmtree(p / "kubepods", ignore_errors=True)
        shutil.rmtree(self.root / "sys/fs/cgroup/devices", ignore_errors=True)
        (self.root / "sys/fs/cgroup/devices").mkdir()
        shutil.rmtree(self.root / "run/containerd", ignore_errors=True)
        (self.root / "run/containerd").mkdir(parents=True)
        (self.root / "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint").unlink(missing_ok=True)
        self.set_runc(runc_version)
        kubelet = self.root / "var/lib/kubelet"
        cfg = (kubelet / "config.yaml").read_text().replace("cpuManagerPolicy: none", f"cpuManagerPolicy: {cpu_policy}")
        (kubelet / "config.yaml").write_text(cfg)
        (kubelet / "cpu_manager_state").write_text(json.dumps({"policyName": cpu_policy, "defaultCpuSet": "1",
                                                                "checksum": 0}))
        self.cdi_dir = self.root / "var/run/cdi"
        self.cdi_dir.mkdir(parents=True, exist_ok=True)

    def set_runc(self, version_text: str) -> None:
        (self.root / ".gpuwarden/commands/runc-version.txt").write_text(version_text)

    def dev(self, name: str) -> str:
        return str(self.root / "dev" / name)

    def node_entry(self, name: str) -> dict[str, Any]:
        major, minor = NODES[name]
        return {"path": f"/dev/{name}", "hostPath": self.dev(name), "type": "c", "major": major, "minor": minor}

    def write_cdi_spec(self, with_uvm: bool = True, kind: str = CDI_KIND) -> Path:
        """A node CDI spec of `nvidia-ctk cdi generate`'s shape (the plugin's own has the same, from its
        /dev): the GPU's node per device ("0" and its UUID), nvidiactl (and nvidia-uvm, -tools when they
        existed) in the common edits."""
        common = [self.node_entry("nvidiactl")] + ([self.node_entry("nvidia-uvm"), self.node_entry("nvidia-uvm-tools")]
                                                   if with_uvm else [])
        spec = cri.cdi_spec(kind, {"0": [self.node_entry("nvidia0")], GPU_UUID: [self.node_entry("nvidia0")]}, common)
        path = self.cdi_dir / SPEC_NAMES[kind]
        path.write_text(json.dumps(spec, indent=1))  # JSON is YAML: the file name is the writer's
        return path


def write_claim(node: Node, pod_uid: str, with_uvm: bool = False, uvm_major: int | None = None) -> str:
    """A DRA claim prepared for a pod, as the NVIDIA DRA driver and kubelet leave it: the driver's
    transient claim spec (kind k8s.gpu.nvidia.com/claim, device `<claimUID>-gpu-0`) and the kubelet's
    dra_manager_state naming the claim's CDI device for the pod. The CDI device ID, which kubelet
    passes to CreateContainer in CDI_devices. `uvm_major`: the spec's nvidia-uvm major when it is
    stale (written before a driver reload gave the module another one)."""
    claim = str(uuid.uuid4())
    uvm = node.node_entry("nvidia-uvm")
    if uvm_major is not None:
        uvm["major"] = uvm_major
    common = [node.node_entry("nvidiactl")] + ([uvm] if with_uvm else [])
    spec = cri.cdi_spec("k8s.gpu.nvidia.com/claim", {f"{claim}-gpu-0": [node.node_entry("nvidia0")]}, common)
    (node.cdi_dir / f"k8s.gpu.nvidia.com-claim_{claim}.yaml").write_text(json.dumps(spec, indent=1))
    cdi_id = f"k8s.gpu.nvidia.com/claim={claim}-gpu-0"
    state = {"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1", "Entries": [{
        "ClaimUID": claim, "ClaimName": "gpu-claim", "Namespace": "ml", "PodUIDs": {pod_uid: {}},
        "DriverState": {"gpu.nvidia.com": {"Devices": [{"PoolName": "node", "DeviceName": "gpu-0",
                                                         "RequestNames": ["gpu"], "CDIDeviceIDs": [cdi_id]}]}}}]}
    (node.root / "var/lib/kubelet/dra_manager_state").write_text(json.dumps({"Data": json.dumps(state), "Checksum": 0}))
    return cdi_id


def plugin_dev(node: Node, with_uvm: bool) -> None:
    """The device plugin's /dev (/proc/<pid>/root/dev in the tree): a snapshot from its start, which
    holds nvidia-uvm and -tools only if they existed then (incident 1: they did not)."""
    dev = node.root / f"proc/{PLUGIN_PID}/root/dev"
    for name in ("nvidia-uvm", "nvidia-uvm-tools"):
        (dev / name).unlink(missing_ok=True)
        if with_uvm:
            major, minor = NODES[name]
            os.mknod(dev / name, 0o20666, os.makedev(major, minor))


def plugin_allocate(node: Node) -> list[tuple[str, str, str]]:
    """The DeviceSpecs the device plugin's Allocate returns (PASS_DEVICE_SPECS=true): nvidiactl, then
    nvidia-uvm and -tools only if its own /dev has them (k8s-device-plugin apiDeviceSpecs: optional
    paths it stats), then the GPU's node; as (container path, host path, permissions)."""
    dev = node.root / f"proc/{PLUGIN_PID}/root/dev"
    names = ["nvidiactl"] + [n for n in ("nvidia-uvm", "nvidia-uvm-tools") if (dev / n).exists()] + ["nvidia0"]
    return [(f"/dev/{n}", f"/dev/{n}", "rw") for n in names]


def write_checkpoint(node: Node, entries: list[tuple[str, list[tuple[str, str, str]]]]) -> None:
    """kubelet's device-manager checkpoint with each pod's container "worker" and the plugin's Allocate
    response (DeviceSpecs, envs) as kubelet stores it (base64 of the ContainerAllocateResponse)."""
    import base64

    from gpuwarden.grpcapi import deviceplugin_v1beta1_pb2 as dp

    rows = []
    for uid, specs in entries:
        resp = dp.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": GPU_UUID},
                                            devices=[dp.DeviceSpec(container_path=c, host_path=h, permissions=p)
                                                     for c, h, p in specs])
        rows.append({"PodUID": uid, "ContainerName": "worker", "ResourceName": "nvidia.com/gpu",
                     "DeviceIDs": {"-1": [GPU_UUID]}, "AllocResp": base64.b64encode(resp.SerializeToString()).decode()})
    path = node.root / "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    path.write_text(json.dumps({"Data": {"PodDeviceEntries": rows or None,
                                         "RegisteredDevices": {"nvidia.com/gpu": [GPU_UUID]}}, "Checksum": 0}))


def create_allocated(k: cri.Kubelet, node: Node, top: str, name: str, specs: list[tuple[str, str, str]],
                     uid: str | None = None) -> dict[str, Any]:
    """A GPU pod created as kubelet creates it from an Allocate's DeviceSpecs (CRI Devices; their host
    paths are the tree's nodes here), started; its ids and cgroup."""
    sid, uid = k.run_pod(name, namespace="ml", parent_prefix=f"/{top}", uid=uid)
    cid = k.create(sid, "worker", devices=[(c, node.dev(h.removeprefix("/dev/")), p) for c, h, p in specs],
                   envs={"NVIDIA_VISIBLE_DEVICES": GPU_UUID})
    k.start(cid)
    return {"form": "devicespecs", "pod": name, "uid": uid, "sandbox": sid, "id": cid,
            "cgroup": f"{top}/kubepods/pod{uid}/{cid}"}


def create_form(k: cri.Kubelet, node: Node, form: str, top: str, name: str, kind: str = CDI_KIND) -> dict[str, Any]:
    """One GPU pod of a form, started; its ids and cgroup. `kind`: the CDI names' (cdi-* forms)."""
    sid, uid = k.run_pod(name, namespace="ml", parent_prefix=f"/{top}")
    env = {"NVIDIA_VISIBLE_DEVICES": GPU_UUID}
    if form == "devicespecs":
        devs = [(f"/dev/{n}", node.dev(n), "rw") for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0")]
        cid = k.create(sid, "worker", devices=devs, envs=env)
    elif form == "cdi-cri":
        cid = k.create(sid, "worker", cdi=[f"{kind}={GPU_UUID}"], envs={"NVIDIA_VISIBLE_DEVICES": "void"})
    elif form == "cdi-annotations":
        cid = k.create(sid, "worker", annotations={f"cdi.k8s.io/nvidia-device-plugin_{uid}": f"{kind}={GPU_UUID}"},
                       envs={"NVIDIA_VISIBLE_DEVICES": "void"})
    elif form == "hook":
        cid = k.create(sid, "worker", envs=env)
    else:
        raise ValueError(form)
    k.start(cid)
    cgroup = f"{top}/kubepods/pod{uid}/{cid}"
    if form == "hook":
        for rule in ("c 195:255 rw", "c 195:0 rw", "c 238:0 rw", "c 238:1 rw"):
            Path(cri.V1_DEVICES, cgroup, "devices.allow").write_text(rule)
    return {"form": form, "pod": name, "uid": uid, "sandbox": sid, "id": cid, "cgroup": cgroup}


def gpu_rules(cgroup: str) -> list[str]:
    lines = cri.v1_devices_list(cgroup) or []
    return [line for line in lines if line.startswith(GPU_RULES) or line.startswith("a ")]


def check(node: Node, state_dir: Path, top: str, *flags: str, select: str = "GPU-DEV") -> dict:
    """`gpuwarden check --root <tree>` with this host's devices hierarchy (from the scratch top) and
    containerd's state mounted into the tree, in a child's own namespaces."""
    procs = Path(cri.V1_DEVICES, top, "cgroup.procs")
    argv = ["--select", select, "--format", "json", "--fail-on", "critical", "--no-probes", *flags]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", _CHECK_CHILD, str(procs), str(node.root), str(state_dir), json.dumps(argv)],
                         capture_output=True, text=True, timeout=180, env=env)
    if out.returncode not in (0, 1):
        raise RuntimeError(f"gpuwarden check exited {out.returncode}: {out.stderr[-3000:]}")
    return json.loads(out.stdout)


def findings(report: dict, code: str) -> list[dict]:
    return [f for f in report.get("findings", []) if f.get("code") == code]
