"""Driver and device-node facts: what the kernel module says exists, and what /dev holds."""

from __future__ import annotations

from msgspec import Struct, field

from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.parsers import keyvalue, nvidia_smi_xml, nvidia_version, plausible, proc_devices, proc_modules
from gpuwarden.root import Missing, StatInfo, glob

NVIDIACTL_MINOR = 255
MODESET_MINOR = 254
#: GPU device nodes are /dev/nvidia0 .. below the modeset and control minors
GPU_MAX_MINOR = plausible.NVIDIA_GPU_MAX_MINOR
UVM_MINOR = 0
UVM_TOOLS_MINOR = 1
VERSION_FILE = "/proc/driver/nvidia/version"
#: where the user-space NVML library is linked from (host, and the GPU Operator's driver root)
NVML_LIBS = ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
             "/usr/lib64/libnvidia-ml.so.1", "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")


class Gpu(Struct, frozen=True):
    """A GPU the driver knows, joined from /proc/driver/nvidia/gpus and nvidia-smi."""
    bus_id: str
    minor: int | None
    uuid: str
    model: str
    info: dict[str, str]
    source: str


class DeviceNode(Struct, frozen=True):
    """A device a GPU container needs: where it lives and which numbers it must have."""

    path: str
    major: int
    minor: int
    required: bool = True  # nvidia-uvm-tools and modeset are optional for CUDA

    @property
    def rule(self) -> str:
        return f"c {self.major}:{self.minor}"


class DriverFacts(Struct):
    """The NVIDIA driver as the node shows it: version, modules, GPUs and device nodes."""
    version: nvidia_version.DriverVersion | None
    devices: proc_devices.DeviceTable
    modules: dict[str, proc_modules.Module]
    gpus: list[Gpu]
    nodes: dict[str, StatInfo]  # host /dev/nvidia* (and caps), by path
    char_links: dict[str, str]  # /dev/char/M:m -> target, NVIDIA majors only
    smi: nvidia_smi_xml.SmiReport | None = None
    mig_gpus: list[str] = field(default_factory=list)  # bus ids / gpu names with MIG enabled
    sources: dict[str, str] = field(default_factory=dict)
    #: /proc/modules, /proc/devices or VERSION_FILE that could not be read -> why ("missing", "denied", …)
    unread: dict[str, str] = field(default_factory=dict)
    #: NVML_LIBS that are links -> their target (the version is in its name: libnvidia-ml.so.570.158.01)
    nvml_libs: dict[str, str] = field(default_factory=dict)

    @property
    def uvm_major(self) -> int | None:
        return self.devices.char_major("nvidia-uvm")

    @property
    def loaded(self) -> bool:
        return "nvidia" in self.modules or self.version is not None

    def require(self, *paths: str) -> None:
        """Raise FactUnavailable when one of these sources was not read or is malformed: a rule that
        concludes from one (even from an absence in it) cannot be evaluated without it."""
        for p in paths:
            if p in self.unread:
                raise FactUnavailable(f"{p}: {self.unread[p]}")

    def gpu_by_uuid(self, uuid: str) -> Gpu | None:
        for g in self.gpus:
            if g.uuid and g.uuid == uuid:
                return g
        return None

    def gpu_by_minor(self, minor: int) -> Gpu | None:
        for g in self.gpus:
            if g.minor == minor:
                return g
        return None

    def control_nodes(self) -> list[DeviceNode]:
        """What every CUDA container needs besides its GPUs; uvm only when the host has it."""
        out = [DeviceNode("/dev/nvidiactl", 195, NVIDIACTL_MINOR)]
        uvm = self.uvm_major
        if uvm is not None and "/dev/nvidia-uvm" in self.nodes:
            out.append(DeviceNode("/dev/nvidia-uvm", uvm, UVM_MINOR))
            if "/dev/nvidia-uvm-tools" in self.nodes:
                out.append(DeviceNode("/dev/nvidia-uvm-tools", uvm, UVM_TOOLS_MINOR, required=False))
        return out

    def gpu_node(self, minor: int) -> DeviceNode:
        return DeviceNode(f"/dev/nvidia{minor}", 195, minor)


def _gpus(facts: NodeFacts) -> list[Gpu]:
    out = []
    for d in glob(facts.root, "/proc/driver/nvidia/gpus/*"):
        src = f"{d}/information"
        text = facts.read_text(src)
        if text is None:
            continue
        kv = keyvalue.parse(text)
        raw = kv.get("Device Minor", "")
        minor = plausible.digits(raw, GPU_MAX_MINOR) if raw else None
        if raw and minor is None:
            facts.gap(src, f"unreadable: Device Minor {raw[:24]!r} is not a GPU's minor (0 .. {GPU_MAX_MINOR})")
        out.append(Gpu(d.rsplit("/", 1)[-1], minor, kv.get("GPU UUID", ""), kv.get("Model", ""), kv, src))
    return out


#: the control nodes a rule concludes from the absence of: an unlisted one is still asked for
_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def _dev_nodes(facts: NodeFacts) -> dict[str, StatInfo]:
    out: dict[str, StatInfo] = {}
    paths = [p for p in glob(facts.root, "/dev/nvidia*")]
    paths += glob(facts.root, "/dev/nvidia-caps/*")
    paths += [p for p in _CONTROL_NODES if p not in paths]
    for p in paths:
        if why := plausible.device_problem(p):  # a name no NVIDIA driver gives (a manifest's, a hand-made node)
            facts.gap(p, f"unreadable (malformed): {why}")
            continue
        st = facts.root.stat(p)
        if isinstance(st, StatInfo) and st.kind == "chr":
            out[p] = st
        elif isinstance(st, Missing) and st.kind != "missing":  # absent and unknown are not the same
            raise FactUnavailable(f"{p}: unreadable ({st.kind}{': ' + st.detail if st.detail else ''})")
    return out


def _char_links(facts: NodeFacts, majors: set[int]) -> dict[str, str]:
    names = facts.root.listdir("/dev/char")
    if isinstance(names, Missing):
        return {}
    out = {}
    for n in names:
        mj = n.split(":", 1)[0]
        if plausible.decimal(mj) and int(mj) in majors:
            t = facts.root.readlink(f"/dev/char/{n}")
            if isinstance(t, str):
                out[f"/dev/char/{n}"] = t
    return out


def _nvml_libs(facts: NodeFacts) -> dict[str, str]:
    out = {}
    for p in NVML_LIBS:
        t = facts.root.readlink(p)
        if not isinstance(t, str):
            continue
        v = nvidia_version.library_version(t)
        if v is not None and not plausible.driver_version(v):
            facts.gap(p, f"unreadable (malformed): -> {t[:120]!r}: {v[:40]!r} is not an NVIDIA driver version")
            continue
        out[p] = t
    return out


def _malformed(facts: NodeFacts, unread: dict[str, str], path: str, why: str) -> None:
    """A file that was read but that no kernel or driver writes: as unreadable as a missing one."""
    facts.gap(path, f"unreadable (malformed): {why}")
    unread[path] = f"malformed ({why})"


@fact("driver")
def collect_driver(facts: NodeFacts) -> DriverFacts:
    unread: dict[str, str] = {}
    devices_text = facts.read_text("/proc/devices", unread=unread)
    modules_text = facts.read_text("/proc/modules", unread=unread)
    version_text = facts.read_text(VERSION_FILE, unread=unread)
    if devices_text is None and modules_text is None and version_text is None:
        raise FactUnavailable("/proc/devices, /proc/modules and /proc/driver/nvidia/version are all unreadable")
    devices = proc_devices.parse(devices_text or "")
    if devices.problems:
        _malformed(facts, unread, "/proc/devices", "; ".join(devices.problems))
    elif devices_text is not None and not devices.char:
        _malformed(facts, unread, "/proc/devices", "no 'Character devices:' section (truncated or garbage)")
    modules = proc_modules.parse(modules_text or "")
    version = nvidia_version.parse(version_text) if version_text else None
    if version_text and version is None:
        _malformed(facts, unread, VERSION_FILE, "unrecognised format or impossible version")
    captured = facts.maybe("nvidia_smi")
    smi = captured.report if captured is not None else None
    nodes = _dev_nodes(facts)
    majors = set(devices.nvidia_majors().values()) | {195}
    mig = []
    if smi:
        mig = [g.bus_id for g in smi.gpus if g.mig_current.lower() == "enabled"]
    if not mig:
        # the driver exposes per-GPU MIG capability dirs once GPU instances exist
        mig = [p.split("/")[-3] for p in glob(facts.root, "/proc/driver/nvidia/capabilities/gpu*/mig/gi*")]
        mig = sorted(set(mig))
    return DriverFacts(version, devices, modules, _gpus(facts), nodes, _char_links(facts, majors), smi, mig,
                       unread=unread, nvml_libs=_nvml_libs(facts))
