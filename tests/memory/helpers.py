"""Helpers of the memory tests: real fixture text and small bundles built from it."""

from __future__ import annotations

import json
from pathlib import Path



from gpuwarden.root import BundleRoot

FIX = Path(__file__).parent / "fixtures"
DEVBOX = FIX / "devbox"
H200 = FIX / "h200-uvm"


def text(path: Path) -> str:
    return path.read_text()


def write_bundle(base: Path, files: dict[str, str], meta: dict | None = None) -> BundleRoot:
    """A bundle directory (files/<abs path> + meta.json) holding exactly these files."""
    for p, t in files.items():
        f = base / "files" / p.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(t)
    m = {"format": "gpuwarden.bundle/v1", "captured_at": 1795313475.0, "stat": {}, "readlink": {}, "listdir": {},
         "missing": {}}
    m.update(meta or {})
    base.mkdir(parents=True, exist_ok=True)
    (base / "meta.json").write_text(json.dumps(m))
    return BundleRoot(base)


#: a pod on a cgroup v2 node with the systemd driver, holding the H200 measurement's charges
H200_POD_UID = "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
H200_CID = "a" * 63 + "1"
H200_PID = 4242


def h200_node(base: Path, moment: str = "managed") -> BundleRoot:
    """The H200 measurement replayed as a Kubernetes node: the measured process is a GPU pod's container."""
    uid_ = H200_POD_UID.replace("-", "_")
    pod = f"/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice"
    ctr = f"{pod}/cri-containerd-{H200_CID}.scope"
    stat = text(H200 / f"memory.stat.{moment}")
    cur = text(H200 / f"memory.current.{moment}")
    files = {
        "/proc/meminfo": text(H200 / f"meminfo.{moment}"),
        "/proc/slabinfo": text(H200 / "slabinfo.managed"),
        "/proc/zoneinfo": text(H200 / "zoneinfo.managed"),
        "/proc/vmstat": text(H200 / "vmstat.managed"),
        "/proc/pressure/memory": text(H200 / "pressure_memory.managed"),
        "/proc/pressure/io": text(H200 / "pressure_io.managed"),
        "/proc/pressure/cpu": text(H200 / "pressure_cpu.managed"),
        "/sys/fs/cgroup/cgroup.controllers": "cpuset cpu io memory hugetlb pids rdma misc\n",
        "/sys/fs/cgroup/kubepods.slice/memory.stat": stat,
        "/sys/fs/cgroup/kubepods.slice/memory.current": cur,
        f"{pod}/memory.stat": stat, f"{pod}/memory.current": cur, f"{pod}/memory.max": "34359738368\n",
        f"{ctr}/memory.stat": stat, f"{ctr}/memory.current": cur, f"{ctr}/cgroup.procs": f"{H200_PID}\n",
        f"/proc/{H200_PID}/comm": "python3\n",
        f"/proc/{H200_PID}/cmdline": "python3\0train.py\0",
        f"/proc/{H200_PID}/cgroup": f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice"
                                    f"/cri-containerd-{H200_CID}.scope\n",
    }
    if moment == "managed":  # the v2 root's memory.stat was captured at this moment only
        files["/sys/fs/cgroup/memory.stat"] = text(H200 / "root-memory.stat.managed")
    fds = json.loads(text(H200 / "fds.managed.json"))
    meta = {"readlink": {f"/proc/{H200_PID}/fd/{fd}": t for fd, t in fds.items()},
            "listdir": {"/var/log/pods": [f"ml_uvm-train-0_{H200_POD_UID}"]}}
    return write_bundle(base, files, meta)
