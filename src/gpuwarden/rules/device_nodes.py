"""The NVIDIA device nodes themselves: stale majors after a module reload, SELinux denials (GPU-DEV-004/005).

Reads /proc/devices (the majors now), the host's NVIDIA /dev nodes and /dev/char links, CDI specs,
SELinux's mode and AVC denials, and the NVML permission errors in the kubelet, containerd and NVIDIA
pod logs.
"""

from __future__ import annotations

import re
from typing import Iterator

from gpuwarden import known_versions
from gpuwarden.facts import FactUnavailable, NodeFacts
from gpuwarden.facts.cdi import is_claim_spec_name
from gpuwarden.facts.selinux import ENFORCE, SelinuxFacts
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.parsers import lazyre
from gpuwarden.rules.base import Hit, rule
from gpuwarden.rules.logview import events

MAX_QUOTED = 4

# -- GPU-DEV-004 -------------------------------------------------------------------------------------

def expected_major(path: str, majors: dict[str, int]) -> tuple[str, int | None]:
    """(/proc/devices name, major) a NVIDIA device node must have."""
    base = path.rsplit("/", 1)[-1]
    if path.startswith("/dev/nvidia-caps-imex-channels/"):
        name = "nvidia-caps-imex-channels"
    elif path.startswith("/dev/nvidia-caps/"):
        name = "nvidia-caps"
    elif base.startswith("nvidia-uvm"):
        name = "nvidia-uvm"
    elif base.startswith("nvidia-nvswitch"):
        name = "nvidia-nvswitch"
    elif base.startswith("nvidia-nvlink"):
        name = "nvidia-nvlink"
    elif re.fullmatch(r"nvidia([0-9]+|ctl|-modeset)", base):
        return "nvidia", 195
    else:
        return "", None
    return name, majors.get(name)


LIB_VERSION = lazyre.compile(r"/lib(?:cuda|nvidia-[\w-]+|nvcuvid|nvoptix)\.so\.([0-9]{3}\.[0-9]+(?:\.[0-9]+)?)$")


@rule(
    "GPU-DEV-004",
    title="Stale NVIDIA device major: a /dev node, /dev/char link or CDI spec points at an old major or driver",
    severity=Severity.HIGH,
    family="device-access",
    needs=("driver",),
    uses=("dev_char", "cdi"),
    automation="A1 (recreate nodes, links, CDI spec) + A2 (recreate pods)",
    remedy="""
        1. Recreate the device nodes: remove the stale ones and run `nvidia-modprobe -u -c=0` (and `-m` for
           nvidia-modeset; MIG caps: `nvidia-modprobe -f /proc/driver/nvidia-caps/mig-minors`).
        2. Recreate the /dev/char links: `nvidia-ctk system create-dev-char-symlinks --create-all` (toolkit >= 1.12).
        3. Regenerate CDI: `systemctl restart nvidia-cdi-refresh.service`, or
           `nvidia-ctk cdi generate --output=/var/run/cdi/nvidia.yaml` (and /etc/cdi if a spec lives there too).
        4. Recreate the GPU pods created since the driver reload.
    """,
    references=known_versions.references("toolkit-create-dev-char-symlinks")
    + ("NVIDIA/NemoClaw#4733", "NVIDIA/nvidia-container-toolkit#1611", "NVIDIA/nvidia-container-toolkit#1517",
       "NVIDIA/nvidia-container-toolkit#1828", "NVIDIA/nvidia-container-toolkit#450", "NixOS/nixpkgs#285148",
       "NVIDIA/cloud-native-docs PR #83", "NVIDIA/cloud-native-docs PR #203"),
)
def stale_major(facts: NodeFacts) -> Iterator[Hit]:
    """nvidia-uvm, nvidia-caps and nvidia-nvswitch get a dynamic major each time their module loads;
    nodes, /dev/char links and CDI specs made before a module reload keep the old one. Containers
    then get a device rule for a major that no longer exists: nvidia-smi works, CUDA (uvm) or MIG
    (caps) fails; or, after a driver upgrade, the CDI spec mounts libraries of the old version.

    Reads /proc/devices (the majors now), the host's NVIDIA /dev nodes (stat), /dev/char links
    pointing at NVIDIA nodes, and CDI specs in /etc/cdi and /var/run/cdi (`containerEdits.deviceNodes`
    with major/minor, and the version in mounted driver libraries' names, e.g.
    libcuda.so.570.158.01). Only nodes whose name has a /proc/devices entry are checked (a module
    that is not loaded is GPU-DRV-003's).

    CONFIRMED (high): a node's major differs from /proc/devices'; a /dev/char/M:m link whose target
    is missing or has another major:minor; a CDI deviceNode with a stale major; a CDI spec whose
    driver libraries are of another version than the loaded module.
    """
    driver = facts.get("driver")
    driver.require("/proc/devices")
    majors = driver.devices.nvidia_majors()
    if not majors:
        return
    found: dict[str, list[Evidence]] = {}
    for path, st in sorted(driver.nodes.items()):
        name, want = expected_major(path, majors)
        if want is not None and st.major is not None and st.major != want:
            found.setdefault("stale_node", []).append(
                Evidence(path, f"char {st.major}:{st.minor}, but /proc/devices says {want} {name}"))
    for cl in facts.maybe("dev_char") or []:
        link, target, (major, minor) = cl.link, cl.target, cl.target_numbers
        if cl.target_unread:
            if cl.target_unread == "missing":
                found.setdefault("stale_link", []).append(Evidence(link, f"-> {target}, which does not exist"))
            continue
        if cl.numbers and major is not None and cl.numbers != (major, minor):
            found.setdefault("stale_link", []).append(Evidence(link, f"-> {target}, which is char {major}:{minor}"))
    module = driver.version.version if driver.version else None
    specs = facts.maybe("cdi")  # parsed once, a spec with an impossible node read as none (facts.cdi)
    for sf in specs.node_specs() if specs is not None else []:
        if sf.spec is None or is_claim_spec_name(sf.path):
            continue  # a DRA claim's spec: GPU-DRA-011 ties its staleness to the claim and its pods
        versions: set[str] = set()
        for edits in [sf.spec.common, *sf.spec.devices.values()]:
            for dn in edits.device_nodes:
                name, want = expected_major(dn.path, majors)
                if want is not None and dn.major is not None and dn.major != want:
                    found.setdefault("stale_cdi", []).append(
                        Evidence(sf.path, f"deviceNodes {dn.path} major {dn.major}, but /proc/devices says {want} {name}"))
            versions |= {m.group(1) for hp in edits.mount_hosts if (m := LIB_VERSION.search(hp))}
        if module and versions and module not in versions:
            found.setdefault("stale_cdi_libs", []).append(
                Evidence(sf.path, f"mounts driver libraries of version {', '.join(sorted(versions))}; the loaded module is {module}"))
    if not found:
        return
    what = {"stale_node": "device nodes", "stale_link": "/dev/char links", "stale_cdi": "CDI device nodes",
            "stale_cdi_libs": "CDI driver libraries"}
    ev = [e for k in found for e in found[k][:MAX_QUOTED]]
    ev.append(Evidence("/proc/devices", ", ".join(f"{m} {n}" for n, m in sorted(majors.items(), key=lambda x: x[1]))))
    if module and "stale_cdi_libs" in found:
        ev.append(Evidence("/proc/driver/nvidia/version", driver.version.line))
    yield Hit(Status.CONFIRMED, "Stale NVIDIA " + ", ".join(what[k] for k in found)
              + " no longer match the loaded driver: containers get rules for a dead major or old libraries "
                "(CUDA or MIG fails while nvidia-smi works).",
              affected=[Affected("node", "nvidia device nodes")], evidence=ev, mechanism=", ".join(found),
              data={"kinds": sorted(found)})


# -- GPU-DEV-005 -------------------------------------------------------------------------------------

@rule(
    "GPU-DEV-005",
    title="NVML 'Insufficient Permissions' in containers (SELinux denies the NVIDIA device nodes)",
    severity=Severity.MEDIUM,
    family="device-access",
    needs=(),
    uses=("boot", "logs", "selinux"),
    automation="A3",
    remedy="""
        Let containers use the NVIDIA devices under SELinux: install the NVIDIA / container-selinux policy for GPU
        devices (the GPU Operator's and RHEL's guides), or label the device nodes for container access; for a single
        workload `--security-opt=label=disable` / `seLinuxOptions.type: spc_t` disables separation (a security
        trade-off). Check `ausearch -m AVC -ts recent | grep nvidia`.
    """,
    references=("NVIDIA/cloud-native-docs container-toolkit/troubleshooting.md",
                "catalog GPU-DEV-005 (../shared/knowledge/signatures.md §2)"),
)
def selinux_denied(facts: NodeFacts) -> Iterator[Hit]:
    """On SELinux-enforcing hosts, a container's process may be denied the NVIDIA device nodes by
    policy even though its device cgroup allows them: `Failed to initialize NVML: Insufficient
    Permissions`.

    Reads "Insufficient Permissions" NVML errors (and the NVIDIA hook's "nvml error: insufficient
    permissions") in kubelet, containerd and NVIDIA pod logs (current boot),
    /sys/fs/selinux/enforce, and AVC denials on nvidia* nodes in /var/log/audit/audit.log when it
    can be read (`collect` does not capture the audit log: it can hold secrets; a bundle may carry
    an excerpt as /.gpuwarden/logs/audit.log).

    CONFIRMED (medium): AVC denials on nvidia* device nodes; or the NVML error while SELinux is
    enforcing.
    AT-RISK (low): the NVML error while SELinux is not enforcing or unknown (other causes:
    device-node modes, NVreg_DeviceFileMode/UID/GID).
    """
    perm = events(facts, "nvml.error", "runtime.container-cli-error", logs=("kubelet", "containerd", "pod"))
    perm = [e for e in perm if "insufficient permissions" in e.line.lower()]
    sel: SelinuxFacts | None = facts.maybe("selinux")
    avc = [e.evidence() for e in sel.denials[-MAX_QUOTED:]] if sel is not None else []
    enforce = sel.enforce if sel is not None else None
    if not perm and not avc:
        if facts.maybe("logs") is None and enforce is None:
            raise FactUnavailable("no logs, no audit log and no /sys/fs/selinux/enforce")
        return
    ev = [e.evidence() for e in perm[-MAX_QUOTED:]] + avc
    if enforce is not None:
        ev.append(Evidence(ENFORCE, enforce.strip()))
    enforcing = enforce is not None and enforce.strip() == "1"
    if avc or enforcing:
        yield Hit(Status.CONFIRMED, "SELinux denies containers the NVIDIA device nodes: NVML fails with 'Insufficient "
                                    "Permissions' although the device cgroup allows them.",
                  affected=[Affected("node", "selinux", detail="enforcing" if enforcing else "")], evidence=ev,
                  data={"enforcing": enforcing, "avc": len(avc)})
    else:
        yield Hit(Status.AT_RISK, "NVML reports 'Insufficient Permissions' in a container; SELinux is not enforcing (or "
                                  "unknown), so check the device nodes' modes and the driver's NVreg_DeviceFile* settings.",
                  affected=[Affected("node", "nvidia device nodes")], evidence=ev, severity=Severity.LOW,
                  data={"enforcing": enforcing})
