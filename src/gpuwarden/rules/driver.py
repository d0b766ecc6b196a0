"""Driver and host software: the NVIDIA stack below Kubernetes."""

from __future__ import annotations

import re
from typing import Any, Iterator

from gpuwarden import known_versions
from gpuwarden.facts import FactUnavailable, NodeFacts
from gpuwarden.facts.driver import VERSION_FILE, DriverFacts
from gpuwarden.facts.nvidia_smi import SMI_XML
from gpuwarden.facts.xids import gpu_map
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.parsers.nvidia_version import library_version
from gpuwarden.probes.nvml import LIBRARY_NOT_FOUND
from gpuwarden.parsers.plausible import driver_version
from gpuwarden.rules.base import Hit, require_any, rule
from gpuwarden.rules.fmt import line_with
from gpuwarden.rules.held_devices import held_devices
from gpuwarden.rules.logview import events
from gpuwarden.xid import classify, pci_key


@rule(
    "GPU-DRV-006",
    title="NVML hangs (nvmlInit / nvidia-smi does not return)",
    severity=Severity.CRITICAL,
    family="driver",
    needs=("probes",),
    uses=("logs",),
    automation="A2 (cordon; drain; driver reload or reboot)",
    remedy="""
        1. Cordon the node so no new GPU pods land on it; anything that calls NVML (device plugin,
           DCGM, nvidia-smi, kubelet's plugin calls) will block too.
        2. Look for D-state processes (`ps -eo pid,stat,wchan:32,cmd | awk '$2 ~ /D/'`) and NVRM/Xid lines
           in the kernel log; collect `nvidia-bug-report.sh` if it can run.
        3. Recover by draining and rebooting (or reloading the driver when nothing holds it). With MIG on
           driver 570.124.06-570.158.01, upgrade to >= 570.172.08 (see GPU-K8S-001).
    """,
    references=(
        "incident 5 (shared/incidents/5-mig-nvml-hang-kubelet-blocked.zh.md)",
        "NVIDIA/go-nvml#152", "NVIDIA/gpu-operator#1361",
    ),
)
def nvml_hang(facts: NodeFacts) -> Iterator[Hit]:
    """An NVML call that does not return blocks every GPU agent on the node.

    gpuwarden runs nvmlInit and a per-GPU snapshot in a child process with a hard deadline
    (--probe-timeout, default 5 s); a child that does not answer in time is killed. One such
    timeout is gpuwarden's own observation, not the driver's: a loaded node or a slow first
    nvmlInit (persistence mode off, many GPUs) can miss a deadline too. So one timeout is AT-RISK
    (high) and never fences a node. CONFIRMED (critical) only where the hang could not be otherwise:
    the kubelet itself has been waiting `plugin_call_stall_s` (60 s) or more on a device-plugin call
    that reaches NVML (GPU-K8S-001's log evidence, incident 5). The agent confirms it from its own
    history as well: the probe timed out in `probe_timeout_repeat` of the last
    `probe_timeout_window` checks, the latest included (agent/monitors.py). A driver that answers
    with an error is not a hang (other rules read the error).
    """
    probes = facts.get("probes")
    n = probes.nvml
    if n is None:
        return  # no driver directory on this node: no NVML to hang
    if n.status != "timeout":
        v = n.value if isinstance(n.value, dict) else {}
        if n.status == "ok" and v.get("error") != LIBRARY_NOT_FOUND:
            return  # NVML answered (an init error is an answer, read by other rules)
        # gpuwarden's own failure (no child, no library in its container): not checked, never "NVML answers"
        raise FactUnavailable(f"the NVML probe did not ask NVML: {n.detail or v.get('error') or n.status}")
    src = "probe nvml" + (" (recorded)" if probes.recorded else "")
    ev = [Evidence(src, n.detail or "timeout")]
    data: dict[str, Any] = {"elapsed_s": round(n.elapsed_s, 3), "timeouts": 1}
    stalled = _kubelet_plugin_stall(facts)
    if stalled:
        ev += stalled
        yield Hit(
            Status.CONFIRMED,
            f"nvmlInit/NVML queries did not return within {n.elapsed_s:.1f}s (the probe child was killed), and the "
            "kubelet has been waiting on a device-plugin call that reaches NVML for longer than "
            f"{facts.settings.plugin_call_stall_s:g}s: NVML hangs on this node, and anything that calls it hangs "
            "the same way.",
            affected=[Affected("node", "nvml")], evidence=ev,
            data=dict(data, corroborated_by="kubelet device-plugin call stalled"),
        )
        return
    yield Hit(
        Status.AT_RISK,
        f"NVML did not answer within {n.elapsed_s:.1f}s once; not a verdict: a loaded node or a slow first nvmlInit "
        "misses a deadline too. It is confirmed only when the probe keeps timing out (the agent counts it over "
        "its last checks) or the kubelet's own device-plugin call stalls on it.",
        affected=[Affected("node", "nvml", detail="one probe timeout")], evidence=ev,
        severity=Severity.HIGH, mechanism="one probe timeout (gpuwarden's own deadline)", data=data,
    )


def _kubelet_plugin_stall(facts: NodeFacts) -> list[Evidence]:
    """The kubelet's own word that a device-plugin call reaching NVML hangs: a GetPreferredAllocation or
    Allocate call for an NVIDIA resource (or an unnamed one) pending `plugin_call_stall_s` or more."""
    logs = facts.maybe("logs")
    dm = getattr(logs, "devicemanager", None) if logs is not None else None
    if dm is None:
        return []
    out = []
    for c in dm.stalled(float(facts.settings.plugin_call_stall_s)):
        if c.resource and not c.resource.startswith(GPU_RESOURCE_PREFIX):
            continue
        waited = max(c.waited_s or 0.0, c.log_after_s or 0.0)
        out.append(Evidence(c.event.evidence().source,
                            f"{c.event.evidence().text} (the kubelet waited {waited:.0f}s with no answer)"))
    return out[-MAX_QUOTED:]


# ---------------------------------------------------------------------------------------------------
# GPU-DRV-001 … 005, 007 (catalog §4). Each reads what it can; the shared helpers are below.

GPU_RESOURCE_PREFIX = "nvidia.com/"
MAX_QUOTED = 4


def _nvml_probe_error(facts: NodeFacts) -> tuple[str, str] | None:
    """(source, text) of an NVML probe that ran and reported an init error."""
    probes = facts.maybe("probes")
    n = getattr(probes, "nvml", None) if probes is not None else None
    if n is None:
        return None
    v = getattr(n, "value", None)
    src = "probe nvml" + (" (recorded)" if getattr(probes, "recorded", False) else "")
    if isinstance(v, dict) and v.get("init") == "error":
        return src, str(v.get("error", ""))
    if getattr(n, "status", "") == "error" and getattr(n, "detail", ""):
        return src, str(n.detail)
    return None


def _gpu_node_evidence(facts: NodeFacts) -> list[Evidence]:
    """Why this is a GPU node, from sources that do not need the driver."""
    ev: list[Evidence] = []
    kub = facts.maybe("kubelet")
    cp = kub.checkpoint if kub is not None else None
    if cp is not None:
        res = sorted({r for r in cp.registered if r.startswith(GPU_RESOURCE_PREFIX)}
                     | {e.resource for e in cp.entries if e.resource.startswith(GPU_RESOURCE_PREFIX)})
        if res:
            ev.append(Evidence(kub.checkpoint_path, "device-manager checkpoint has " + ", ".join(res)))
    pci = facts.maybe("pci")
    if pci is not None and pci.gpus():
        ev.append(Evidence("/sys/bus/pci/devices", "NVIDIA GPU function(s) on the PCI bus: "
                           + ", ".join(f"{f.bdf} ({f.pci_class}, driver {f.driver or 'none'})" for f in pci.gpus()[:4])))
    logs = facts.maybe("logs")
    if logs is not None and logs.kernel is not None:
        enum = [e for e in logs.kernel.of("kernel.pci-nvidia") if e.get("class", "").startswith(("0300", "0302"))]
        if enum:
            ev.append(enum[0].evidence())
    return ev


@rule(
    "GPU-DRV-001",
    title="NVIDIA kernel module not loaded on a GPU node",
    severity=Severity.CRITICAL,
    family="driver",
    needs=("driver",),
    uses=("boot", "kubelet", "logs", "pci"),
    automation="A2 (cordon) + A3 (rebuild / reinstall the module, reboot)",
    remedy="""
        1. Cordon the node: no GPU pod can run on it.
        2. `modprobe nvidia` and read the error: `Key was rejected by service` (Secure Boot: sign the module or
           enrol the key), `Module nvidia not found` (kernel upgraded without a rebuild: `dkms status`,
           reinstall the driver for `uname -r`), nouveau bound to the GPU (blacklist nouveau, rebuild the
           initramfs). With the GPU Operator, look at the driver pod's log instead.
        3. Reboot after the fix and check `nvidia-smi`.
    """,
    references=("NVIDIA/nvidia-docker#291", "NVIDIA/nvidia-container-toolkit#1611", "NVIDIA/gpu-operator#751",
                "catalog GPU-DRV-001 (../shared/knowledge/signatures.md §4)"),
)
def module_not_loaded(facts: NodeFacts) -> Iterator[Hit]:
    """A node with NVIDIA GPUs whose kernel has no NVIDIA driver loaded: nothing GPU works.

    A GPU node is recognised without the driver: nvidia.com/* resources in the kubelet's device
    manager checkpoint, NVIDIA GPU functions on the PCI bus (sysfs), or NVIDIA GPUs enumerated in
    the kernel log. The driver is not loaded when /proc/modules (read) has no `nvidia` module and
    /proc/driver/nvidia/version does not exist.

    CONFIRMED (critical): both. Quoted as well: nouveau loaded, and "driver not loaded" errors of
    the NVIDIA hook / NVML in the logs. AT-RISK (high): both, while /proc/devices lists the NVIDIA
    majors the module registers at load: the files contradict each other (a copy taken across a
    reload, or a tampered one), so the finding says so and is not confirmed.
    """
    driver = facts.get("driver")
    if "/proc/modules" in driver.unread:
        raise FactUnavailable(f"/proc/modules: {driver.unread['/proc/modules']}")
    names = set(driver.modules)
    if "nvidia" in names or VERSION_FILE not in driver.unread:
        return
    if driver.unread[VERSION_FILE] not in ("missing",):
        return  # unreadable (denied, not captured): cannot say it is absent
    gpu_ev = _gpu_node_evidence(facts)
    if not gpu_ev:
        return  # not a GPU node, as far as can be told
    ev = gpu_ev + [Evidence("/proc/modules", f"no nvidia module among {len(names)} loaded modules"),
                   Evidence(VERSION_FILE, "does not exist")]
    if "nouveau" in names:
        ev.append(Evidence("/proc/modules", "nouveau is loaded (it claims the GPU; blacklist it)"))
    for e in events(facts, "runtime.container-cli-error", "nvml.error", contains="not loaded")[-MAX_QUOTED:]:
        ev.append(e.evidence())
    registered = driver.devices.nvidia_majors()
    if registered:  # a module that is not loaded has no major: the two files cannot both be true
        ev.append(Evidence("/proc/devices", ", ".join(f"{m} {n}" for n, m in sorted(registered.items(), key=lambda x: x[1]))
                           + " registered (contradicts /proc/modules)"))
        yield Hit(Status.AT_RISK, "This GPU node's /proc/modules has no nvidia module and its driver version file is "
                                  "absent, but /proc/devices lists the NVIDIA majors the module registers: the files "
                                  "contradict each other, so this is not confirmed; read them on the node again.",
                  affected=[Affected("node", "nvidia driver", detail="module state unclear")], evidence=ev,
                  severity=Severity.HIGH, mechanism="contradicting sources",
                  data={"nouveau": "nouveau" in names, "contradiction": True})
        return
    yield Hit(
        Status.CONFIRMED,
        "This is a GPU node but the NVIDIA kernel module is not loaded: nvidia-smi, the device plugin and "
        "every GPU container fail (\"couldn't communicate with the NVIDIA driver\", NVML \"Driver Not Loaded\").",
        affected=[Affected("node", "nvidia driver", detail="module not loaded")], evidence=ev,
        data={"nouveau": "nouveau" in names},
    )


def _lib_versions(driver: DriverFacts) -> list[tuple[str, str, str]]:
    """(path, link target, version) of the user-space NVML libraries found."""
    out = []
    for p, t in driver.nvml_libs.items():
        v = library_version(t)
        if v is not None and driver_version(v):
            out.append((p, t, v))
    return out


@rule(
    "GPU-DRV-002",
    title="NVIDIA driver/library version mismatch (user-space upgraded, old kernel module still loaded)",
    severity=Severity.HIGH,
    family="driver",
    needs=(),
    uses=("boot", "driver", "logs", "nvidia_smi", "probes"),
    automation="A2 (drain, reboot or reload the modules)",
    remedy="""
        1. Drain the node, then reboot it (or, with no GPU user left, unload and reload the modules:
           `rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia && modprobe nvidia`).
        2. Stop it recurring: hold the driver packages (`apt-mark hold 'nvidia-*' 'libnvidia-*'`, or exclude them
           from unattended upgrades / dnf-automatic) and upgrade the driver only with a reboot.
    """,
    references=("catalog GPU-DRV-002 (../shared/knowledge/signatures.md §4)", "lyulyul/shine-cluster#30",
                "stackhpc/ansible-slurm-appliance#287", "canonical/ubuntu-server-documentation#369"),
)
def version_mismatch(facts: NodeFacts) -> Iterator[Hit]:
    """NVML refuses to work when its user-space library and the loaded kernel module differ.

    Typical after an unattended upgrade of the driver packages without a reboot: the new
    libnvidia-ml.so talks to the old module. Every NVML user fails with "Failed to initialize
    NVML: Driver/library version mismatch": nvidia-smi, the device plugin, the NVIDIA hook
    (`nvidia-container-cli: initialization error: nvml error: driver/library version mismatch`).

    CONFIRMED (high), from any of: that message in the containerd / NVIDIA pod / kubelet logs of
    the current boot, or in the captured nvidia-smi output; the live NVML probe failing with it;
    the kernel's "NVRM: API mismatch: the client has the version X" line; the version in the
    libnvidia-ml.so.1 link target (host or /run/nvidia/driver) differing from
    /proc/driver/nvidia/version; nvidia-smi's or NVML's driver_version differing from it.
    """
    require_any(facts, ("driver", "logs", "probes"))
    driver = facts.maybe("driver")
    module = driver.version.version if driver is not None and driver.version else None
    ev: list[Evidence] = []
    for e in events(facts, "nvml.error", "runtime.container-cli-error", contains="version mismatch")[-MAX_QUOTED:]:
        ev.append(e.evidence())
    smi = facts.maybe("nvidia_smi")
    line = line_with(smi.text, "ersion mismatch") if smi is not None else ""
    if line:
        ev.append(Evidence(SMI_XML, line))
    perr = _nvml_probe_error(facts)
    if perr and "mismatch" in perr[1].lower():
        ev.append(Evidence(*perr))
    for e in events(facts, "kernel.api-mismatch")[-MAX_QUOTED:]:
        ev.append(e.evidence())
    if module:
        for path, target, v in _lib_versions(driver):
            if v != module:
                ev.append(Evidence(path, f"-> {target} (library {v}; loaded module {module})"))
        smi_v = driver.smi.driver_version if driver.smi else ""
        if smi_v and smi_v != module:
            ev.append(Evidence(SMI_XML, f"<driver_version>{smi_v}</driver_version> while the module is {module}"))
        probes = facts.maybe("probes")
        pv = getattr(getattr(probes, "nvml", None), "value", None)
        if isinstance(pv, dict) and driver_version(str(pv.get("driver_version") or "")) and pv["driver_version"] != module:
            ev.append(Evidence("probe nvml", f"driver_version {pv['driver_version']} while the module is {module}"))
    if not ev:
        return
    if driver is not None and driver.version:
        ev.append(Evidence(VERSION_FILE, driver.version.line))
    yield Hit(
        Status.CONFIRMED,
        "The NVIDIA user-space libraries and the loaded kernel module are different versions: NVML fails "
        "('Driver/library version mismatch'), so nvidia-smi, the device plugin and new GPU containers fail.",
        affected=[Affected("node", "nvidia driver", detail=f"module {module or 'unknown'}")], evidence=ev,
        data={"module_version": module},
    )


def _gpu_workloads(facts: NodeFacts) -> list[Evidence]:
    kub = facts.maybe("kubelet")
    cp = kub.checkpoint if kub is not None else None
    if cp is None:
        return []
    gpu = [e for e in cp.entries if e.resource.startswith(GPU_RESOURCE_PREFIX)]
    if not gpu:
        return []
    return [Evidence(kub.checkpoint_path, f"{len(gpu)} container(s) hold {gpu[0].resource} (e.g. pod {gpu[0].pod_uid} "
                                          f"container {gpu[0].container})")]


@rule(
    "GPU-DRV-003",
    title="nvidia-uvm not loaded, or the host's /dev/nvidia-uvm missing",
    severity=Severity.HIGH,
    family="driver",
    needs=("driver",),
    uses=("kubelet",),
    automation="A1 (nvidia-modprobe -u -c=0)",
    remedy="""
        1. `nvidia-modprobe -u -c=0`: loads nvidia-uvm and creates /dev/nvidia-uvm and /dev/nvidia-uvm-tools.
        2. Make it permanent: a unit that runs it at boot before containerd and kubelet, or the udev rule from
           k8s-device-plugin#222 / the driver package; with the GPU Operator the driver container does it.
        3. Then check GPU-DEV-001: a device plugin started before the node existed must be restarted.
    """,
    references=("NVIDIA/nvidia-docker#106", "NVIDIA/nvidia-docker#396", "NVIDIA/nvidia-docker#481",
                "NVIDIA/k8s-device-plugin#222", "NVlabs/nvbio-gpl#7"),
)
def uvm_not_loaded(facts: NodeFacts) -> Iterator[Hit]:
    """CUDA needs the nvidia-uvm module and its /dev node; nvidia-smi (NVML) does not.

    The module is loaded on demand (nvidia-modprobe, or the NVIDIA container hook when it starts a
    GPU container, unless told not to load modules; CDI mode does not load modules [inferred from
    the toolkit's design]) and its device node is created by nvidia-modprobe or udev. Without
    them, CUDA fails with "unknown error" (30, or 999 on CUDA >= 10.1) while nvidia-smi works.

    Reads /proc/devices (`nvidia-uvm` major) and the host's /dev (captured stats, only when /dev
    was captured at all: /dev/nvidiactl or a GPU node is present).

    CONFIRMED (high): no nvidia-uvm in /proc/devices, or /dev/nvidia-uvm absent, while GPU
    containers exist (the kubelet checkpoint assigns nvidia.com/* devices).
    AT-RISK (medium): the same with no GPU container yet: the first CUDA job will fail unless the
    hook loads the module for it; or /proc/modules lists nvidia_uvm Live while /proc/devices has
    no nvidia-uvm (a live module has registered its major: the two files contradict each other,
    so the finding says so and is not confirmed). Not evaluated when /proc/devices is missing,
    unreadable or malformed (no kernel writes it that way).
    """
    driver = facts.get("driver")
    if not driver.loaded:
        return
    driver.require("/proc/devices")
    if "/dev/nvidiactl" not in driver.nodes and not any(re.fullmatch(r"/dev/nvidia[0-9]+", p) for p in driver.nodes):
        return  # /dev was not captured: absence of the uvm node proves nothing
    ev: list[Evidence] = []
    contradiction = ""
    if driver.uvm_major is None:
        what = "the nvidia-uvm module is not loaded"
        ev.append(Evidence("/proc/devices", "no nvidia-uvm entry (majors: "
                           + ", ".join(f"{n} {m}" for n, m in sorted(driver.devices.nvidia_majors().items())) + ")"))
        uvm_module = driver.modules.get("nvidia_uvm")
        if uvm_module is not None and uvm_module.state == "Live":
            contradiction = ("/proc/modules lists nvidia_uvm as Live, which registers its major in /proc/devices: "
                             "the two files contradict each other, so this is not confirmed")
            ev.append(Evidence("/proc/modules", f"nvidia_uvm {uvm_module.size} {uvm_module.refcount} Live "
                                                "(contradicts /proc/devices)"))
        elif "nvidia_uvm" not in driver.modules and driver.modules:
            ev.append(Evidence("/proc/modules", "no nvidia_uvm module"))
    elif "/dev/nvidia-uvm" not in driver.nodes:
        what = "nvidia-uvm is loaded but the host has no /dev/nvidia-uvm node"
        ev.append(Evidence("/proc/devices", f"{driver.uvm_major} nvidia-uvm"))
        ev.append(Evidence("/dev", "no nvidia-uvm node (present: " + ", ".join(sorted(driver.nodes)[:6]) + ")"))
    else:
        return
    work = _gpu_workloads(facts)
    if contradiction:
        yield Hit(Status.AT_RISK, f"On this node {what} by /proc/devices, but {contradiction}: CUDA in GPU containers "
                                  "may fail with 'unknown error'; read both files on the node again.",
                  affected=[Affected("node", "nvidia-uvm")], evidence=ev + work, severity=Severity.MEDIUM,
                  mechanism="contradicting sources", data={"uvm_major": None, "contradiction": True})
    elif work:
        yield Hit(Status.CONFIRMED, f"On this node {what}: CUDA in GPU containers fails with 'unknown error' "
                                    "(30/999) while nvidia-smi works.",
                  affected=[Affected("node", "nvidia-uvm")], evidence=ev + work, data={"uvm_major": driver.uvm_major})
    else:
        yield Hit(Status.AT_RISK, f"On this node {what}: the first CUDA job will fail with 'unknown error' unless "
                                  "something loads the module and creates the node first.",
                  affected=[Affected("node", "nvidia-uvm")], evidence=ev, severity=Severity.MEDIUM,
                  data={"uvm_major": driver.uvm_major})


@rule(
    "GPU-DRV-004",
    title="GPU persistence mode off and nvidia-persistenced not running",
    severity=Severity.MEDIUM,
    family="driver",
    needs=(),
    uses=("boot", "driver", "logs", "probes", "processes"),
    automation="A1 (systemctl enable --now nvidia-persistenced)",
    remedy="""
        Run nvidia-persistenced: `systemctl enable --now nvidia-persistenced` (the driver package ships the unit;
        the GPU Operator driver container runs it). `nvidia-smi -pm 1` also works but is deprecated (the driver
        says so in the kernel log) and does not survive a reboot.
    """,
    references=("NVIDIA/nvidia-container-toolkit#202", "NVIDIA/nvidia-docker#723", "NVIDIA/nvidia-docker#1657",
                "NVIDIA/k8s-device-plugin#248", "NVIDIA/k8s-device-plugin#416", "Azure/aks-gpu#105"),
)
def persistence_off(facts: NodeFacts) -> Iterator[Hit]:
    """Without persistence the driver tears a GPU down when its last user exits and sets it up
    again on the next open: slow nvidia-smi, and container starts that time out.

    Reads persistence_mode per GPU from `nvidia-smi -q -x` or the NVML probe, and looks for an
    nvidia-persistenced process (which keeps persistence on) among the captured processes.

    CONFIRMED (medium): persistence Disabled and the NVIDIA hook timed out talking to the driver
    in the current boot (`nvidia-container-cli: initialization error: driver rpc error: timed out`).
    AT-RISK (low): persistence Disabled on some GPU and no nvidia-persistenced process.
    """
    require_any(facts, ("driver", "probes"))
    off: list[Evidence] = []
    for g in (facts.get("driver").smi.gpus if facts.maybe("driver") and facts.get("driver").smi else []):
        if g.persistence_mode.strip().lower() in ("disabled", "off"):
            off.append(Evidence(SMI_XML, f"gpu {g.bus_id}: <persistence_mode>{g.persistence_mode}</persistence_mode>"))
    probes = facts.maybe("probes")
    pv = getattr(getattr(probes, "nvml", None), "value", None)
    if not off and isinstance(pv, dict):
        for g in pv.get("gpus") or []:
            if isinstance(g, dict) and g.get("persistence_mode") == 0:
                off.append(Evidence("probe nvml", f"gpu {g.get('bus_id')}: persistence mode 0 (disabled)"))
    if not off:
        return
    procs = facts.maybe("processes")
    if procs is not None and procs.by_name("nvidia-persistenced"):
        return  # running (e.g. with --no-persistence-mode): it keeps the driver state itself
    proc_ev = ([Evidence("/proc", f"no nvidia-persistenced among {len(procs.procs)} processes")]
               if procs is not None and procs.procs else [])
    timeouts = [e for e in events(facts, "runtime.container-cli-error") if "timed out" in e.line]
    if timeouts:
        yield Hit(Status.CONFIRMED, f"Persistence mode is off on {len(off)} GPU(s) and GPU containers fail to start "
                                    "because the driver times out initialising the GPU.",
                  affected=[Affected("node", "nvidia-persistenced", detail="not running")],
                  evidence=off[:MAX_QUOTED] + proc_ev + [e.evidence() for e in timeouts[-MAX_QUOTED:]],
                  data={"gpus_off": len(off)})
        return
    yield Hit(Status.AT_RISK, f"Persistence mode is off on {len(off)} GPU(s)"
                              + (" and nvidia-persistenced is not running" if proc_ev else "")
                              + ": every first open re-initialises the GPU (slow nvidia-smi, container-start timeouts).",
              affected=[Affected("node", "nvidia-persistenced", detail="not running")],
              evidence=off[:MAX_QUOTED] + proc_ev, severity=Severity.LOW, data={"gpus_off": len(off)})


GSP_ISSUE = "nvidia-driver-525-gsp-rpc-timeout"
GSP_REMEDY = """
1. Drain the GPU and reset it (`nvidia-smi -r -i <bus id>`) or power-cycle the node (a warm reboot may
   hit "WPR2 already up").
2. Firmware missing: install the firmware package of the loaded driver version
   (/lib/firmware/nvidia/<version>/gsp_*.bin, e.g. nvidia-firmware-<branch>-<version>); it must match the
   module exactly.
3. Recurring Xid 119 on 525 before 525.105.17: upgrade the driver. Proprietary (not open) module on
   pre-Hopper GPUs only: `NVreg_EnableGpuFirmware=0` turns GSP off.
4. Not initialised (RmInitAdapter failed) again after a power cycle: check the GPU's PCIe link and power
   (GPU-HW-006, `lspci -vv`), reseat it, then RMA; a reset-required assertion that recurs: collect
   `nvidia-bug-report.sh` and report it to NVIDIA.
"""


@rule(
    "GPU-DRV-005",
    title="GPU not usable: not initialised, reset required, or GSP firmware failure (Xid 119/120, RmInitAdapter)",
    severity=Severity.HIGH,
    family="driver",
    needs=(),
    uses=("boot", "containers", "driver", "kubelet", "logs", "xids"),
    automation="A2 (drain, GPU reset or power cycle) + A3 (firmware / driver fix)",
    remedy=GSP_REMEDY,
    references=("NVIDIA/open-gpu-kernel-modules#446", "NVIDIA/open-gpu-kernel-modules#1230",
                "NVIDIA/open-gpu-kernel-modules#789", "NVIDIA/open-gpu-kernel-modules#943",
                "NVIDIA/open-gpu-kernel-modules#829", "Azure/azurehpc#714", "ublue-os/bazzite#2668"),
)
def gsp_failure(facts: NodeFacts) -> Iterator[Hit]:
    """A GPU the driver cannot use: it was never initialised, it needs a reset, or its GPU System
    Processor (GSP, which runs the driver's resource manager on the GPU: Turing and later, always on
    Hopper/Blackwell with the open module) stopped answering or could not boot. Work on that GPU
    fails until it is reset (or the node rebooted, or the firmware fixed).

    Reads the kernel log of the current boot, per GPU where the line names one:
    - not initialised: `NVRM: GPU 0000:…: RmInitAdapter failed! (0x24:0x72:1568)` (with
      `rm_init_adapter failed, device minor number 5`); worded as a GSP failure only when a GSP
      line accompanies it;
    - reset required: the driver's assertion `Assertion failed: Reset required
      [NV_ERR_RESET_REQUIRED] (0x00000062) returned from …` (CUDA then reports the device busy or
      unavailable). The line names the driver's GPU instance (`GPU0`) or nothing, not a bus id: it is
      tied to the GPU only on a node with one GPU;
    - GSP: Xid 119 (`Timeout after 6s of waiting for RPC response from GPU1 GSP! …`) and 120 (GSP
      error), `RmInitAdapter: Cannot initialize GSP firmware RM`, `RmFetchGspRmImages: No firmware
      image found`, `_kgspBootGspRm: unexpected WPR2 already up`, and `Direct firmware load for
      nvidia/<version>/gsp_*.bin failed with error -2`.

    CONFIRMED (high): any of them, per GPU, with the device IDs of the kubelet's checkpoint that are
    the GPU's (replicas, MIG slices where their parent is established) and the pods holding them.
    The driver version is checked against the known 525 GSP RPC
    timeout range (data/known_versions.yaml).
    """
    avail = require_any(facts, ("xids", "logs"))
    xf = avail.get("xids")
    gpus = xf.gpus if xf is not None else gpu_map(facts)
    found: dict[str, list[Evidence]] = {}
    kinds: dict[str, set[str]] = {}
    xids: dict[str, set[int]] = {}

    def note(k: str, kind: str, ev: Evidence) -> None:
        found.setdefault(k, []).append(ev)
        kinds.setdefault(k, set()).add(kind)

    for e in (xf.current() if xf is not None else []):
        if e.info.rule == "GPU-DRV-005":
            note(e.key or "unknown", "gsp", e.event.evidence())
            xids.setdefault(e.key or "unknown", set()).add(e.xid)
    for e in events(facts, "kernel.rminitadapter-failed", "kernel.gsp-boot-failed", "kernel.gsp-firmware-missing"):
        kind = "init" if e.sig == "kernel.rminitadapter-failed" and not e.get("reason") else "gsp"
        note(pci_key(e.get("device")) or "node", kind, e.evidence())
    for e in events(facts, "kernel.reset-required"):
        k = pci_key(e.get("device")) or (next(iter(gpus)) if len(gpus) == 1 else "node")
        note(k, "reset", e.evidence())
    if not found:
        return
    driver = facts.maybe("driver")
    version = driver.version.version if driver is not None and driver.version else None
    m = known_versions.get(GSP_ISSUE).check(version) if version else None
    for k, ev in sorted(found.items()):
        ev = ev[-MAX_QUOTED * 2:]
        for x in sorted(xids.get(k, ())):
            info = classify(x)
            ev.append(Evidence("data/xid.yaml", f"Xid {x} {info.name}: {info.meaning}; NVIDIA action {info.action.name}"))
        remedy = None
        if m is not None and m.affected:
            ev.append(Evidence(VERSION_FILE, f"driver {version} is in {m.range.range if m.range else 'the affected range'} "
                                             f"of {GSP_ISSUE}; fixed in {m.fix}"))
            remedy = gsp_failure_remedy(version, m.fix)
        ref = gpus.get(k)
        who = ref.affected() if ref is not None else (Affected("gpu", k) if k != "node" else Affected("node", "gpu"))
        held = held_devices(facts, ref) if ref is not None else None
        what = (f"GPU {ref.bus_id if ref else k}" + (held.phrase() if held else "")) if k != "node" \
            else "A GPU of this node (the line names no bus id)"
        yield Hit(Status.CONFIRMED, what + " " + _unusable(kinds[k], sorted(xids.get(k, ())))
                  + ": it is not usable until it is reset (or the node rebooted).",
                  affected=[who, *(held.affected if held else ())], evidence=ev + list(held.evidence if held else ()),
                  remedy=remedy,
                  data={"gpu": k, "xids": sorted(xids.get(k, ())), "kinds": sorted(kinds[k]),
                        "held": held.data() if held else None})


def _unusable(kinds: set[str], xids: list[int]) -> str:
    """Why the GPU is unusable, in the words its lines support (GSP only where a GSP line says so)."""
    parts = []
    if "init" in kinds:
        parts.append("was not initialised by the driver (RmInitAdapter failed)")
    if "reset" in kinds:
        parts.append("needs a reset (the driver asserts NV_ERR_RESET_REQUIRED)")
    if "gsp" in kinds:
        parts.append("failed in its GSP firmware" + (f" (Xid {', '.join(map(str, xids))})" if xids else ""))
    return " and ".join(parts) + " in this boot"


def gsp_failure_remedy(version: str | None, fix: Any) -> str:
    return GSP_REMEDY.strip() + (f"\nThis node runs driver {version}: {known_versions.get(GSP_ISSUE).summary} "
                                 f"Upgrade to {fix} or later.")


FM_PROCESS = "nv-fabricmanager"


@rule(
    "GPU-DRV-007",
    title="Fabric Manager not running or fabric not initialised on an NVSwitch system (CUDA error 802)",
    severity=Severity.CRITICAL,
    family="driver",
    needs=(),
    uses=("boot", "driver", "logs", "pci", "processes", "xids"),
    automation="A2 (restart Fabric Manager; drain)",
    remedy="""
        1. `systemctl status nvidia-fabricmanager` (GPU Operator: the driver pod's nvidia-fabricmanager container)
           and its log /var/log/fabricmanager.log: "fabric manager NVIDIA GPU driver interface version X don't
           match with driver version Y" means the Fabric Manager package must match the driver exactly.
        2. Install / start Fabric Manager of the driver's exact version: `systemctl enable --now
           nvidia-fabricmanager`; on NVLink5 (B200/GB200) load ib_umad / mlx5_ib first (gpu-operator#2781).
        3. `nvidia-smi -q | grep -A2 Fabric` must show State Completed, Status Success before GPU pods run.
    """,
    references=("NVIDIA/gpu-operator#356", "NVIDIA/gpu-operator#544", "NVIDIA/gpu-operator#1595",
                "NVIDIA/gpu-operator#2781", "NVIDIA/gpu-driver-container#735", "NVIDIA/k8s-device-plugin#416",
                "pytorch/pytorch#35710"),
)
def fabric_manager(facts: NodeFacts) -> Iterator[Hit]:
    """On NVSwitch systems (HGX A100/H100/H200/B200) CUDA cannot start until Fabric Manager has
    programmed the NVSwitch fabric: `cudaErrorSystemNotReady` (802, "system not yet initialized")
    while `nvidia-smi -L` works.

    NVSwitch present: /dev/nvidia-nvswitch<N> device nodes, NVIDIA bridge functions (class 0x0680)
    in sysfs, a GPU fabric state in `nvidia-smi -q -x` other than N/A, or NVSwitch SXid lines in
    the kernel log (GPU-HW-008 reports the errors themselves). (The `nvidia-nvswitch`
    major in /proc/devices is not enough: the driver registers it on every system, the H200 capture
    included.)

    CONFIRMED (critical): NVSwitch present and the GPU fabric state is not Completed or its status
    not Success, or CUDA "system not yet initialized" appears in containerd / NVIDIA pod logs of
    the current boot.
    AT-RISK (high): NVSwitch present, no nv-fabricmanager process among the captured processes,
    and no fabric state to confirm the failure; or Fabric Manager runs and the fabric is still
    "In Progress" (it takes a while after boot) with no CUDA 802 error yet.
    """
    avail = require_any(facts, ("driver", "pci", "logs"))
    driver = avail.get("driver")
    pci = avail.get("pci")
    switch_ev: list[Evidence] = []
    nodes = sorted(p for p in (driver.nodes if driver is not None else {}) if re.fullmatch(r"/dev/nvidia-nvswitch[0-9]+", p))
    if nodes:
        switch_ev.append(Evidence("/dev", f"{len(nodes)} NVSwitch device node(s): {', '.join(nodes[:4])}"))
    if pci is not None and pci.nvswitches():
        switch_ev.append(Evidence("/sys/bus/pci/devices", f"{len(pci.nvswitches())} NVIDIA bridge function(s) "
                                  f"(NVSwitch): {', '.join(f.bdf for f in pci.nvswitches()[:4])}"))
    bad: list[Evidence] = []
    states: list[str] = []
    for g in (driver.smi.gpus if driver is not None and driver.smi else []):
        st, status = g.fields.get("fabric_state", ""), g.fields.get("fabric_status", "")
        if st and st.upper() != "N/A":
            states.append(st)
            if st.strip().lower() != "completed" or (status and status.upper() != "N/A"
                                                     and status.strip().lower() != "success"):
                bad.append(Evidence(SMI_XML, f"gpu {g.bus_id}: fabric state {st!r}, status {status!r} "
                                             "(healthy: Completed / Success)"))
    if states and not switch_ev:
        switch_ev.append(Evidence(SMI_XML, f"GPU fabric state reported ({states[0]}): NVLink fabric present"))
    xf = facts.maybe("xids")
    if xf is not None and xf.sxids:
        last = xf.sxids[-1]
        switch_ev.append(Evidence(last.event.source, f"{len(xf.sxids)} NVSwitch SXid line(s) (GPU-HW-008), the "
                                                     f"latest: {last.event.line}"))
    if not switch_ev:
        return
    not_ready = events(facts, "cuda.system-not-ready")
    procs = facts.maybe("processes")
    fm = procs.by_name(FM_PROCESS) if procs is not None else []
    proc_ev = ([Evidence("/proc", f"no {FM_PROCESS} process among {len(procs.procs)} processes")]
               if procs is not None and procs.procs and not fm else [])
    if bad and not not_ready and fm and all(b.text and "'in progress'" in b.text.lower() for b in bad):
        yield Hit(Status.AT_RISK, "Fabric Manager runs but the NVSwitch fabric is still being set up ('In Progress'): "
                                  "CUDA fails with error 802 until it completes.",
                  affected=[Affected("node", "nvidia-fabricmanager", detail="fabric in progress")],
                  evidence=switch_ev + bad[:MAX_QUOTED], severity=Severity.HIGH,
                  data={"fabric_states": states, "fm_running": True})
    elif bad or not_ready:
        yield Hit(Status.CONFIRMED, "The NVSwitch fabric is not initialised: CUDA fails on every GPU with error 802 "
                                    "('system not yet initialized') although nvidia-smi works.",
                  affected=[Affected("node", "nvidia-fabricmanager")],
                  evidence=switch_ev + bad[:MAX_QUOTED] + [e.evidence() for e in not_ready[-MAX_QUOTED:]] + proc_ev,
                  data={"fabric_states": states, "fm_running": bool(fm) if procs is not None else None})
    elif proc_ev and not states:
        yield Hit(Status.AT_RISK, "This is an NVSwitch system and Fabric Manager is not running: CUDA will fail with "
                                  "error 802 once the fabric is needed (and after every driver reload).",
                  affected=[Affected("node", "nvidia-fabricmanager", detail="not running")],
                  evidence=switch_ev + proc_ev, severity=Severity.HIGH, data={"fm_running": False})
