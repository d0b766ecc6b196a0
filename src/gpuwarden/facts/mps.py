"""MPS (CUDA Multi-Process Service) on the node: is it meant to run, can it run.

The NVIDIA device plugin's MPS control daemon execs `nvidia-cuda-mps-control` (and
`nvidia-smi -c EXCLUSIVE_PROCESS`), which the NVIDIA runtime injects from the driver root. A
driver upgrade that drops the compute-utils package (incident 5b) leaves nvidia-smi in place
and the MPS binary gone. So this section records, per driver root, whether each of the two
binaries is there, and the signs that MPS is configured at all:
- an MPS control daemon pod (its log directory under /var/log/pods),
- gpu-feature-discovery labels `nvidia.com/mps.capable=true` / `nvidia.com/gpu.sharing-strategy=mps`
  (the NFD local-source file it writes),
- a device-plugin config with `sharing.mps.resources` (ConfigMap volumes of pods on the node, or
  Settings.extra["device_plugin_config"]),
- the host MPS root (/run/nvidia/mps) the daemon creates.
"""

from __future__ import annotations

from dataclasses import dataclass, field


from gpuwarden.facts.node import NodeFacts, fact
from gpuwarden.findings import Evidence
from gpuwarden.root import Missing, StatInfo, glob

MPS_BINARY = "nvidia-cuda-mps-control"
#: where the runtime takes driver binaries from: host install, GPU Operator toolkit, driver container
DRIVER_BIN_DIRS = ("/usr/bin", "/usr/local/nvidia/bin", "/run/nvidia/driver/usr/bin")
GFD_LABEL_FILES = ("/etc/kubernetes/node-feature-discovery/features.d/gfd",)
MPS_ROOT = "/run/nvidia/mps"
PLUGIN_CONFIG_GLOBS = ("/var/lib/kubelet/pods/*/volumes/kubernetes.io~configmap/*/*",)
MAX_CONFIG_FILES = 200
MAX_CONFIG_BYTES = 256 << 10


@dataclass(frozen=True)
class BinaryCheck:
    dir: str
    mps_control: bool | None  # None: cannot tell (unreadable, not captured)
    nvidia_smi: bool | None
    source: str = ""


@dataclass
class MpsFacts:
    configured: list[Evidence] = field(default_factory=list)
    binaries: list[BinaryCheck] = field(default_factory=list)
    daemon_pods: list[str] = field(default_factory=list)  # "ns/pod"
    daemon_running: bool | None = None  # an nvidia-cuda-mps-* process (None: processes not visible)
    ready_file: bool | None = None

    @property
    def binary_present(self) -> bool | None:
        """True: found in some driver root; False: absent where nvidia-smi is (so the root was
        looked at); None: cannot tell."""
        if any(b.mps_control for b in self.binaries):
            return True
        if any(b.nvidia_smi and b.mps_control is False for b in self.binaries):
            return False
        return None

    def missing_where_utils_are(self) -> list[BinaryCheck]:
        return [b for b in self.binaries if b.nvidia_smi and b.mps_control is False]


def _present(facts: NodeFacts, path: str) -> bool | None:
    st = facts.root.stat(path)
    if isinstance(st, StatInfo):
        return st.kind in ("file", "link")
    if st.kind == "missing":
        return False
    return None


def _labels(facts: NodeFacts, out: MpsFacts) -> None:
    for p in GFD_LABEL_FILES:
        text = facts.read_text(p, 1 << 20)
        for line in (text or "").splitlines():
            k, _, v = line.strip().partition("=")
            if (k == "nvidia.com/mps.capable" and v.strip().lower() == "true") or (
                    k == "nvidia.com/gpu.sharing-strategy" and v.strip().lower() == "mps"):
                out.configured.append(Evidence(p, line.strip()))


def _mps_resources(doc: object) -> list[str]:
    if not isinstance(doc, dict):
        return []
    sharing = doc.get("sharing")
    mps = sharing.get("mps") if isinstance(sharing, dict) else None
    res = mps.get("resources") if isinstance(mps, dict) else None
    if not isinstance(res, list):
        return []
    out = []
    for r in res:
        if isinstance(r, dict) and r.get("name"):
            out.append(f"{r.get('name')} x{r.get('replicas', '?')}")
    return out


def _plugin_configs(facts: NodeFacts, out: MpsFacts) -> None:
    paths: list[str] = []
    extra = facts.settings.extra.get("device_plugin_config")
    if isinstance(extra, str):
        paths.append(extra)
    for g in PLUGIN_CONFIG_GLOBS:
        paths.extend(glob(facts.root, g))
    for p in paths[:MAX_CONFIG_FILES]:
        raw = facts.root.read_bytes(p, MAX_CONFIG_BYTES)
        if isinstance(raw, Missing) or b"mps" not in raw or b"sharing" not in raw:
            continue
        import yaml  # here: most nodes have no MPS sharing config, and a check need not load a YAML parser

        try:
            docs = list(yaml.safe_load_all(raw.decode("utf-8", "replace")))
        except yaml.YAMLError:
            facts.gap(p, "device plugin config: not YAML")
            continue
        for d in docs:
            res = _mps_resources(d)
            if res:
                out.configured.append(Evidence(p, "sharing.mps.resources: " + ", ".join(res)))


def _daemon_pods(facts: NodeFacts, out: MpsFacts) -> None:
    names = facts.root.listdir("/var/log/pods")
    if isinstance(names, Missing):
        return
    for d in names:
        if "mps-control-daemon" in d:
            parts = d.split("_")
            ref = f"{parts[0]}/{parts[1]}" if len(parts) >= 3 else d
            out.daemon_pods.append(ref)
            out.configured.append(Evidence(f"/var/log/pods/{d}", f"MPS control daemon pod {ref}"))


def _processes(facts: NodeFacts) -> bool | None:
    names = facts.root.listdir("/proc")
    if isinstance(names, Missing):
        return None
    pids = [n for n in names if n.isdigit()]
    if not pids:
        return None
    for pid in pids:
        comm = facts.root.read_text(f"/proc/{pid}/comm", 64)
        # comm is cut at 15 characters: "nvidia-cuda-mps" covers -control and -server
        if isinstance(comm, str) and comm.strip().startswith("nvidia-cuda-mps"):
            return True
    return False


@fact("mps")
def collect_mps(facts: NodeFacts) -> MpsFacts:
    out = MpsFacts()
    for d in DRIVER_BIN_DIRS:
        out.binaries.append(BinaryCheck(d, _present(facts, f"{d}/{MPS_BINARY}"),
                                        _present(facts, f"{d}/nvidia-smi"), f"{d}/{MPS_BINARY}"))
    _daemon_pods(facts, out)
    _labels(facts, out)
    _plugin_configs(facts, out)
    st = facts.root.stat(MPS_ROOT)
    if isinstance(st, StatInfo) and st.kind == "dir":
        out.configured.append(Evidence(MPS_ROOT, "host MPS root exists"))
        out.ready_file = _present(facts, f"{MPS_ROOT}/.ready")
    out.daemon_running = _processes(facts)
    return out
