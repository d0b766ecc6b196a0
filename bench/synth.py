#!/usr/bin/env python3
"""Generate a synthetic large GPU node as a bundle directory, in the real formats.

    .venv/bin/python bench/synth.py OUT_DIR [--gpus 8] [--pods 110] [--containers 250]
        [--cgroup v1|v2] [--log-mb 200] [--log-rate 4000] [--hang-at 300] [--seed 1]

What it writes (docs/architecture.md "Bundle layout"; everything `gpuwarden collect` captures):

- the real H200 capture's /proc, driver and nvidia-smi files (tests/fixtures/captures/h200-2026-11-22),
  widened to N GPUs (/proc/driver/nvidia/gpus/*, nvidia-smi XML <gpu> blocks, /dev/nvidia<N> stats);
  /proc/meminfo recomputed for a 2 TiB node whose pods use what their memory.stat says;
- `--pods` pods holding `--containers` containers (plus one pause sandbox per pod), spread over the
  guaranteed/burstable/besteffort QoS classes, one GPU per GPU pod (one GPU pod per GPU, the NVIDIA
  device plugin and dcgm-exporter pods too); per container: pids, /proc/<pid>/{cmdline,stat,cgroup,environ},
  the reduced OCI spec (containerd v2 task config.json), /var/log/containers and /var/log/pods names;
  GPU processes hold /dev/nvidia* descriptors (meta.json readlink) and see the nodes in their /dev;
- cgroups: `--cgroup v1` = cgroup v1 + cgroupfs driver (devices/memory/pids hierarchies,
  `kubepods/<qos>/pod<uid>/<id>`, devices.list, v1 memory.stat/usage/limit/kmem) or `--cgroup v2`
  = unified + systemd driver (`kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_>.slice/
  cri-containerd-<id>.scope`, v2 memory.stat/current/max/pressure, and the runc device programs of
  every container in /.gpuwarden/bpf-programs.json, built by tests/support/devprog.py);
- kubelet config (`--v=4` on the command line), cpu_manager_state, the device-manager checkpoint
  (AllocResp as a real ContainerAllocateResponse protobuf);
- `/.gpuwarden/logs/kubelet.log`: `--log-mb` MB of klog `--v=4` text at `--log-rate` bytes/s ending at
  the capture time (probes, PLEG, sync loop, housekeeping, status manager, eviction manager, cadvisor
  chatter, /metrics requests, and device-manager admissions of GPU pods every few minutes); with
  `--hang-at S` the last GPU admission (S seconds before the capture) issues a GetPreferredAllocation
  that never returns (incident 5): no SyncLoop line after it, pods queued behind it;
- the capture's kernel log, and small CRI logs of the device-plugin and dcgm pods.

The output is deterministic for given arguments (seeded). A `.synth.json` stamp records them; the
bench reuses a directory whose stamp matches.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import datetime as dt
import itertools
import json
import random
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CAPTURE = REPO / "tests/fixtures/captures/h200-2026-11-22"
STAMP = ".synth.json"
GENERATOR_VERSION = 4

CAPTURED = 1795313561.0  # the capture's time (2026-11-22 02:12:41 UTC)
BTIME = CAPTURED - 40 * 86400  # the node has been up 40 days
CLK = 100
UVM = 238
KUBELET_PID = 45878
GIB = 1 << 30
RUNC_DEFAULT = ["c 1:5 rwm", "c 1:3 rwm", "c 1:9 rwm", "c 1:8 rwm", "c 5:0 rwm", "c 5:1 rwm",
                "c *:* m", "b *:* m", "c 1:7 rwm", "c 136:* rwm", "c 5:2 rwm", "c 10:200 rwm"]
NAMESPACES = ["ml-train", "ml-infer", "data", "monitoring", "kube-system", "batch", "research", "serving"]


@dataclass
class Spec:
    gpus: int = 8
    pods: int = 110
    containers: int = 250
    cgroup: str = "v1"
    log_mb: float = 200.0
    log_rate: int = 4000  # bytes of kubelet log per second of node time
    hang_at: int = 300  # seconds before the capture of a hung GetPreferredAllocation; 0: none
    seed: int = 1
    version: int = GENERATOR_VERSION


@dataclass
class Ctr:
    id: str
    name: str
    pids: list[int]
    sandbox: bool = False
    gpu_minors: list[int] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)
    anon: int = 0
    file: int = 0
    kernel: int = 0


@dataclass
class PodDef:
    uid: str
    ns: str
    name: str
    qos: str
    ctrs: list[Ctr]

    @property
    def workload(self) -> list[Ctr]:
        return [c for c in self.ctrs if not c.sandbox]


class Bundle:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.meta: dict = {"format": "gpuwarden.bundle/v1", "stat": {}, "readlink": {}, "listdir": {},
                           "missing": {}}

    def file(self, path: str, data: str | bytes) -> None:
        self.files[path] = data.encode() if isinstance(data, str) else data

    def chr(self, path: str, major: int, minor: int, ctime: float, mode: int = 0o20666) -> None:
        self.meta["stat"][path] = {"path": path, "kind": "chr", "major": major, "minor": minor, "mode": mode,
                                   "ctime": ctime, "mtime": ctime, "size": 0}

    def write(self, out: Path) -> None:
        for path, data in self.files.items():
            p = out / "files" / path.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        (out / "meta.json").write_text(json.dumps(self.meta, indent=1, sort_keys=True) + "\n")


# -- names ---------------------------------------------------------------------------------------

def _uid(rng: random.Random) -> str:
    h = "%032x" % rng.getrandbits(128)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-8{h[17:20]}-{h[20:32]}"


def _cid(rng: random.Random) -> str:
    return "%064x" % rng.getrandbits(256)


def _gpu_uuid(i: int) -> str:
    return f"GPU-{0x517551a5 + i:08x}-9054-f7d5-9cfb-b9575e19{i:04x}"


def _bus(i: int) -> str:
    return f"0000:{0x18 + 0x10 * i:02x}:00.0" if i < 14 else f"0001:{0x18 + 0x10 * (i - 14):02x}:00.0"


# -- pods ----------------------------------------------------------------------------------------

def make_pods(spec: Spec, rng: random.Random) -> list[PodDef]:
    n_gpu_pods = min(spec.gpus, max(1, spec.pods - 2))
    per_pod = [1] * spec.pods
    for i in range(max(0, spec.containers - spec.pods)):
        per_pod[(i * 7) % spec.pods] += 1
    pods: list[PodDef] = []
    next_pid = 10000
    for i in range(spec.pods):
        if i == 0:
            ns, name, qos = "kube-system", "nvidia-device-plugin-daemonset-x7k2p", "burstable"
        elif i == 1:
            ns, name, qos = "monitoring", "nvidia-dcgm-exporter-q8v4n", "burstable"
        elif i < 2 + n_gpu_pods:
            ns, name, qos = "ml-train", f"trainer-{i - 2}", "guaranteed"
        else:
            ns = NAMESPACES[i % len(NAMESPACES)]
            name = f"svc-{i:03d}-{rng.getrandbits(20):05x}"
            qos = ("guaranteed", "burstable", "besteffort")[i % 3]
        uid = _uid(rng)
        ctrs = [Ctr(_cid(rng), "POD", [next_pid], sandbox=True, argv=["/pause"])]
        next_pid += 1
        for j in range(per_pod[i]):
            npids = 2 if j == 0 else 1
            pids = list(range(next_pid, next_pid + npids))
            next_pid += npids + rng.randrange(3)
            if i == 0:
                cname, argv = "nvidia-device-plugin-ctr", ["nvidia-device-plugin"]
            elif i == 1:
                cname, argv = "nvidia-dcgm-exporter", ["/usr/bin/dcgm-exporter", "-f", "/etc/dcgm-exporter/dcp-metrics-included.csv"]
            elif 2 <= i < 2 + n_gpu_pods and j == 0:
                cname, argv = "trainer", ["python", "train.py", "--epochs", "90"]
            else:
                cname, argv = (f"app-{j}" if j else "main"), ["/app/server", f"--port={8000 + j}"]
            c = Ctr(_cid(rng), cname, pids, argv=argv)
            if 2 <= i < 2 + n_gpu_pods and j == 0:
                c.gpu_minors = [i - 2]
                c.anon, c.file, c.kernel = 24 * GIB, 6 * GIB, 512 << 20
            else:
                c.anon = rng.randrange(64, 2048) << 20
                c.file = rng.randrange(16, 1024) << 20
                c.kernel = rng.randrange(2, 64) << 20
            ctrs.append(c)
        pods.append(PodDef(uid, ns, name, qos, ctrs))
    return pods


# -- cgroup paths ----------------------------------------------------------------------------------

def pod_rel(spec: Spec, p: PodDef) -> str:
    if spec.cgroup == "v1":
        return f"kubepods/pod{p.uid}" if p.qos == "guaranteed" else f"kubepods/{p.qos}/pod{p.uid}"
    u = p.uid.replace("-", "_")
    if p.qos == "guaranteed":
        return f"kubepods.slice/kubepods-pod{u}.slice"
    return f"kubepods.slice/kubepods-{p.qos}.slice/kubepods-{p.qos}-pod{u}.slice"


def ctr_rel(spec: Spec, p: PodDef, c: Ctr) -> str:
    leaf = c.id if spec.cgroup == "v1" else f"cri-containerd-{c.id}.scope"
    return f"{pod_rel(spec, p)}/{leaf}"


def v1_memory_stat(anon: int, file: int, total: bool = True) -> str:
    keys = {"cache": file, "rss": anon, "rss_huge": 0, "shmem": 0, "mapped_file": file // 8, "dirty": 0,
            "writeback": 0, "swap": 0, "pgpgin": 123456, "pgpgout": 65432, "pgfault": 987654, "pgmajfault": 12,
            "inactive_anon": anon // 4, "active_anon": anon - anon // 4, "inactive_file": file // 2,
            "active_file": file - file // 2, "unevictable": 0, "hierarchical_memory_limit": 9223372036854771712,
            "hierarchical_memsw_limit": 9223372036854771712}
    out = [f"{k} {v}" for k, v in keys.items()]
    if total:
        out += [f"total_{k} {v}" for k, v in keys.items() if not k.startswith("hierarchical")]
    return "\n".join(out) + "\n"


def v2_memory_stat(anon: int, file: int, kernel: int) -> str:
    slab = kernel // 2
    keys = [("anon", anon), ("file", file), ("kernel", kernel), ("kernel_stack", kernel // 16),
            ("pagetables", kernel // 8), ("sec_pagetables", 0), ("percpu", 4096 * 64), ("sock", 0),
            ("vmalloc", 0), ("shmem", 0), ("zswap", 0), ("zswapped", 0), ("file_mapped", file // 8),
            ("file_dirty", 0), ("file_writeback", 0), ("swapcached", 0), ("anon_thp", 0), ("file_thp", 0),
            ("shmem_thp", 0), ("inactive_anon", anon // 4), ("active_anon", anon - anon // 4),
            ("inactive_file", file // 2), ("active_file", file - file // 2), ("unevictable", 0),
            ("slab_reclaimable", slab // 2), ("slab_unreclaimable", slab - slab // 2), ("slab", slab),
            ("workingset_refault_anon", 0), ("workingset_refault_file", 17), ("workingset_activate_anon", 0),
            ("workingset_activate_file", 3), ("workingset_restore_anon", 0), ("workingset_restore_file", 0),
            ("workingset_nodereclaim", 0), ("pgscan", 0), ("pgsteal", 0), ("pgscan_kswapd", 0),
            ("pgscan_direct", 0), ("pgsteal_kswapd", 0), ("pgsteal_direct", 0), ("pgfault", 987654),
            ("pgmajfault", 12), ("pgrefill", 0), ("pgactivate", 100), ("pgdeactivate", 0), ("pglazyfree", 0),
            ("pglazyfreed", 0), ("thp_fault_alloc", 0), ("thp_collapse_alloc", 0)]
    return "".join(f"{k} {v}\n" for k, v in keys)


PRESSURE0 = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1234\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=567\n"


# -- pieces -----------------------------------------------------------------------------------------

def proc_stat_line(pid: int, comm: str, start_ticks: int) -> str:
    rest = ["S", "1", str(pid), str(pid), "0", "-1", "4194560", "1200", "0", "0", "0", "35", "12",
            "0", "0", "20", "0", "12", "0", str(start_ticks), "734003200", "12000"] + ["0"] * 30
    return f"{pid} ({comm[:15]}) " + " ".join(rest) + "\n"


def alloc_resp(devices: list[str], env: dict[str, str]) -> str:
    """A ContainerAllocateResponse in protobuf wire format (envs = 1 map, devices = 3 DeviceSpec)."""
    def ld(num: int, payload: bytes) -> bytes:
        n = len(payload)
        var = bytearray()
        while True:
            b = n & 0x7F
            n >>= 7
            var.append(b | (0x80 if n else 0))
            if not n:
                break
        return bytes([num << 3 | 2]) + bytes(var) + payload

    msg = b""
    for k, v in env.items():
        msg += ld(1, ld(1, k.encode()) + ld(2, v.encode()))
    for d in devices:
        msg += ld(3, ld(1, d.encode()) + ld(2, d.encode()) + ld(3, b"rw"))
    return base64.b64encode(msg).decode()


def oci_spec(spec: Spec, p: PodDef, c: Ctr, devices: list[tuple[str, int, int]], env: dict[str, str]) -> str:
    def rule(r: str) -> dict:
        t, nums, acc = r.split()
        mj, mn = nums.split(":")
        d: dict = {"allow": True, "type": t, "access": acc}
        if mj != "*":
            d["major"] = int(mj)
        if mn != "*":
            d["minor"] = int(mn)
        return d

    rules = [{"allow": False, "access": "rwm"}] + [rule(r) for r in RUNC_DEFAULT]
    rules += [{"allow": True, "type": "c", "major": mj, "minor": mn, "access": "rw"} for _, mj, mn in devices]
    ctype = "sandbox" if c.sandbox else "container"
    doc = {
        "ociVersion": "1.1.0",
        "annotations": {"io.kubernetes.cri.container-type": ctype,
                        **({} if c.sandbox else {"io.kubernetes.cri.container-name": c.name}),
                        "io.kubernetes.cri.sandbox-name": p.name, "io.kubernetes.cri.sandbox-namespace": p.ns,
                        "io.kubernetes.cri.sandbox-uid": p.uid},
        "process": {"env": [f"{k}={v}" for k, v in env.items()]},
        "linux": {"devices": [{"path": path, "type": "c", "major": mj, "minor": mn, "fileMode": 438, "uid": 0,
                               "gid": 0} for path, mj, mn in devices],
                  "resources": {"devices": rules},
                  "cgroupsPath": (f"/{ctr_rel(spec, p, c)}" if spec.cgroup == "v1" else
                                  f"{pod_rel(spec, p).rsplit('/', 1)[-1]}:cri-containerd:{c.id}")},
        "hooks": {},
    }
    return json.dumps(doc, indent=1)


def nvidia_smi_xml(n: int) -> str:
    text = (CAPTURE / "files/.gpuwarden/commands/nvidia-smi-q-x.xml").read_text()
    start = text.index("\t<gpu id=")
    end = text.index("</gpu>", start) + len("</gpu>\n")
    block = text[start:end]
    gpus = []
    for i in range(n):
        b = block.replace("00000000:00:06.0", "0000" + _bus(i).upper())
        b = b.replace("GPU-517551a5-9054-f7d5-9cfb-b9575e192f6f", _gpu_uuid(i))
        b = b.replace("<minor_number>0</minor_number>", f"<minor_number>{i}</minor_number>")
        gpus.append(b)
    head = text[:start].replace("<attached_gpus>1</attached_gpus>", f"<attached_gpus>{n}</attached_gpus>")
    return head + "".join(gpus) + text[end:]


def meminfo(total_kb: int, anon: int, file: int, kernel: int) -> str:
    anon_kb, file_kb = anon >> 10, file >> 10
    slab_kb = (kernel >> 10) // 2 + 4 * 1024 * 1024
    used = anon_kb + file_kb + slab_kb + 8 * 1024 * 1024  # + 8 GiB of kernel/driver memory
    free = total_kb - used
    rows = [("MemTotal", total_kb), ("MemFree", free), ("MemAvailable", free + file_kb * 9 // 10),
            ("Buffers", 512 * 1024), ("Cached", file_kb), ("SwapCached", 0),
            ("Active", anon_kb * 3 // 4 + file_kb // 2), ("Inactive", anon_kb // 4 + file_kb // 2),
            ("Active(anon)", anon_kb * 3 // 4), ("Inactive(anon)", anon_kb // 4), ("Active(file)", file_kb // 2),
            ("Inactive(file)", file_kb // 2), ("Unevictable", 0), ("Mlocked", 0), ("SwapTotal", 0), ("SwapFree", 0),
            ("Zswap", 0), ("Zswapped", 0), ("Dirty", 1024), ("Writeback", 0), ("AnonPages", anon_kb),
            ("Mapped", file_kb // 8), ("Shmem", 65536), ("KReclaimable", slab_kb // 2), ("Slab", slab_kb),
            ("SReclaimable", slab_kb // 2), ("SUnreclaim", slab_kb - slab_kb // 2), ("KernelStack", 98304),
            ("PageTables", 1048576), ("SecPageTables", 0), ("NFS_Unstable", 0), ("Bounce", 0),
            ("WritebackTmp", 0), ("CommitLimit", total_kb // 2), ("Committed_AS", anon_kb * 2),
            ("VmallocTotal", 34359738367), ("VmallocUsed", 2097152), ("VmallocChunk", 0), ("Percpu", 262144),
            ("HardwareCorrupted", 0), ("AnonHugePages", 0), ("ShmemHugePages", 0), ("ShmemPmdMapped", 0),
            ("FileHugePages", 0), ("FilePmdMapped", 0), ("Unaccepted", 0), ("HugePages_Total", 0),
            ("HugePages_Free", 0), ("HugePages_Rsvd", 0), ("HugePages_Surp", 0), ("Hugepagesize", 2048),
            ("Hugetlb", 0), ("DirectMap4k", 1048576), ("DirectMap2M", 67108864), ("DirectMap1G", total_kb)]
    out = []
    for k, v in rows:
        if k.startswith("HugePages_"):
            out.append(f"{k + ':':<16}{v:>8}")
        else:
            out.append(f"{k + ':':<16}{v:>8} kB")
    return "\n".join(out) + "\n"


# -- the node -----------------------------------------------------------------------------------------

def build_node(spec: Spec, rng: random.Random) -> tuple[Bundle, list[PodDef]]:
    b = Bundle()
    cap_meta = json.loads((CAPTURE / "meta.json").read_text())
    for f in sorted((CAPTURE / "files").rglob("*")):
        if not f.is_file():
            continue
        rel = "/" + str(f.relative_to(CAPTURE / "files"))
        if rel.startswith(("/sys/fs/cgroup", "/proc/driver/nvidia/gpus/", "/proc/meminfo",
                           "/.gpuwarden/commands/nvidia-smi")):
            continue
        b.file(rel, f.read_bytes())
    b.meta.update({"captured_at": CAPTURED, "clk_tck": CLK, "node_name": "gpu-node-synth", "tz": "UTC",
                   "description": f"synthetic large node (bench/synth.py): {json.dumps(asdict(spec))}"})
    b.file("/proc/stat", (CAPTURE / "files/proc/stat").read_text().replace("btime 1795313527", f"btime {int(BTIME)}"))
    # GPUs
    info = (CAPTURE / "files/proc/driver/nvidia/gpus/0000:00:06.0/information").read_text()
    for i in range(spec.gpus):
        b.file(f"/proc/driver/nvidia/gpus/{_bus(i)}/information",
               info.replace("GPU-517551a5-9054-f7d5-9cfb-b9575e192f6f", _gpu_uuid(i))
               .replace("0000:00:06.0", _bus(i)).replace("Device Minor: \t 0", f"Device Minor: \t {i}"))
        b.chr(f"/dev/nvidia{i}", 195, i, BTIME + 28)
    b.file("/.gpuwarden/commands/nvidia-smi-q-x.xml", nvidia_smi_xml(spec.gpus))
    for path, st in cap_meta["stat"].items():
        if path != "/dev/nvidia0":
            b.meta["stat"][path] = dict(st, ctime=BTIME + 28, mtime=BTIME + 28)
    b.file("/.gpuwarden/commands/runc-version.txt",
           "runc version 1.1.12\ncommit: v1.1.12-0-g51d5e946\nspec: 1.0.2-dev\ngo: go1.20.13\nlibseccomp: 2.5.4\n")
    ctl_nodes = {"/dev/nvidiactl": (195, 255), "/dev/nvidia-uvm": (UVM, 0), "/dev/nvidia-uvm-tools": (UVM, 1)}

    pods = make_pods(spec, rng)
    driver = "cgroupfs" if spec.cgroup == "v1" else "systemd"
    b.file("/var/lib/kubelet/config.yaml",
           "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
           f"cgroupDriver: {driver}\ncpuManagerPolicy: none\nmaxPods: {max(110, spec.pods)}\n"
           "systemReserved:\n  memory: 8Gi\nkubeReserved:\n  memory: 4Gi\nevictionHard:\n  memory.available: 1Gi\n")
    b.file("/var/lib/kubelet/cpu_manager_state", '{"policyName":"none","defaultCpuSet":"","checksum":1353318690}')
    b.meta["listdir"]["/var/lib/kubelet/device-plugins"] = ["DEPRECATION", "kubelet.sock",
                                                             "kubelet_internal_checkpoint", "nvidia-gpu.sock"]

    # processes outside pods
    def process(pid: int, argv: list[str], ticks: int, cgroup: str, env: dict[str, str] | None = None) -> None:
        b.file(f"/proc/{pid}/cmdline", "\0".join(argv) + "\0")
        b.file(f"/proc/{pid}/stat", proc_stat_line(pid, Path(argv[0]).name, ticks))
        b.file(f"/proc/{pid}/cgroup", cgroup)
        if env is not None:
            b.file(f"/proc/{pid}/environ", "".join(f"{k}={v}\0" for k, v in env.items()))

    def v1cg(path: str) -> str:
        return "".join(f"{n}:{c}:{path}\n" for n, c in ((12, "devices"), (11, "memory"), (10, "pids"),
                                                      (1, "name=systemd"))) + "0::/\n"

    cg = (lambda p: v1cg(p)) if spec.cgroup == "v1" else (lambda p: f"0::{p}\n")
    process(1, ["/sbin/init"], 1, cg("/init.scope"))
    process(1100, ["/usr/bin/containerd"], 350, cg("/system.slice/containerd.service"))
    process(KUBELET_PID, ["/usr/bin/kubelet", "--config=/var/lib/kubelet/config.yaml",
                          "--kubeconfig=/etc/kubernetes/kubelet.conf",
                          "--container-runtime-endpoint=unix:///run/containerd/containerd.sock", "--v=4"], 420,
            cg("/system.slice/kubelet.service"))
    process(1300, ["/usr/bin/nvidia-persistenced", "--persistence-mode"], 300, cg("/system.slice/nvidia-persistenced.service"))
    fd = 10
    for i in range(spec.gpus):
        b.meta["readlink"][f"/proc/1300/fd/{fd + i}"] = f"/dev/nvidia{i}"
    b.meta["readlink"]["/proc/1300/fd/9"] = "/dev/nvidiactl"

    # pods
    mroot = "/sys/fs/cgroup/memory" if spec.cgroup == "v1" else "/sys/fs/cgroup"
    droot = "/sys/fs/cgroup/devices" if spec.cgroup == "v1" else None
    proots = ["/sys/fs/cgroup/pids"] if spec.cgroup == "v1" else []
    checkpoint_entries = []
    bpf: dict[str, dict] = {}
    log_pods, log_ctrs = [], []
    tot_anon = tot_file = tot_kernel = 0
    for p in pods:
        prel = pod_rel(spec, p)
        log_pods.append(f"{p.ns}_{p.name}_{p.uid}")
        p_anon = sum(c.anon for c in p.ctrs)
        p_file = sum(c.file for c in p.ctrs)
        p_kernel = sum(c.kernel for c in p.ctrs)
        tot_anon, tot_file, tot_kernel = tot_anon + p_anon, tot_file + p_file, tot_kernel + p_kernel
        if spec.cgroup == "v1":
            b.file(f"{mroot}/{prel}/memory.stat", v1_memory_stat(p_anon, p_file))
            b.file(f"{mroot}/{prel}/memory.usage_in_bytes", f"{p_anon + p_file + p_kernel}\n")
            b.file(f"{mroot}/{prel}/memory.limit_in_bytes", "9223372036854771712\n")
            b.file(f"{mroot}/{prel}/memory.kmem.usage_in_bytes", f"{p_kernel}\n")
        else:
            b.file(f"{mroot}/{prel}/memory.stat", v2_memory_stat(p_anon, p_file, p_kernel))
            b.file(f"{mroot}/{prel}/memory.current", f"{p_anon + p_file + p_kernel}\n")
            b.file(f"{mroot}/{prel}/memory.max", "max\n")
            b.file(f"{mroot}/{prel}/memory.pressure", PRESSURE0)
        for c in p.ctrs:
            crel = ctr_rel(spec, p, c)
            procs = "".join(f"{x}\n" for x in c.pids)
            gpu_nodes = [(f"/dev/nvidia{m}", 195, m) for m in c.gpu_minors]
            is_plugin = p.name.startswith("nvidia-device-plugin") and not c.sandbox
            is_dcgm = p.name.startswith("nvidia-dcgm") and not c.sandbox
            sees_all = is_plugin or is_dcgm
            dev_specs = ([("/dev/nvidiactl", 195, 255), ("/dev/nvidia-uvm", UVM, 0), ("/dev/nvidia-uvm-tools", UVM, 1)]
                         + gpu_nodes) if c.gpu_minors else []
            if spec.cgroup == "v1":
                for h in [mroot, droot] + proots:
                    b.file(f"{h}/{crel}/cgroup.procs", procs)
                if sees_all:
                    rules = ["a *:* rwm"]
                else:
                    rules = list(RUNC_DEFAULT) + [f"c {mj}:{mn} rw" for _, mj, mn in dev_specs]
                b.file(f"{droot}/{crel}/devices.list", "\n".join(rules) + "\n")
                if not c.sandbox:
                    b.file(f"{mroot}/{crel}/memory.stat", v1_memory_stat(c.anon, c.file))
                    b.file(f"{mroot}/{crel}/memory.usage_in_bytes", f"{c.anon + c.file + c.kernel}\n")
                    b.file(f"{mroot}/{crel}/memory.limit_in_bytes", "9223372036854771712\n")
                    b.file(f"{mroot}/{crel}/memory.kmem.usage_in_bytes", f"{c.kernel}\n")
            else:
                b.file(f"{mroot}/{crel}/cgroup.procs", procs)
                if not c.sandbox:
                    b.file(f"{mroot}/{crel}/memory.stat", v2_memory_stat(c.anon, c.file, c.kernel))
                    b.file(f"{mroot}/{crel}/memory.current", f"{c.anon + c.file + c.kernel}\n")
                    b.file(f"{mroot}/{crel}/memory.max", "max\n")
                    b.file(f"{mroot}/{crel}/memory.pressure", PRESSURE0)
                if not c.sandbox:
                    bpf[c.id] = {"cgroup": f"{mroot}/{crel}", "programs": [_program(sees_all, dev_specs)]}
            env = {"NVIDIA_VISIBLE_DEVICES": ",".join(_gpu_uuid(m) for m in c.gpu_minors),
                   "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"} if c.gpu_minors else (
                {"NVIDIA_VISIBLE_DEVICES": "all"} if sees_all else {})
            b.file(f"/run/containerd/io.containerd.runtime.v2.task/k8s.io/{c.id}/config.json",
                   oci_spec(spec, p, c, dev_specs, env))
            if not c.sandbox:
                log_ctrs.append(f"{p.name}_{p.ns}_{c.name}-{c.id}.log")
            start = int((rng.uniform(1, 30 * 86400)) * CLK)
            for k, pid in enumerate(c.pids):
                penv = None
                if is_plugin:
                    penv = {"PASS_DEVICE_SPECS": "true", "DEVICE_LIST_STRATEGY": "envvar", "FAIL_ON_INIT_ERROR": "true",
                            "NVIDIA_VISIBLE_DEVICES": "all"}
                elif c.gpu_minors or sees_all:
                    penv = env
                process(pid, c.argv, start + k, cg(f"/{crel}"), penv)
                # what the container sees in /dev (collect records the listing and the nvidia stats)
                devs = ["core", "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin",
                        "stdout", "termination-log", "tty", "urandom", "zero"]
                seen: dict[str, tuple[int, int]] = {}
                if sees_all:
                    seen = dict(ctl_nodes, **{f"/dev/nvidia{i}": (195, i) for i in range(spec.gpus)})
                elif c.gpu_minors:
                    seen = dict(ctl_nodes, **{path: (mj, mn) for path, mj, mn in gpu_nodes})
                b.meta["listdir"][f"/proc/{pid}/root/dev"] = sorted(devs + [x.split("/")[2] for x in seen])
                for path, (mj, mn) in seen.items():
                    b.chr(f"/proc/{pid}/root{path}", mj, mn, BTIME + start / CLK)
                if (c.gpu_minors or is_dcgm) and k == 0:
                    targets = ["/dev/nvidiactl", "/dev/nvidia-uvm"] + [f"/dev/nvidia{m}" for m in
                                                                       (c.gpu_minors or range(spec.gpus))]
                    for n, t in enumerate(targets * 4):  # CUDA opens each node several times
                        b.meta["readlink"][f"/proc/{pid}/fd/{20 + n}"] = t
        if any(c.gpu_minors for c in p.ctrs):
            c = p.workload[0]
            devs = [_gpu_uuid(m) for m in c.gpu_minors]
            paths = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] + [f"/dev/nvidia{m}" for m in c.gpu_minors]
            checkpoint_entries.append({"PodUID": p.uid, "ContainerName": c.name, "ResourceName": "nvidia.com/gpu",
                                       "DeviceIDs": {"-1": devs},
                                       "AllocResp": alloc_resp(paths, {"NVIDIA_VISIBLE_DEVICES": ",".join(devs)})})
    b.file("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint", json.dumps(
        {"Data": {"PodDeviceEntries": checkpoint_entries,
                  "RegisteredDevices": {"nvidia.com/gpu": [_gpu_uuid(i) for i in range(spec.gpus)]}},
         "Checksum": 3053296893}))
    if bpf:
        b.file("/.gpuwarden/bpf-programs.json", json.dumps(bpf))
    b.meta["listdir"]["/var/log/pods"] = sorted(log_pods)
    b.meta["listdir"]["/var/log/containers"] = sorted(log_ctrs)

    # node-level cgroups and memory
    total_kb = 2 * 1024 * 1024 * 1024  # 2 TiB
    sys_anon, sys_file = 6 * GIB, 20 * GIB
    if spec.cgroup == "v1":
        b.meta["listdir"]["/sys/fs/cgroup"] = ["blkio", "cpu", "cpu,cpuacct", "cpuacct", "cpuset", "devices",
                                               "freezer", "hugetlb", "memory", "net_cls", "perf_event", "pids",
                                               "systemd", "unified"]
        b.file(f"{mroot}/memory.stat", v1_memory_stat(tot_anon + sys_anon, tot_file + sys_file))
        b.file(f"{mroot}/memory.usage_in_bytes", f"{tot_anon + sys_anon + tot_file + sys_file}\n")
        b.file(f"{mroot}/kubepods/memory.stat", v1_memory_stat(tot_anon, tot_file))
        b.file(f"{mroot}/kubepods/memory.usage_in_bytes", f"{tot_anon + tot_file + tot_kernel}\n")
        b.file(f"{mroot}/kubepods/memory.kmem.usage_in_bytes", f"{tot_kernel}\n")
        b.file(f"{mroot}/system.slice/memory.stat", v1_memory_stat(sys_anon, sys_file))
        # qos-level directories exist in every hierarchy (empty dirs need a listing: use cgroup.procs)
        for h in (mroot, droot, *proots):
            for q in ("burstable", "besteffort"):
                b.file(f"{h}/kubepods/{q}/cgroup.procs", "")
            b.file(f"{h}/kubepods/cgroup.procs", "")
    else:
        b.file("/sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n")
        b.file(f"{mroot}/memory.stat", v2_memory_stat(tot_anon + sys_anon, tot_file + sys_file, tot_kernel + GIB))
        b.file(f"{mroot}/memory.pressure", PRESSURE0)
        b.file(f"{mroot}/kubepods.slice/memory.stat", v2_memory_stat(tot_anon, tot_file, tot_kernel))
        b.file(f"{mroot}/kubepods.slice/memory.current", f"{tot_anon + tot_file + tot_kernel}\n")
        b.file(f"{mroot}/system.slice/memory.stat", v2_memory_stat(sys_anon, sys_file, GIB))
        b.file(f"{mroot}/system.slice/kubelet.service/memory.pressure", PRESSURE0)
        b.file(f"{mroot}/system.slice/kubelet.service/memory.min", "0\n")
        b.file(f"{mroot}/system.slice/kubelet.service/memory.low", "0\n")
        for q in ("burstable", "besteffort"):
            b.file(f"{mroot}/kubepods.slice/kubepods-{q}.slice/cgroup.procs", "")
    b.file("/proc/meminfo", meminfo(total_kb, tot_anon + sys_anon, tot_file + sys_file, tot_kernel))

    # NVIDIA pod logs (CRI)
    t_end = dt.datetime.fromtimestamp(CAPTURED - 5, dt.timezone.utc)
    for p in pods[:2]:
        c = p.workload[0]
        lines = []
        for k in range(200):
            t = (t_end - dt.timedelta(seconds=60 * (200 - k))).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")
            msg = ("I1122 00:00:00.000000       1 server.go:165] Starting GRPC server for 'nvidia.com/gpu'"
                   if k == 0 else f"time=\"{t}\" level=info msg=\"Collecting metrics\" gpus={spec.gpus}")
            lines.append(f"{t} stderr F {msg}\n")
        b.file(f"/var/log/pods/{p.ns}_{p.name}_{p.uid}/{c.name}/0.log", "".join(lines))
    return b, pods


def _program(allow_all: bool, dev_specs: list[tuple[str, int, int]]) -> dict:
    for p in (str(REPO / "src"), str(REPO)):
        if p not in sys.path:
            sys.path.insert(0, p)
    from gpuwarden.bpf import insn as I
    from tests.support import devprog as D

    if allow_all:
        code = D.runc_program([], default_allow=True)
    else:
        rs = D.rules(*RUNC_DEFAULT, *[f"c {mj}:{mn} rw" for _, mj, mn in dev_specs])
        code = D.runc_program(rs)
    raw = I.encode(code)
    return {"id": 100 + len(dev_specs), "name": "", "tag": raw[:8].hex(), "xlated": raw.hex()}


# -- the kubelet log ----------------------------------------------------------------------------------

NOISE = [
    (30, 'I{md} {t} {pid:>7} prober.go:107] "Probe succeeded" probeType="Readiness" pod="{pod}" podUID="{uid}" containerName="{ctr}"\n'),
    (25, 'I{md} {t} {pid:>7} prober.go:107] "Probe succeeded" probeType="Liveness" pod="{pod}" podUID="{uid}" containerName="{ctr}"\n'),
    (6, 'I{md} {t} {pid:>7} generic.go:224] "GenericPLEG: Relisting"\n'),
    (10, 'I{md} {t} {pid:>7} kubelet_pods.go:1728] "Got phase for pod" pod="{pod}" oldPhase="Running" phase="Running"\n'),
    (10, 'I{md} {t} {pid:>7} kubelet_pods.go:1715] "Generating pod status" podIsTerminal=false pod="{pod}"\n'),
    (10, 'I{md} {t} {pid:>7} status_manager.go:687] "Ignoring same status for pod" pod="{pod}" status={{Phase:Running Conditions:[{{Type:Initialized Status:True LastProbeTime:0001-01-01 00:00:00 +0000 UTC LastTransitionTime:2026-10-13 09:12:44 +0000 UTC Reason: Message:}} {{Type:Ready Status:True}}] HostIP:10.0.3.17 PodIP:10.244.3.{ip} StartTime:2026-10-13 09:12:44 +0000 UTC QOSClass:Burstable}}\n'),
    (8, 'I{md} {t} {pid:>7} pod_workers.go:1270] "Processing pod event" pod="{pod}" podUID="{uid}" updateType="sync"\n'),
    (8, 'I{md} {t} {pid:>7} kubelet.go:1842] "SyncPod enter" pod="{pod}" podUID="{uid}"\n'),
    (8, 'I{md} {t} {pid:>7} volume_manager.go:403] "Waiting for volumes to attach and mount for pod" pod="{pod}"\n'),
    (8, 'I{md} {t} {pid:>7} volume_manager.go:434] "All volumes are attached and mounted for pod" pod="{pod}"\n'),
    (8, 'I{md} {t} {pid:>7} kuberuntime_manager.go:1009] "computePodActions got for pod" podActions="KillPod: false, CreateSandbox: false, UpdatePodResources: false, Attempt: 0, InitContainersToStart: [], ContainersToStart: [], EphemeralContainersToStart: [],ContainersToUpdate: map[], ContainersToKill: map[]" pod="{pod}"\n'),
    (8, 'I{md} {t} {pid:>7} kubelet.go:1852] "SyncPod exit" pod="{pod}" podUID="{uid}" isTerminal=false\n'),
    (8, 'I{md} {t} {pid:>7} pod_workers.go:1315] "Processing pod event done" pod="{pod}" podUID="{uid}" updateType="sync"\n'),
    (6, 'I{md} {t} {pid:>7} factory.go:221] Factory "containerd" was unable to handle container "/system.slice/run-containerd-runc-k8s.io-{cid}-runc.{n}.mount"\n'),
    (6, 'I{md} {t} {pid:>7} factory.go:221] Factory "systemd" was unable to handle container "/system.slice/run-containerd-runc-k8s.io-{cid}-runc.{n}.mount"\n'),
    (6, 'I{md} {t} {pid:>7} factory.go:214] Factory "raw" can handle container "/system.slice/run-containerd-runc-k8s.io-{cid}-runc.{n}.mount", but ignoring.\n'),
    (6, 'I{md} {t} {pid:>7} manager.go:933] ignoring container "/system.slice/run-containerd-runc-k8s.io-{cid}-runc.{n}.mount"\n'),
    (4, 'I{md} {t} {pid:>7} cri_stats_provider.go:502] "Unable to find network stats for sandbox" sandboxID="{cid}"\n'),
    (3, 'I{md} {t} {pid:>7} reflector.go:351] Caches populated for *v1.ConfigMap from object-"{ns}"/"kube-root-ca.crt"\n'),
    (2, 'I{md} {t} {pid:>7} eviction_manager.go:292] "Eviction manager: synchronize housekeeping"\n'),
    (2, 'I{md} {t} {pid:>7} helpers.go:1040] "Eviction manager: observations" signal="memory.available" resourceQuantity="1892Gi" available="1892Gi" capacity="2048Gi" time="{iso}"\n'),
    (2, 'I{md} {t} {pid:>7} eviction_manager.go:381] "Eviction manager: no resources are starved"\n'),
    (3, 'I{md} {t} {pid:>7} server.go:494] "HTTP" verb="GET" URI="/metrics/cadvisor" latency="48.312ms" userAgent="Prometheus/2.45.0" audit-ID="" srcIP="10.0.1.12:{n}" resp=200\n'),
    (3, 'I{md} {t} {pid:>7} server.go:494] "HTTP" verb="GET" URI="/healthz" latency="91.2µs" userAgent="kube-probe/1.29" audit-ID="" srcIP="127.0.0.1:{n}" resp=200\n'),
    (1, 'I{md} {t} {pid:>7} kubelet.go:2398] "SyncLoop (PLEG): event for pod" pod="{pod}" event={{"ID":"{uid}","Type":"ContainerStarted","Data":"{cid}"}}\n'),
    (1, 'W{md} {t} {pid:>7} watcher.go:93] Error while processing event ("/sys/fs/cgroup/devices/kubepods/burstable/pod{uid}/{cid}": 0x40000100 == IN_CREATE|IN_ISDIR): readdirent: no such file or directory\n'),
    (1, 'E{md} {t} {pid:>7} pod_workers.go:1298] "Error syncing pod, skipping" err="failed to \\"StartContainer\\" for \\"{ctr}\\" with CrashLoopBackOff: \\"back-off 5m0s restarting failed container={ctr} pod={pod}({uid})\\"" pod="{pod}" podUID="{uid}"\n'),
]
HOUSEKEEPING = [
    'I{md} {t} {pid:>7} kubelet.go:2469] "SyncLoop (housekeeping)"\n',
    'I{md} {t} {pid:>7} kubelet_pods.go:1120] "Clean up pod workers for terminated pods"\n',
    'I{md} {t} {pid:>7} kubelet_pods.go:1150] "Clean up probes for terminated pods"\n',
    'I{md} {t} {pid:>7} kubelet_pods.go:1157] "Clean up orphaned pod statuses"\n',
    'I{md} {t} {pid:>7} kubelet_pods.go:1188] "Clean up orphaned pod directories"\n',
    'I{md} {t} {pid:>7} kubelet_pods.go:1199] "Clean up orphaned mirror pods"\n',
    'I{md} {t} {pid:>7} kubelet.go:2477] "SyncLoop (housekeeping) end" duration="14ms"\n',
]
#: every second: the pods whose periodic resync is due (syncFrequency 1m over ~110 pods)
SYNC = 'I{md} {t} {pid:>7} kubelet.go:2439] "SyncLoop (SYNC) pods" total=1 pods=[{pod}]\n'
ADMIT = [
    'I{md} {t} {pid:>7} config.go:398] "Receiving a new pod" pod="{pod}"\n',
    'I{md} {t} {pid:>7} config.go:293] "Adding new pods from source" pods=[{pod}] source="api"\n',
    'I{md} {t} {pid:>7} kubelet.go:2366] "SyncLoop ADD" source="api" pods=[{pod}]\n',
    'I{md} {t} {pid:>7} topology_manager.go:215] "Topology Admit Handler" podUID="{uid}" podNamespace="{ns}" podName="{name}"\n',
    'I{md} {t} {pid:>7} manager.go:839] "Looking for needed resources" needed=1 resourceName="nvidia.com/gpu"\n',
    'I{md} {t} {pid:>7} manager.go:569] "Need devices to allocate for pod" deviceNumber=1 resourceName="nvidia.com/gpu" podUID="{uid}" containerName="{ctr}"\n',
    'I{md} {t} {pid:>7} manager.go:967] "Issuing a GetPreferredAllocation call for container" containerName="{ctr}" podUID="{uid}"\n',
]
ADMIT_DONE = [
    'I{md} {t} {pid:>7} manager.go:859] "Making allocation request for device plugin" devices=[{gpu}] resourceName="nvidia.com/gpu"\n',
    'I{md} {t} {pid:>7} manager.go:839] "Looking for needed resources" needed=1 resourceName="cpu"\n',
    'I{md} {t} {pid:>7} kuberuntime_manager.go:1030] "No sandbox for pod can be found. Need to start a new one" pod="{pod}"\n',
    'I{md} {t} {pid:>7} kubelet.go:2398] "SyncLoop (PLEG): event for pod" pod="{pod}" event={{"ID":"{uid}","Type":"ContainerStarted","Data":"{cid}"}}\n',
]


def write_kubelet_log(path: Path, spec: Spec, pods: list[PodDef], rng: random.Random) -> int:
    """klog --v=4 text of about spec.log_mb MB, ending at the capture time; returns its size."""
    target = int(spec.log_mb * (1 << 20))
    seconds = max(60, target // spec.log_rate)
    t_end = CAPTURED - 1
    t0 = t_end - seconds
    cum = list(itertools.accumulate(w for w, _ in NOISE))
    tpls = [t for _, t in NOISE]
    workload = [(p, c) for p in pods for c in p.workload]
    gpu_pods = [p for p in pods if any(c.gpu_minors for c in p.ctrs)]
    hang_t = t_end - spec.hang_at if spec.hang_at else None
    hang_pod = gpu_pods[-1] if gpu_pods else pods[-1]
    admit_every = 300  # a GPU admission every 5 minutes of node time
    size = 0
    out: list[str] = []
    batch = 0
    sec = int(t0)
    n = 0
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        while sec <= t_end:
            d = dt.datetime.fromtimestamp(sec, dt.timezone.utc)
            md = d.strftime("%m%d")
            hms = d.strftime("%H:%M:%S")
            iso = d.strftime("%Y-%m-%dT%H:%M:%SZ")
            hung = hang_t is not None and sec >= hang_t
            budget = spec.log_rate - 90  # the last line of a second overshoots by half a line on average
            us = rng.randrange(1000)
            lines: list[str] = []

            def emit(tpl: str, **kw: object) -> None:
                nonlocal us
                us += rng.randrange(1, 20000)
                lines.append(tpl.format(md=md, t=f"{hms}.{min(us, 999999):06d}", pid=KUBELET_PID, iso=iso, **kw))

            if not hung:
                if sec % 2 == 0:  # housekeepingPeriod 2s
                    for tpl in HOUSEKEEPING:
                        emit(tpl)
                p = pods[sec % len(pods)]
                emit(SYNC, pod=f"{p.ns}/{p.name}")
            if hang_t is not None and sec == int(hang_t):
                p = hang_pod
                c = p.workload[0]
                for tpl in ADMIT:
                    emit(tpl, pod=f"{p.ns}/{p.name}", uid=p.uid, ns=p.ns, name=p.name, ctr=c.name)
            elif sec % admit_every == 0 and gpu_pods and not hung:
                p = gpu_pods[(sec // admit_every) % len(gpu_pods)]
                c = p.workload[0]
                kw = dict(pod=f"{p.ns}/{p.name}", uid=p.uid, ns=p.ns, name=p.name, ctr=c.name,
                          gpu=",".join(_gpu_uuid(m) for m in c.gpu_minors), cid=c.id)
                for tpl in ADMIT + ADMIT_DONE:
                    emit(tpl, **kw)
            elif hung and sec % 97 == 0:
                p = pods[(sec // 97) % len(pods)]
                emit(ADMIT[1], pod=f"{p.ns}/{p.name}")  # queued behind the hung admission
            used = sum(len(x) for x in lines)
            while used < budget:
                p, c = workload[rng.randrange(len(workload))]
                if hung and p is hang_pod:
                    continue
                n += 1
                tpl = tpls[bisect.bisect(cum, rng.random() * cum[-1])]
                if hung and "SyncLoop" in tpl:
                    continue
                emit(tpl, pod=f"{p.ns}/{p.name}", uid=p.uid, ctr=c.name, cid=c.id, ns=p.ns, n=n % 65536, ip=n % 250)
                used += len(lines[-1])
            out.extend(lines)
            size += used
            batch += used
            if batch > 4 << 20:
                f.write("".join(out))
                out, batch = [], 0
            sec += 1
        f.write("".join(out))
    return path.stat().st_size


# -- main -----------------------------------------------------------------------------------------------

def build(out: Path, spec: Spec, force: bool = False) -> Path:
    """Write the node to `out` (reused when its stamp matches `spec`)."""
    stamp = out / STAMP
    if not force and stamp.exists():
        try:
            if json.loads(stamp.read_text()) == asdict(spec):
                return out
        except ValueError:
            pass
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    rng = random.Random(spec.seed)
    b, pods = build_node(spec, rng)
    b.write(out)
    logs = out / "files/.gpuwarden/logs"
    logs.mkdir(parents=True, exist_ok=True)
    if spec.log_mb > 0:
        write_kubelet_log(logs / "kubelet.log", spec, pods, random.Random(spec.seed + 1))
    stamp.write_text(json.dumps(asdict(spec)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    d = Spec()
    ap.add_argument("--gpus", type=int, default=d.gpus)
    ap.add_argument("--pods", type=int, default=d.pods)
    ap.add_argument("--containers", type=int, default=d.containers, help="workload containers (pause sandboxes extra)")
    ap.add_argument("--cgroup", choices=["v1", "v2"], default=d.cgroup)
    ap.add_argument("--log-mb", type=float, default=d.log_mb)
    ap.add_argument("--log-rate", type=int, default=d.log_rate, help="kubelet log bytes per second of node time")
    ap.add_argument("--hang-at", type=int, default=d.hang_at)
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    spec = Spec(a.gpus, a.pods, max(a.containers, a.pods), a.cgroup, a.log_mb, a.log_rate, a.hang_at, a.seed)
    out = build(Path(a.out), spec, a.force)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
