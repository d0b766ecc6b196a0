"""The one builder of test nodes: bundle directories, live trees, and the facts and reports of them.

A test node is built one of three ways, all here:
- `bundle(dest, files)`: a bundle directory (files/<abs path> + meta.json) holding exactly these
  files, by default the log incident's node (captured three minutes after its last kubelet line,
  clock in Asia/Shanghai);
- `copy_example(name, dest)` then `write`/`bundle_file`/`edit_meta`: a built-in example changed
  in place (`open_dir` reads it), or an overlay of one (`bundle(..., captured_at=None)` + BundleRoot(lower=));
- `live(dest, files)` or `materialize(root, dest)`: a real tree read through a HostRoot.

`facts_of` and `report_of` run the pipeline on any of them. Everything starts from real text: the
built-in examples (whose /proc, driver and /dev come from a real H200 capture), the incidents'
devices.list lines verbatim, and the H200 UVM measurement (`h200_node`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from zoneinfo import ZoneInfo

import gpuwarden.examples as examples_pkg
from gpuwarden import engine
from gpuwarden.examples import open_bundle_dir
from gpuwarden.facts import NodeFacts, Settings
from gpuwarden.findings import Report
from gpuwarden.root import BundleRoot, HostRoot, Missing, StatInfo

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = Path(examples_pkg.__file__).parent
FIXTURES = REPO / "tests/fixtures"
CAPTURE = FIXTURES / "captures/h200-2026-11-22"
#: the memory tests' real captures: a devbox and the H200 UVM measurement (tests/fixtures/memory)
DEVBOX = REPO / "tests/fixtures/memory/devbox"
H200 = REPO / "tests/fixtures/memory/h200-uvm"

SH = ZoneInfo("Asia/Shanghai")
#: 2025-07-30 21:05:00 +08:00: three minutes after the log incident's last kubelet line
CAPTURED = dt.datetime(2025, 7, 30, 21, 5, tzinfo=SH).timestamp()

# identities used by tools/build_examples.py
GPU_UUID = "GPU-517551a5-9054-f7d5-9cfb-b9575e192f6f"
POD_UID = "8f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"
PLUGIN_POD_UID = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
CID_GPU = "4c2f0b8e9a7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c6b5a4938271605f4e3d"
CID_PAUSE = "9e8d7c6b5a4938271605f4e3d2c1b0a9f8e7d6c5b4a3928170605f4e3d2c1b0a"
CID_PLUGIN = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"
UVM_MAJOR = 238
PLUGIN_PID = 2301
GPU_PID = 3400
KUBELET_PID = 1200

GPU_DEVICES_LIST = f"/sys/fs/cgroup/devices/kubepods/besteffort/pod{POD_UID}/{CID_GPU}/devices.list"
GPU_SPEC = f"/run/containerd/io.containerd.runtime.v2.task/k8s.io/{CID_GPU}/config.json"
CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"

# --- the incidents' devices.list, verbatim (shared/incidents/*.zh.md) -------------------------
#: incident 1: the GPU container's list, no `c 237:0 rw` for nvidia-uvm (major 237 on that node)
INCIDENT1_DEVICES_LIST = """\
c 1:5 rwm
c 1:3 rwm
c 1:9 rwm
c 1:8 rwm
c 5:0 rwm
c 5:1 rwm
c 195:255 rw
c 195:1 rw
c *:* m
b *:* m
c 1:7 rwm
c 136:* rwm
c 5:2 rwm
c 10:200 rwm
"""
INCIDENT1_UVM_MAJOR = 237
#: incident 1, after `echo 'c 237:0 rw' > devices.allow`
INCIDENT1_PATCHED = INCIDENT1_DEVICES_LIST + "c 237:0 rw\n"
#: incident 3, "异常容器的devices.list" (after `runc update`)
INCIDENT3_BROKEN = """\
c 1:5 rwm
c 1:3 rwm
c 1:9 rwm
c 1:8 rwm
c 5:0 rwm
c 5:1 rwm
c *:* m
b *:* m
c 1:7 rwm
c 136:* rwm
c 5:2 rwm
c 10:200 rwm
"""
#: incident 3, "正常容器的devices.list" (the healthy container), annotations dropped: the broken list
#: and, last, the two lines the write-up marks as missing from it
INCIDENT3_HEALTHY = INCIDENT3_BROKEN + "c 195:255 rw\nc 195:3 rw\n"
#: the same two lines exactly as the write-up prints them, with its inline note
INCIDENT3_ANNOTATED_LINES = ["c 195:255 rw（异常容器中缺少的）", "c 195:3 rw（异常容器中缺少的）"]


def text(path: Path) -> str:
    """A fixture file's text."""
    return path.read_text()


# --- building a node -----------------------------------------------------------------------------

def _put(base: Path, files: Mapping[str, str | bytes]) -> None:
    for path, data in files.items():
        f = base / path.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data if isinstance(data, bytes) else data.encode())


def bundle(dest: Path, files: Mapping[str, str | bytes], *, captured_at: float | None = CAPTURED,
           meta: dict | None = None, tz: str | None = "Asia/Shanghai") -> BundleRoot:
    """A bundle directory at `dest` holding exactly these files (plus /etc/timezone unless tz is None).

    captured_at=None leaves it out of meta.json: an overlay then keeps its lower layer's capture time.
    """
    _put(dest / "files", files)
    if tz:
        _put(dest / "files", {"/etc/timezone": tz + "\n"})
    m: dict = {"format": "gpuwarden.bundle/v1"}
    if captured_at is not None:
        m["captured_at"] = captured_at
    m.update(meta or {})
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "meta.json").write_text(json.dumps(m))
    return BundleRoot(dest)


def live(dest: Path, files: Mapping[str, str | bytes]) -> HostRoot:
    """A live tree at `dest` holding these files, read as a host's root."""
    _put(dest, files)
    return HostRoot(str(dest))


def example_root(name: str) -> BundleRoot:
    return examples_pkg.open_example(name)


def copy_example(name: str, dest: Path) -> Path:
    """Copy one example directory (its `base` still resolves to the packaged examples)."""
    out = dest / name
    shutil.copytree(EXAMPLES / name, out)
    return out


def bundle_file(bundle: Path, path: str) -> Path:
    """The file of a node path inside a bundle directory (parents created)."""
    f = bundle / "files" / path.lstrip("/")
    f.parent.mkdir(parents=True, exist_ok=True)
    return f


def write(bundle: Path, path: str, data: str | bytes) -> None:
    _put(bundle / "files", {path: data})


def edit_meta(bundle: Path, fn) -> None:
    """Edit a copied example's meta.json (stat, listdir, remove) in place."""
    meta = json.loads((bundle / "meta.json").read_text())
    fn(meta)
    (bundle / "meta.json").write_text(json.dumps(meta))


def ev_lines(f) -> list[str]:
    """A finding's evidence as "source: text" lines."""
    return [f"{e.source}: {e.text}" for e in f.evidence]


def open_dir(bundle: Path) -> BundleRoot:
    return open_bundle_dir(bundle, label=f"bundle:{bundle.name}")


def facts_of(root, now: float | None = None, **settings) -> NodeFacts:
    """The node's facts without live probes; `now` defaults to the capture time (a live tree: the clock)."""
    s = Settings(probes=False)
    for k, v in settings.items():
        setattr(s, k, v)
    return NodeFacts(root, s, now=now)


def report_of(root, select: tuple[str, ...] = (), ignore: tuple[str, ...] = ()) -> Report:
    facts = facts_of(root)
    return engine.run(facts, engine.select(engine.all_rules(), select, ignore), mode="bundle")


def findings(root, code_prefix: str = "GPU-DEV") -> list:
    return [f for f in report_of(root, (code_prefix,)).findings]


# --- a live tree from a bundle, for HostRoot and `collect` --------------------------------------
#: directories whose unknown entries (listed in meta.json only) are directories, not files
_DIR_PARENTS = ("/sys/fs/cgroup", "/var/log/pods")


def materialize(root: BundleRoot, dest: Path) -> Path:
    """Recreate a bundle as a real filesystem tree: files, device nodes (mknod), listed names."""
    dest.mkdir(parents=True, exist_ok=True)

    def host(p: str) -> Path:
        return dest / p.lstrip("/")

    def walk(d: str) -> None:
        names = root.listdir(d)
        if isinstance(names, Missing):
            return
        host(d).mkdir(parents=True, exist_ok=True)
        for n in names:
            p = f"{d.rstrip('/')}/{n}"
            st = root.stat(p, follow=False)
            target = root.readlink(p)
            if isinstance(target, str):  # /proc/<pid>/fd/N, /dev/char links: recreate as symlinks
                os.symlink(target, host(p))
                continue
            if isinstance(st, StatInfo) and st.kind in ("chr", "blk"):
                kind = stat.S_IFCHR if st.kind == "chr" else stat.S_IFBLK
                os.mknod(host(p), kind | (st.mode & 0o7777 or 0o666), os.makedev(st.major or 0, st.minor or 0))
                continue
            data = root.read_bytes(p)
            if isinstance(data, bytes):
                host(p).write_bytes(data)
                continue
            if not isinstance(root.listdir(p), Missing) or d in _DIR_PARENTS:
                host(p).mkdir(parents=True, exist_ok=True)
                walk(p)
                continue
            host(p).write_bytes(b"")

    walk("/")
    return dest


# --- the H200 UVM measurement as a node ----------------------------------------------------------
#: a pod on a cgroup v2 node with the systemd driver, holding the H200 measurement's charges
H200_POD_UID = "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
H200_CID = "a" * 63 + "1"
H200_PID = 4242
#: the replay's capture time (2026-11-22T02:11:15Z)
H200_CAPTURED = 1795313475.0


def h200_node(base: Path, moment: str = "managed") -> BundleRoot:
    """The H200 measurement replayed as a Kubernetes node: the measured process is a GPU pod's container."""
    uid_ = H200_POD_UID.replace("-", "_")
    pod = f"/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice"
    ctr = f"{pod}/cri-containerd-{H200_CID}.scope"
    stat_ = text(H200 / f"memory.stat.{moment}")
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
        "/sys/fs/cgroup/kubepods.slice/memory.stat": stat_,
        "/sys/fs/cgroup/kubepods.slice/memory.current": cur,
        f"{pod}/memory.stat": stat_, f"{pod}/memory.current": cur, f"{pod}/memory.max": "34359738368\n",
        f"{ctr}/memory.stat": stat_, f"{ctr}/memory.current": cur, f"{ctr}/cgroup.procs": f"{H200_PID}\n",
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
    return bundle(base, files, captured_at=H200_CAPTURED, meta=meta, tz=None)
