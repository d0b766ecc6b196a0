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

and, per shared resource, what the daemon left in the MPS root, as measured on an H100 with the
plugin's real daemon (docs/validation.md, issue 25): a daemon that runs has `<res>/.started`, the MPS
control daemon's pid in `<res>/pipe/nvidia-cuda-mps-control.pid`, its `control` socket and
`<res>/log/control.log`; a clean stop (`quit`) removes `.started`, the pid file and the log directory;
a daemon that never started leaves `pipe` and `log` empty; one killed under its clients leaves
`.started` and the pid file of a process that no longer runs. MPS clients are the containers whose
spec env has CUDA_MPS_PIPE_DIRECTORY (the plugin's Allocate sets it).
"""

from __future__ import annotations


from msgspec import Struct, field

from gpuwarden.facts.node import NodeFacts, fact
from gpuwarden.findings import Evidence
from gpuwarden.parsers import plausible
from gpuwarden.root import Missing, StatInfo, glob

PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
#: the daemon's container mounts the host MPS root here; clients get <root>/<res>/pipe at the same path
CONTAINER_ROOT = "/mps"
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL_LOG_TAIL = 8 << 10

MPS_BINARY = "nvidia-cuda-mps-control"
#: where the runtime takes driver binaries from: host install, GPU Operator toolkit, driver container
DRIVER_BIN_DIRS = ("/usr/bin", "/usr/local/nvidia/bin", "/run/nvidia/driver/usr/bin")
GFD_LABEL_FILES = ("/etc/kubernetes/node-feature-discovery/features.d/gfd",)
MPS_ROOT = "/run/nvidia/mps"
PLUGIN_CONFIG_GLOBS = ("/var/lib/kubelet/pods/*/volumes/kubernetes.io~configmap/*/*",)
MAX_CONFIG_FILES = 200
MAX_CONFIG_BYTES = 256 << 10


class BinaryCheck(Struct, frozen=True):
    """Whether the MPS binaries exist in a directory of the daemon's PATH."""
    dir: str
    mps_control: bool | None  # None: cannot tell (unreadable, not captured)
    nvidia_smi: bool | None
    source: str = ""


class MpsResource(Struct, frozen=True):
    """One shared resource's directory under the host MPS root (e.g. nvidia.com/gpu)."""

    name: str
    path: str  # host path: /run/nvidia/mps/<domain>/<name>
    started: bool  # <res>/.started: the daemon started it and has not stopped it cleanly
    pipe: tuple[str, ...] | None  # entries of <res>/pipe (None: not listed)
    pid: int | None  # the MPS control daemon's pid from the pid file
    control_log: tuple[str, ...] = ()  # last lines of <res>/log/control.log
    #: the file that says the daemon started it: the device plugin's `.started`, the DRA driver's
    #: `log/startup.log` ("startup complete", written by its daemon template after `-d` returned)
    started_file: str = ".started"
    #: the DRA driver's daemons (one per claim) share the clients' in-container pipe path: their
    #: clients are the containers of the claims whose CDI spec mounts this pipe (their spec files)
    client_specs: tuple[str, ...] | None = None

    @property
    def pid_file(self) -> str:
        return f"{self.path}/pipe/{PID_FILE}"

    @property
    def control_log_path(self) -> str:
        return f"{self.path}/log/control.log"

    @property
    def pipe_in_container(self) -> str:
        return f"{CONTAINER_ROOT}/{self.name}/pipe"

    @property
    def never_started(self) -> bool:
        """Pipe directory made, nothing of a control daemon in it or in the log directory."""
        return (not self.started and self.pipe is not None and PID_FILE not in self.pipe
                and "control" not in self.pipe and not self.control_log)


class MpsClient(Struct, frozen=True):
    """A container that uses the MPS daemon's pipe."""
    pod: str  # "ns/name"
    container: str
    pipe: str  # CUDA_MPS_PIPE_DIRECTORY as the container sees it
    source: str


class MpsFacts(Struct):
    """The MPS setup of the node: config, binaries, daemon and clients."""
    configured: list[Evidence] = field(default_factory=list)
    binaries: list[BinaryCheck] = field(default_factory=list)
    daemon_pods: list[str] = field(default_factory=list)  # "ns/pod"
    daemon_running: bool | None = None  # an nvidia-cuda-mps-* process (None: processes not visible)
    ready_file: bool | None = None
    resources: list[MpsResource] = field(default_factory=list)
    clients: list[MpsClient] = field(default_factory=list)
    control_pids: list[int] = field(default_factory=list)  # running nvidia-cuda-mps-control processes

    def clients_of(self, res: MpsResource) -> list[MpsClient]:
        if res.client_specs is not None:
            return [c for c in self.clients if c.source in res.client_specs]
        return [c for c in self.clients if c.pipe.rstrip("/") == res.pipe_in_container]

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
        from gpuwarden import safeyaml  # here: most nodes have no MPS sharing config

        try:
            docs = safeyaml.load_all(raw.decode("utf-8", "replace"))
        except safeyaml.YamlError as exc:
            facts.gap(p, f"device plugin config: not YAML ({exc})")
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


_INTERPRETERS = ("sh", "bash", "dash")


def _processes(facts: NodeFacts, out: MpsFacts) -> bool | None:
    """Whether an nvidia-cuda-mps-* process runs; the control daemons' pids into `out` (None: not visible).

    From the process table: argv[0], or the 15-character task name when argv could not be read
    ("nvidia-cuda-mps": control or server, counted as a control daemon, the safe side for GPU-K8S-011)."""
    table = facts.maybe("processes")
    if table is None or not table.procs:
        return None
    found = False
    for p in table.procs.values():
        name = p.exe_name
        if name in _INTERPRETERS and len(p.argv) > 1:  # a wrapper script run by its interpreter
            name = p.argv[1].rsplit("/", 1)[-1]
        if name.startswith("nvidia-cuda-mps"):
            found = True
            if name in ("nvidia-cuda-mps-control", "nvidia-cuda-mps"):
                out.control_pids.append(p.pid)
    return found


def _resources(facts: NodeFacts, out: MpsFacts) -> None:
    """<root>/<domain>/<name> directories: the resources the daemon made pipe/log directories for."""
    domains = facts.root.listdir(MPS_ROOT)
    if isinstance(domains, Missing):
        return
    for dom in domains:
        names = facts.root.listdir(f"{MPS_ROOT}/{dom}")
        if dom.startswith(".") or dom == "shm" or isinstance(names, Missing):
            continue
        for n in names:
            path = f"{MPS_ROOT}/{dom}/{n}"
            inside = facts.root.listdir(path)
            if isinstance(inside, Missing) or "pipe" not in inside:
                continue
            pipe, pid, log = _daemon_files(facts, path, inside)
            out.resources.append(MpsResource(f"{dom}/{n}", path, ".started" in inside, pipe, pid, log))


def _daemon_files(facts: NodeFacts, path: str, inside: list[str]) -> tuple[tuple[str, ...] | None, int | None, tuple[str, ...]]:
    """(pipe entries, the control daemon's pid, the control log's last lines) of one daemon directory."""
    pipe = facts.root.listdir(f"{path}/pipe")
    pid = None
    if not isinstance(pipe, Missing) and PID_FILE in pipe:
        raw = facts.read_text(f"{path}/pipe/{PID_FILE}", 64)
        pid = int(raw.strip()) if raw and plausible.decimal(raw.strip()) else None
    log = facts.read_text(f"{path}/log/control.log", 1 << 20) if "log" in inside else None
    return (None if isinstance(pipe, Missing) else tuple(pipe), pid,
            tuple((log or "")[-CONTROL_LOG_TAIL:].splitlines()[-20:]))


def _dra_resources(facts: NodeFacts, out: MpsFacts) -> None:
    """The NVIDIA DRA driver's per-claim daemons: `<kubelet root>/plugins/gpu.nvidia.com/mps/<id>/{pipe,shm,log}`
    (dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/sharing.go, templates/mps-control-daemon.tmpl.yaml)."""
    dra = facts.maybe("dra")
    if dra is None or not dra.nvidia:
        return
    root = f"{dra.kubelet_root}/plugins/gpu.nvidia.com/mps"
    ids = facts.root.listdir(root)
    if isinstance(ids, Missing):
        return
    out.configured.append(Evidence(root, "the DRA driver's MPS control files exist"))
    for i in ids:
        path = f"{root}/{i}"
        inside = facts.root.listdir(path)
        if isinstance(inside, Missing) or "pipe" not in inside:
            continue
        pipe, pid, log = _daemon_files(facts, path, inside)
        startup = facts.read_text(f"{path}/log/startup.log", 4096) if "log" in inside else None
        specs = tuple(sorted({c.spec_source for claim in dra.claims
                              if claim.spec is not None and claim.spec.spec is not None
                              and any(h.rstrip("/") == f"{path}/pipe" for e in [claim.spec.spec.common]
                                      + list(claim.spec.spec.devices.values()) for h in e.mount_hosts)
                              for _, c, _ in claim.containers if c.spec_source}))
        out.resources.append(MpsResource(f"gpu.nvidia.com/mps/{i}", path, "startup complete" in (startup or ""),
                                         pipe, pid, log, "log/startup.log", specs))


def _clients(facts: NodeFacts, out: MpsFacts) -> None:
    ctrs = facts.maybe("containers")
    for pod, c in ctrs.containers() if ctrs is not None else []:
        pipe = c.env.get(PIPE_ENV)
        if pipe:
            out.clients.append(MpsClient(pod.ref, c.name or c.id[:12], pipe, c.spec_source or c.cgroup))


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
    if (isinstance(st, StatInfo) and st.kind == "dir") or not isinstance(facts.root.listdir(MPS_ROOT), Missing):
        out.configured.append(Evidence(MPS_ROOT, "host MPS root exists"))
        out.ready_file = _present(facts, f"{MPS_ROOT}/.ready")
        _resources(facts, out)
    _dra_resources(facts, out)
    out.daemon_running = _processes(facts, out)
    _clients(facts, out)
    return out
