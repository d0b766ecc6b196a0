"""Lays out, on a real host, what a kubelet (systemd cgroup driver) + containerd node holds for a pod.

The GPU machine has no kubelet or container runtime, so the scenarios build exactly the files those
would leave: the pod's and container's cgroups under kubepods.slice (memory controller enabled, the
pod's memory.max), containerd's task state (config.json with the CRI annotations kubelet sets), the
device manager's checkpoint, kubelet's config and /var/log/pods. A process placed in the container's
cgroup is, to every reader, that pod's container. Everything is removed by `Pod.remove()`.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

CG = Path("/sys/fs/cgroup")
TASKS = Path("/run/containerd/io.containerd.runtime.v2.task/k8s.io")
KUBELET = Path("/var/lib/kubelet")


def _enable_memory(d: Path) -> None:
    try:
        (d / "cgroup.subtree_control").write_text("+memory")
    except OSError:
        pass


@dataclass
class Pod:
    namespace: str
    name: str
    container: str
    limit: int | None  # bytes, memory.max of the pod and its container
    qos: str = "burstable"
    gpu: str = ""  # GPU UUID allocated to it in the device-manager checkpoint
    env: dict[str, str] = field(default_factory=dict)  # more process env in its spec (an Allocate's Envs)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    cid: str = field(default_factory=lambda: uuid.uuid4().hex + uuid.uuid4().hex)
    prog_fd: int | None = None
    #: the device nodes its container gets (path, major, minor); None: the host's (a device plugin's DeviceSpecs),
    #: else e.g. a DRA claim's CDI spec's deviceNodes
    nodes: list[tuple[str, int, int]] | None = None

    @property
    def pod_dir(self) -> Path:
        u = self.uid.replace("-", "_")
        return CG / "kubepods.slice" / f"kubepods-{self.qos}.slice" / f"kubepods-{self.qos}-pod{u}.slice"

    @property
    def ctr_dir(self) -> Path:
        return self.pod_dir / f"cri-containerd-{self.cid}.scope"

    @property
    def procs(self) -> str:
        return str(self.ctr_dir / "cgroup.procs")

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def create(self) -> "Pod":
        levels = [CG, CG / "kubepods.slice", CG / "kubepods.slice" / f"kubepods-{self.qos}.slice", self.pod_dir]
        for d in levels[1:] + [self.ctr_dir]:
            d.mkdir(exist_ok=True)
        for d in levels:
            _enable_memory(d)
        if self.limit:
            for d in (self.pod_dir, self.ctr_dir):
                (d / "memory.max").write_text(str(self.limit))
        t = TASKS / self.cid
        t.mkdir(parents=True, exist_ok=True)
        ann = {"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.container-name": self.container,
               "io.kubernetes.cri.sandbox-name": self.name, "io.kubernetes.cri.sandbox-namespace": self.namespace,
               "io.kubernetes.cri.sandbox-uid": self.uid}
        nodes = gpu_nodes() if self.nodes is None else self.nodes
        spec = {"ociVersion": "1.2.0", "annotations": ann,
                "process": {"env": (["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"] if self.gpu else [])
                                   + [f"{k}={v}" for k, v in self.env.items()]},
                "linux": {"devices": [{"path": p, "type": "c", "major": ma, "minor": mi} for p, ma, mi in nodes],
                          "resources": {"memory": {"limit": self.limit} if self.limit else {},
                                        "devices": [{"allow": False, "access": "rwm"}] + [
                                            {"allow": True, "type": "c", "major": ma, "minor": mi, "access": "rwm"}
                                            for _, ma, mi in nodes]},
                          "cgroupsPath": f"kubepods-{self.qos}-pod{self.uid.replace('-', '_')}.slice:cri-containerd:{self.cid}"}}
        (t / "config.json").write_text(json.dumps(spec))
        logs = Path("/var/log/pods") / f"{self.namespace}_{self.name}_{self.uid}" / self.container
        logs.mkdir(parents=True, exist_ok=True)
        self._device_program([f"c {ma}:{mi} rwm" for _, ma, mi in nodes])
        return self

    def _device_program(self, gpu_rules: list[str]) -> None:
        """A runc-shaped cgroup v2 device program that allows the GPU nodes the spec lists, as runc attaches."""
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tests.support import devprog

        default = ["c 1:5 rwm", "c 1:3 rwm", "c 1:9 rwm", "c 1:8 rwm", "c 5:0 rwm", "c 5:1 rwm", "c *:* m",
                   "b *:* m", "c 1:7 rwm", "c 136:* rwm", "c 5:2 rwm", "c 10:200 rwm"]
        prog = devprog.runc_program(devprog.rules(*(default + gpu_rules)))
        self.prog_fd = devprog.load_program(prog, name="gw_pod")
        devprog.attach(str(self.ctr_dir), self.prog_fd, multi=True)

    def enter(self) -> None:
        """preexec_fn: put the calling (child) process into the container's cgroup."""
        with open(self.procs, "w") as f:
            f.write(str(os.getpid()))

    def remove(self) -> None:
        if self.prog_fd is not None:
            os.close(self.prog_fd)
            self.prog_fd = None
        for d in (self.ctr_dir, self.pod_dir):
            try:
                d.rmdir()
            except OSError:
                pass
        shutil.rmtree(TASKS / self.cid, ignore_errors=True)
        shutil.rmtree(Path("/var/log/pods") / f"{self.namespace}_{self.name}_{self.uid}", ignore_errors=True)


def gpu_nodes() -> list[tuple[str, int, int]]:
    """The NVIDIA device nodes present on this host: (path, major, minor), what a plugin's DeviceSpecs list."""
    out = []
    for name in ("nvidiactl", "nvidia0", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"):
        p = Path("/dev") / name
        try:
            st = p.stat()
        except OSError:
            continue
        out.append((str(p), os.major(st.st_rdev), os.minor(st.st_rdev)))
    return out


def kubelet_state(pods: list[Pod]) -> None:
    """kubelet's config (systemd driver) and the device manager's checkpoint for these pods."""
    (KUBELET / "device-plugins").mkdir(parents=True, exist_ok=True)
    (KUBELET / "config.yaml").write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n"
        "cpuManagerPolicy: none\nevictionHard:\n  memory.available: 100Mi\n")
    entries = [{"PodUID": p.uid, "ContainerName": p.container, "ResourceName": "nvidia.com/gpu",
                "DeviceIDs": {"-1": [p.gpu]}} for p in pods if p.gpu]
    gpus = sorted({p.gpu for p in pods if p.gpu})
    (KUBELET / "device-plugins/kubelet_internal_checkpoint").write_text(
        json.dumps({"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {"nvidia.com/gpu": gpus}},
                    "Checksum": 0}))


def clear_kubelet_state() -> None:
    for d in (KUBELET, Path("/var/log/pods"), Path("/var/log/containers")):
        shutil.rmtree(d, ignore_errors=True)
    for d in (CG / "kubepods.slice" / "kubepods-burstable.slice", CG / "kubepods.slice" / "kubepods-besteffort.slice",
              CG / "kubepods.slice"):
        try:
            d.rmdir()
        except OSError:
            pass
