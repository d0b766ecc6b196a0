"""Container device access: GPU devices missing from, or dropped out of, a container's device cgroup."""

from __future__ import annotations

from typing import Iterator

from gpuwarden import known_versions
from gpuwarden.facts import NodeFacts
from gpuwarden.facts.cdi import CdiFacts
from gpuwarden.facts.driver import DriverFacts
from gpuwarden.facts.gpu_access import ContainerAccess, GpuAccessFacts
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.parsers.wallclock import format_rfc3339
from gpuwarden.rules import loss_cause
from gpuwarden.rules.base import Hit, rule
from gpuwarden.rules.dra import claim_spec_lacks
from gpuwarden.rules.fmt import ts

UVM = "/dev/nvidia-uvm"
CTL = "/dev/nvidiactl"


def _who(ca: ContainerAccess) -> Affected:
    return Affected("container", f"{ca.pod.name or ca.pod.uid}/{ca.container.ref}", ca.pod.namespace,
                    ca.pod.uid, f"id {ca.container.id[:12]}")


def _assignment(ca: ContainerAccess) -> list[Evidence]:
    return [Evidence(line.split(": ", 1)[0], line.split(": ", 1)[1]) if ": " in line else Evidence("assignment", line)
            for line in ca.assignment[:2]]


def _verdict_ev(ca: ContainerAccess, path: str) -> Evidence | None:
    v = ca.verdict(path)
    return Evidence(v.source, f"{path} ({v.node.rule}): {v.evidence}") if v else None


def _denial_ev(ca: ContainerAccess, paths: list[str]) -> list[Evidence]:
    """Why the container is a GPU container, then the verdict on each node."""
    return _assignment(ca)[:1] + [e for p in paths if (e := _verdict_ev(ca, p)) is not None]


def _uvm_host(driver: DriverFacts) -> list[Evidence]:
    ev = []
    if driver.uvm_major is not None:
        ev.append(Evidence("/proc/devices", f"{driver.uvm_major} nvidia-uvm"))
    st = driver.nodes.get(UVM)
    if st is not None:
        ev.append(Evidence(UVM, f"char {st.major}:{st.minor}, ctime {_ts(st.ctime)}"))
    return ev


def _ts(t: float | None) -> str:
    return format_rfc3339(t) if t else "unknown"


def _plugin_cause(facts: NodeFacts, driver: DriverFacts) -> tuple[list[Evidence], bool, bool]:
    """(evidence, seen, inferred): the device plugin's /dev lacks nvidia-uvm (seen), or it started
    before the host node was created (inferred: its /dev snapshot may predate the node)."""
    plugin = facts.maybe("plugin")
    ev: list[Evidence] = []
    seen = inferred = False
    host = driver.nodes.get(UVM)
    for p in (plugin.processes if plugin else []):
        # a plugin that returns no DeviceSpecs (PASS_DEVICE_SPECS=false) leaves injection to the
        # hook, so its own /dev cannot cause the omission
        passes = p.pass_device_specs is not False
        if p.dev_view is not None and UVM not in p.dev_view:
            seen = seen or passes
            ev.append(Evidence(f"/proc/{p.pid}/root/dev", f"device plugin (pid {p.pid}) has no nvidia-uvm in its /dev"))
        # the ctime ordering only matters where the plugin's /dev is unknown, or holds a node with
        # other numbers than the host's: a plugin whose /dev has the host's node can allocate it
        view_ok = (p.dev_view is not None and host is not None
                   and p.dev_view.get(UVM) == (host.major, host.minor))
        if host is not None and p.started_at and host.ctime and p.started_at < host.ctime and not view_ok:
            inferred = inferred or passes
            ev.append(Evidence(f"/proc/{p.pid}/stat",
                               f"device plugin started {_ts(p.started_at)}, before {UVM} was created ({_ts(host.ctime)})"))
        if p.pass_device_specs is not None:
            ev.append(Evidence(f"/proc/{p.pid}/environ", f"PASS_DEVICE_SPECS={str(p.pass_device_specs).lower()}"))
    return ev, seen, inferred


def _nv_paths(devices: list[dict]) -> set[str]:
    return {str(d.get("path", "")) for d in devices if str(d.get("path", "")).startswith("/dev/nvidia")}


def _cdi_names(ca: ContainerAccess) -> list[str]:
    """The CDI devices the plugin's Allocate named for a container (cdi-cri: CDIDevices; cdi-annotations:
    a `cdi.k8s.io/` annotation), from the kubelet checkpoint."""
    if ca.alloc is None:
        return []
    names = list(ca.alloc.cdi_devices)
    for key, value in sorted(ca.alloc.annotations.items()):
        if key.startswith("cdi.k8s.io/"):
            names += [n.strip() for n in value.split(",") if n.strip()]
    return names


def _cdi_cause(facts: NodeFacts, broken: list[ContainerAccess], driver: DriverFacts) -> tuple[list[Evidence], list[str], bool] | None:
    """(evidence, spec paths, all the plugin's own) when every container denied nvidia-uvm got its GPU
    devices from a node CDI spec (not a DRA claim's) that has no nvidia-uvm; None when any one is not
    shown so. The plugin's own spec (vendor k8s.device-plugin.nvidia.com) is the one it writes at start
    from its /dev in a cdi-* strategy; any other (nvidia.com/gpu) is the toolkit's or a hand-run nvidia-ctk's.

    Shown by the checkpoint (the plugin's Allocate named CDI devices, resolved as CDI does), or, where
    no checkpoint names them, by a plugin in a `cdi-*` device-list strategy and the container's
    /dev/nvidia* spec devices being exactly one device's edits of such a spec (containerd keeps no
    trace of CDI names in the task's config.json: measured with containerd 2.1.9, docs/validation.md)."""
    cdi = facts.maybe("cdi")
    if cdi is None:
        return None
    plugin = facts.maybe("plugin")
    strategies = {p.pid: p.env["DEVICE_LIST_STRATEGY"] for p in (plugin.processes if plugin else [])
                  if "DEVICE_LIST_STRATEGY" in p.env}
    cdi_mode = any(_cdi_strategy(p.env) for p in (plugin.processes if plugin else []))
    ev: list[Evidence] = []
    specs: list[str] = []
    for ca in broken:
        hit = None
        for q in _cdi_names(ca):
            r = cdi.resolve(q)
            if r is not None and not r[0].claim_uid:
                paths = set().union(*(e.paths() for e in r[0].spec.edits_for(r[1])))
                if UVM not in paths:
                    hit = (r[0], q, f"the plugin's Allocate named CDI device {q} (kubelet checkpoint)")
                    break
        if hit is None and cdi_mode and ca.container.spec_devices is not None:
            have = _nv_paths(ca.container.spec_devices)
            for f in cdi.node_specs():
                if f.spec is None or hit is not None:
                    continue
                for name in sorted(f.spec.devices):
                    paths = set().union(*(e.paths() for e in f.spec.edits_for(name)))
                    if have and {p for p in paths if p.startswith("/dev/nvidia")} == have and UVM not in paths:
                        hit = (f, f.spec.qualified(name), f"its /dev/nvidia* spec devices ({', '.join(sorted(have))}) "
                                                          f"are exactly what {f.spec.qualified(name)} gives")
                        break
        if hit is None:
            return None
        f, q, how = hit
        ev.append(Evidence(ca.container.spec_source or f.path, f"{ca.pod.name or ca.pod.uid}/{ca.container.ref}: {how}"))
        if f.path not in specs:
            specs.append(f.path)
            nodes = sorted(set().union(*(e.paths() for e in f.spec.edits_for(q.split("=", 1)[1]))))
            ev.append(Evidence(f.path, f"{q} gives {', '.join(nodes)}: no /dev/nvidia-uvm"))
            host = driver.nodes.get(UVM)
            if f.mtime and host is not None and host.ctime and f.mtime < host.ctime:
                ev.append(Evidence(f.path, f"written {_ts(f.mtime)}, before {UVM} was created ({_ts(host.ctime)})"))
    ev += [Evidence(f"/proc/{pid}/environ", f"device plugin DEVICE_LIST_STRATEGY={st}") for pid, st in sorted(strategies.items())]
    return ev, specs, all(_plugin_own(cdi, p) for p in specs)


def _plugin_own(cdi: CdiFacts, path: str) -> bool:
    f = next((f for f in cdi.files if f.path == path), None)
    return f is not None and f.spec is not None and f.spec.vendor == PLUGIN_CDI_VENDOR


CDI_MECHANISM = "node CDI spec generated before nvidia-uvm existed"
#: the device plugin's own CDI vendor in a cdi-* strategy (k8s-device-plugin cdi.WithVendor): it writes
#: /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json when it starts, from its own /dev
PLUGIN_CDI_VENDOR = "k8s.device-plugin.nvidia.com"
PLUGIN_CDI_MECHANISM = "device plugin's CDI spec, written at its start, predates nvidia-uvm"


def _cdi_strategy(env: dict[str, str]) -> str | None:
    """The plugin's DEVICE_LIST_STRATEGY when it passes CDI names (cdi-cri, cdi-annotations), else None."""
    st = env.get("DEVICE_LIST_STRATEGY", "")
    return st if any(s.strip().startswith("cdi") for s in st.split(",")) else None


def _cdi_risk(facts: NodeFacts, driver: DriverFacts) -> tuple[list[str], list[Evidence], list[int]] | None:
    """(spec paths, evidence, plugin pids) when a plugin passes CDI names and a node NVIDIA CDI spec (the
    toolkit's nvidia.com/gpu or the plugin's own k8s.device-plugin.nvidia.com/gpu; not a DRA claim's)
    gives nvidia-uvm to none of its devices, while the host has the node."""
    cdi, plugin = facts.maybe("cdi"), facts.maybe("plugin")
    if cdi is None or plugin is None:
        return None
    pids = {p.pid: st for p in plugin.processes if (st := _cdi_strategy(p.env))}
    if not pids:
        return None
    host = driver.nodes.get(UVM)
    specs, ev = [], _uvm_host(driver)
    for f in cdi.node_specs():
        if f.spec is None or not f.spec.devices or not f.spec.vendor.endswith("nvidia.com"):
            continue
        if any(UVM in set().union(*(e.paths() for e in f.spec.edits_for(n))) for n in f.spec.devices):
            continue
        specs.append(f.path)
        ev.append(Evidence(f.path, f"{f.spec.kind}: {len(f.spec.devices)} device(s), none given /dev/nvidia-uvm"))
        if f.mtime and host is not None and host.ctime and f.mtime < host.ctime:
            ev.append(Evidence(f.path, f"written {_ts(f.mtime)}, before {UVM} was created ({_ts(host.ctime)})"))
    if not specs:
        return None
    ev += [Evidence(f"/proc/{pid}/environ", f"device plugin DEVICE_LIST_STRATEGY={st}") for pid, st in sorted(pids.items())]
    return specs, ev, sorted(pids)


_UVM_REMEDY_CDI = """\
1. Make sure the host nodes exist: `nvidia-modprobe -u -c=0` (creates /dev/nvidia-uvm and -tools).
2. Regenerate the node CDI spec named in the evidence now that the node exists:
   `nvidia-ctk cdi generate --output=<that spec>` (with the GPU Operator: restart the toolkit's pod on this
   node, which regenerates it). Restarting the device plugin does not help: in a `cdi-*` device-list
   strategy it passes CDI names, and the runtime injects what the spec lists.
3. Then recreate the affected GPU pods: their device cgroup is fixed at creation (recreated before step 2,
   they get the same spec).
Prevention: create the nodes at boot before the spec is generated (a unit running `nvidia-modprobe -u -c=0`
ordered before nvidia-ctk's spec generation, or nvidia-persistenced)."""


_UVM_REMEDY_PLUGIN_CDI = """\
1. Make sure the host nodes exist: `nvidia-modprobe -u -c=0` (creates /dev/nvidia-uvm and -tools).
2. Restart the device-plugin pod on this node (`kubectl -n <ns> delete pod <plugin-pod>`): in a `cdi-*`
   device-list strategy it writes its own CDI spec (the one in the evidence) when it starts, from its /dev,
   and the runtime injects what that spec lists.
3. Recreate the affected GPU pods: their device cgroup is fixed at creation.
Prevention: create the nodes at boot before the plugin starts (a unit running `nvidia-modprobe -u -c=0`,
or nvidia-persistenced), or gate the plugin's start on /dev/nvidia-uvm."""


def _uvm_cause(broken: list[ContainerAccess], seen: bool, inferred: bool) -> tuple[str, str, str]:
    """(kind, mechanism, sentence) for containers denied nvidia-uvm: proven only where the node shows it."""
    # a program that refuses what the v1 list the runtime wrote allows (hybrid host): not the
    # plugin's doing. On pure v2 the runtime's own program IS the allowlist: no such conclusion.
    read = [(v.read or v) for ca in broken if (v := ca.verdict(UVM)) is not None]
    if read and all(v.how == "bpf" and "devices.list" in v.allowed_by for v in read):
        return ("unified-program", "a unified-hierarchy device program denies nvidia-uvm",
                "cause: a device program on the container's unified (cgroup2) cgroup denies it; the device "
                "allowlist the runtime wrote is not what refuses it")
    # an Allocate that returned device nodes without uvm (one that returned only CDI names or env left
    # the nodes to the spec or the hook: it omitted nothing)
    omitted = [ca for ca in broken if ca.alloc is not None and ca.alloc.devices
               and not any(h.endswith("nvidia-uvm") for _, h, _ in ca.alloc.devices)]
    if omitted and len(omitted) == len(broken):
        if seen:
            return ("stale-plugin", "device plugin /dev snapshot predates nvidia-uvm",
                    "cause: the device plugin cannot see /dev/nvidia-uvm (not in its /dev), so its Allocate omitted it")
        return ("allocate-omitted", "nvidia-uvm omitted from the plugin's Allocate response",
                "the plugin's Allocate omitted nvidia-uvm; why is not determined"
                + (" (it started before the node was created: its /dev may predate it; compare "
                   "`ls -l /proc/<plugin pid>/root/dev`)" if inferred else
                   " (check the plugin's /dev and its PASS_DEVICE_SPECS / device-list strategy)"))
    if seen:
        return ("stale-plugin", "device plugin /dev snapshot predates nvidia-uvm",
                "cause: the device plugin cannot see /dev/nvidia-uvm (not in its /dev)")
    return ("not-determined", "cause not determined",
            "cause not determined: candidates are a device plugin whose /dev predates the node"
            + (" (it started before the node was created)" if inferred else "")
            + ", a spec or hook that left nvidia-uvm out (read the container's OCI spec linux.devices), and a "
            "device program on the unified hierarchy (read it with bpftool cgroup show)")


_UVM_REMEDY_PROGRAM = """\
1. Find who attached the program: `bpftool cgroup show <the cgroup in the evidence>` lists it by id and name;
   runtimes attach theirs when the container starts, anything else is a third party (a security agent,
   a hand-run tool).
2. Detach or fix that program (`bpftool cgroup detach ...`), or recreate the pod so the runtime rebuilds
   its own; the plugin, the spec and the v1 devices list already allow nvidia-uvm."""


@rule(
    "GPU-DEV-001",
    title="/dev/nvidia-uvm denied to GPU containers, or absent from the device plugin's /dev",
    severity=Severity.HIGH,
    family="device-access",
    needs=("driver", "gpu_access"),
    uses=("plugin", "dra", "containers", "cdi"),
    automation="A1 (restart device plugin) + A2 (recreate pods)",
    remedy="""
        1. Make sure the host nodes exist: `nvidia-modprobe -u -c=0` (creates /dev/nvidia-uvm and -tools).
        2. Restart the device-plugin pod on this node (`kubectl -n <ns> delete pod <plugin-pod>`), so its
           /dev snapshot includes nvidia-uvm.
        3. Recreate the affected GPU pods: their device cgroup is fixed at creation.
        Prevention: create the nodes at boot before containerd/kubelet start (a unit running
        `nvidia-modprobe -u -c=0`, or nvidia-persistenced), or use CDI / jit-cdi device injection.
    """,
    references=(
        "incident 1 (shared/incidents/1-uvm-missing-after-device-plugin-start.zh.md)",
        "NVIDIA/k8s-device-plugin internal/plugin/server.go apiDeviceSpecs (optional device paths)",
        "NVIDIA/k8s-device-plugin#222", "NVIDIA/k8s-device-plugin#414", "pytorch/pytorch#49081",
    ),
)
def uvm_missing(facts: NodeFacts) -> Iterator[Hit]:
    """CUDA in a container needs /dev/nvidia-uvm (major dynamic, read from /proc/devices).

    The NVIDIA device plugin includes nvidia-uvm in its Allocate response only if
    the node exists inside the plugin's own container when it looks; its /dev is a
    snapshot from when the plugin started. If the plugin started before the uvm
    node was created (it is created lazily after boot), every pod it serves gets a
    device cgroup without `c <uvm>:0 rw`: `open("/dev/nvidia-uvm") = -EPERM`,
    `cudaGetDeviceCount` fails with "unknown error" (30, or 999 on CUDA >= 10.1)
    while nvidia-smi still works (NVML needs only nvidiactl and the GPU node).

    CONFIRMED: a GPU container whose device policy denies nvidia-uvm (rw) while it
    still allows nvidiactl and the host has the node. That denial is proven; the cause
    is stated as proven only where the node shows it: the plugin's own /dev lacks the
    node (a stale plugin), the kubelet checkpoint shows its Allocate response omitted it,
    or the refusal comes from a device program on the unified hierarchy while the v1
    list allows it (hybrid hosts; then the plugin is not the cause and the remedy is the
    program's). A plugin that merely started before the node's ctime is an inference,
    named as a candidate. AT-RISK: the device plugin's /dev lacks nvidia-uvm, or it
    started before the node was created, while no running container is affected yet:
    the next GPU pod will be. The fix below is the stale plugin's; a finding that names a
    unified-hierarchy program carries that program's fix instead (find it with bpftool,
    detach it or recreate the pod), and only a plugin seen stale is restarted by remediation.

    CDI mode (the plugin's DEVICE_LIST_STRATEGY=cdi-cri or cdi-annotations): the plugin passes
    CDI names and the runtime injects what the node CDI spec lists, so a spec generated
    before nvidia-uvm existed is the cause. It is named when every affected container is
    shown to have its devices from such a spec: the checkpoint's CDI names resolve to a
    device of it, or, with a plugin in a cdi-* strategy, the container's /dev/nvidia* spec
    devices are exactly one device's edits of it (containerd keeps no CDI name in the task's
    config.json). The plugin's own spec (`k8s.device-plugin.nvidia.com/gpu`, which it writes
    when it starts, from its /dev): cause `stale-plugin-cdi-spec`, the fix is to restart the
    plugin, as for its /dev snapshot. Any other (the toolkit's `nvidia.com/gpu`): cause
    `stale-cdi-spec`, the fix is to regenerate the spec (`nvidia-ctk cdi generate`), then
    recreate the pods; remediation deletes no pod until the spec lists the node (a new pod
    would get the same devices).
    AT-RISK in CDI mode: a plugin in a cdi-* strategy and a node NVIDIA CDI spec (not a DRA
    claim's) that gives nvidia-uvm to none of its devices while the host has the node.
    """
    driver: DriverFacts = facts.get("driver")
    access: GpuAccessFacts = facts.get("gpu_access")
    driver.require("/proc/devices")  # the uvm major a container must be allowed is read there only
    if driver.uvm_major is None or UVM not in driver.nodes:
        return  # the host itself lacks uvm: GPU-DRV-003
    cause, seen, inferred = _plugin_cause(facts, driver)
    stale = seen or inferred
    broken = []
    explained = claim_spec_lacks(facts, UVM)  # a DRA claim's spec left it out: GPU-DRA-010 names the claim
    for ca in access.containers:
        uvm, ctl = ca.verdict(UVM), ca.verdict(CTL)
        if (uvm is not None and uvm.allowed is False and (ctl is None or ctl.allowed is not False)
                and (ca.pod.uid, ca.container.id) not in explained):
            broken.append(ca)
    if broken:
        ev = _uvm_host(driver)
        for ca in broken:
            ev += _denial_ev(ca, [UVM, CTL])
            if ca.alloc is not None and ca.alloc.devices and not any(h.endswith("nvidia-uvm") for _, h, _ in ca.alloc.devices):
                ev.append(Evidence("kubelet_internal_checkpoint AllocResp",
                                   "plugin's Allocate returned devices " + ", ".join(h for _, h, _ in ca.alloc.devices) + " (no /dev/nvidia-uvm)"))
        kind, mechanism, why = _uvm_cause(broken, seen, inferred)
        # a unified-hierarchy program refusing what the runtime allowed is not the spec's doing
        cdi = _cdi_cause(facts, broken, driver) if kind != "unified-program" else None
        if cdi is not None and cdi[2]:
            ev += cdi[0]
            kind, mechanism = "stale-plugin-cdi-spec", PLUGIN_CDI_MECHANISM
            why = (f"cause: the device plugin's own CDI spec {', '.join(cdi[1])} (written when it started, from its "
                   "/dev) has no /dev/nvidia-uvm, and the runtime gives each container exactly what the spec lists; "
                   "restart the plugin: it writes the spec anew")
            seen = True  # restarting the plugin is the fix (remediation's restart-device-plugin)
        elif cdi is not None:
            ev += cdi[0]
            kind, mechanism = "stale-cdi-spec", CDI_MECHANISM
            why = (f"cause: the node CDI spec {', '.join(cdi[1])} has no /dev/nvidia-uvm (nvidia-ctk lists it when it "
                   "exists: the spec predates the node), and the runtime gives each container exactly what the spec "
                   "lists; regenerate the spec")
            seen = False  # the plugin passes CDI names: its own /dev is not the cause
        else:
            ev += cause
        names = ", ".join(f"{ca.pod.name or ca.pod.uid}/{ca.container.ref}" for ca in broken)
        yield Hit(
            Status.CONFIRMED,
            f"{len(broken)} GPU container(s) are denied /dev/nvidia-uvm by their device cgroup ({names}): CUDA "
            f"fails with 'unknown error' while nvidia-smi works. {why[0].upper()}{why[1:]}.",
            affected=[_who(ca) for ca in broken],
            evidence=ev,
            mechanism=mechanism,
            remedy={"unified-program": _UVM_REMEDY_PROGRAM, "stale-cdi-spec": _UVM_REMEDY_CDI,
                    "stale-plugin-cdi-spec": _UVM_REMEDY_PLUGIN_CDI}.get(kind),
            data={"uvm_major": driver.uvm_major, "stale_plugin": seen, "cause": kind},
        )
    elif (risk := _cdi_risk(facts, driver)) is not None:
        specs, ev, pids = risk
        own = all(_plugin_own(facts.get("cdi"), p) for p in specs)
        yield Hit(
            Status.AT_RISK,
            f"The node CDI spec {', '.join(specs)} gives no device /dev/nvidia-uvm and the device plugin passes CDI "
            "names: every GPU pod it allocates from now on will lack it. "
            + ("Restart the plugin: it writes its spec anew." if own else "Regenerate the spec."),
            affected=[Affected("plugin", f"pid {pid}") for pid in pids],
            evidence=ev,
            severity=Severity.MEDIUM,
            remedy=_UVM_REMEDY_PLUGIN_CDI if own else _UVM_REMEDY_CDI,
            mechanism=PLUGIN_CDI_MECHANISM if own else CDI_MECHANISM,
            data={"uvm_major": driver.uvm_major, "stale_plugin": own,
                  "cause": "stale-plugin-cdi-spec" if own else "stale-cdi-spec"},
        )
    elif stale:
        yield Hit(
            Status.AT_RISK,
            "The device plugin's /dev has no nvidia-uvm: every GPU pod it allocates from now on will lack it."
            if seen else
            "The device plugin started before /dev/nvidia-uvm was created and its /dev does not show the host's "
            "node: if its /dev is a snapshot from its start, every GPU pod it allocates from now on will lack it.",
            affected=[Affected("plugin", f"pid {p.pid}") for p in facts.get("plugin").processes],
            evidence=_uvm_host(driver) + cause,
            severity=Severity.MEDIUM,
            # only a plugin seen without the node is named stale (remediation restarts only that one)
            mechanism="device plugin /dev snapshot predates nvidia-uvm" if seen else
            "device plugin started before nvidia-uvm was created (its /dev may predate the node)",
        )


def _lost(ca: ContainerAccess) -> list[str]:
    """Paths of the nvidiactl / GPU nodes this container needs and is denied."""
    paths = [CTL] + [f"/dev/nvidia{m}" for m in ca.gpu_minors]
    return [p for p in paths if (v := ca.verdict(p)) is not None and v.allowed is False]


def _had_them(ca: ContainerAccess, lost: list[str]) -> Evidence | None:
    """The node is in the container's /dev or spec: it was given, and is now denied."""
    view = ca.container.dev_view or {}
    present = [p for p in lost if p in view]
    if present:
        return Evidence(f"/proc/{ca.container.pids[0]}/root/dev",
                        "present in the container's /dev but denied by its cgroup: " + ", ".join(present))
    return None


def _config_evidence(facts: NodeFacts) -> list[Evidence]:
    kub = facts.maybe("kubelet")
    rt = facts.maybe("runtime")
    ev: list[Evidence] = []
    if kub is not None:
        ev.append(Evidence("kubelet", f"cpuManagerPolicy={kub.cpu_manager_policy} ({kub.cpu_manager_policy_source})"))
        ev.append(Evidence("kubelet", f"cgroupDriver={kub.cgroup_driver} ({kub.cgroup_driver_source})"))
    if rt is not None and rt.runc_version:
        ev.append(Evidence("runc --version", f"runc {rt.runc_version}"))
    return ev


def _loss_line(ca: ContainerAccess, lost: list[str], since: float | None) -> str:
    """What is proven about one container: which devices, held since when, denied now."""
    view = ca.container.dev_view or {}
    held = [p for p in lost if p in view]
    start = ca.container.started_at
    text = f"{ca.pod.name or ca.pod.uid}/{ca.container.ref} is denied {', '.join(lost)}"
    if held:
        text += f" ({'all' if len(held) == len(lost) else ', '.join(held)} in its /dev: given at start)"
    text += f"; running since {ts(start)}" if start else "; start time unknown"
    text += f", lost at or after {ts(since)}" if since else ", lost at a time not recorded"
    return text


def _loss_hits(facts: NodeFacts, code: str) -> Iterator[Hit]:
    access: GpuAccessFacts = facts.get("gpu_access")
    broken = [(ca, lost) for ca in access.containers if (lost := _lost(ca))]
    if not broken:
        if _exposure_code(facts) == code:
            yield from _at_risk(facts, code, access, _exposure(facts), _config_evidence(facts))
        return
    cause = loss_cause.determine(facts, [ca.container.started_at for ca, _ in broken],
                                 [ca.hook_injected for ca, _ in broken])
    if loss_cause.code_for(facts, cause) != code:
        return
    ev: list[Evidence] = []
    for ca, lost in broken:
        ev += _denial_ev(ca, lost)
        had = _had_them(ca, lost)
        if had:
            ev.append(had)
        if ca.hook_injected:
            ev.append(Evidence(ca.container.spec_source, "linux.devices lists no /dev/nvidia* node: devices were injected by the NVIDIA hook, outside the runtime's view"))
    lines = "; ".join(_loss_line(ca, lost, cause.since) for ca, lost in broken)
    from inspect import cleandoc  # here, not at import: only a finding needs it

    yield Hit(
        Status.CONFIRMED,
        f"{len(broken)} GPU container(s) lost access to nvidiactl or their GPU: {lines}. NVML reports "
        f"'Failed to initialize NVML: Unknown Error', CUDA finds no device. {cause.sentence}",
        affected=[_who(ca) for ca, _ in broken],
        evidence=ev + loss_cause.evidence_lines(cause),
        remedy=cleandoc(loss_cause.REMEDY[cause.kind]),
        mechanism=cause.mechanism,
        data={"lost": {ca.container.id: lost for ca, lost in broken}, **cause.data()},
    )


def _exposure_code(facts: NodeFacts) -> str:
    """Which rule owns an exposure (no loss yet): the static CPU manager's, or systemd's."""
    kub = facts.maybe("kubelet")
    static = kub is not None and kub.cpu_manager_policy == "static"
    systemd = kub is not None and kub.cgroup_driver == "systemd"
    return "GPU-DEV-003" if systemd and not static else "GPU-DEV-002"


def _exposure(facts: NodeFacts) -> str:
    kub = facts.maybe("kubelet")
    if kub is not None and kub.cpu_manager_policy == "static":
        return ("static CPU manager reconcile -> CRI UpdateContainerResources -> `runc update` would re-apply the "
                "spec's device rules, dropping hook-injected GPU devices")
    return ("systemd cgroup driver: the next `systemctl daemon-reload` would re-apply the scope's DeviceAllow, "
            "which does not list the hook-injected NVIDIA devices")


DEVCHAR = "runc-devchar-skip"


def _devchar_risk(facts: NodeFacts, access: GpuAccessFacts, mev: list[Evidence]) -> Iterator[Hit]:
    """GPU-DEV-003 for containers whose GPUs ARE in the spec: runc 1.1.3-1.1.6 leaves every device
    without a /dev/char/M:m link out of the systemd scope's DeviceAllow (knowledge: runc-devchar-skip)."""
    kub = facts.maybe("kubelet")
    rt = facts.maybe("runtime")
    if kub is None or kub.cgroup_driver != "systemd" or rt is None or not rt.runc_version:
        return
    m = known_versions.get(DEVCHAR).check(rt.runc_version)
    if m is None or not m.affected:
        return
    links = facts.get("driver").char_links
    exposed = []
    for ca in access.containers:
        if ca.hook_injected is not False:
            continue
        miss = [n for n in ["/dev/char/195:255"] + [f"/dev/char/195:{mn}" for mn in ca.gpu_minors] if n not in links]
        if miss:
            exposed.append((ca, miss))
    if not exposed:
        return
    missing = sorted({n for _, miss in exposed for n in miss})
    yield Hit(
        Status.AT_RISK,
        f"{len(exposed)} GPU container(s) have their devices in the spec, but runc {rt.runc_version} "
        f"({m.range.range if m.range else 'affected'}) leaves devices without a /dev/char link out of the systemd "
        f"scope's DeviceAllow; missing: {', '.join(missing[:4])}: the next daemon-reload drops them.",
        affected=[_who(ca) for ca, _ in exposed],
        evidence=[Evidence("/dev/char", "no link for " + ", ".join(missing[:6]))] + mev,
        severity=Severity.MEDIUM,
        remedy=None,
        mechanism=f"runc {m.range.range if m.range else ''} skips DeviceAllow entries whose /dev/char path does not exist "
                  f"(runc#3708; fixed in {m.fix} with systemd >= 240)",
        data={"runc": rt.runc_version, "missing_links": missing},
    )


def _at_risk(facts: NodeFacts, code: str, access: GpuAccessFacts, mechanism: str, mev: list[Evidence]) -> Iterator[Hit]:
    rt = facts.maybe("runtime")
    runc = rt.runc_tuple() if rt else None
    runc_fixed = rt.runc_at_least((1, 0, 0)) if rt else None
    hooked = [ca for ca in access.containers if ca.hook_injected]
    if code == "GPU-DEV-003":
        yield from _devchar_risk(facts, access, mev)
    if not hooked:
        return
    if code == "GPU-DEV-002":
        kub = facts.maybe("kubelet")
        if kub is None or kub.cpu_manager_policy != "static":
            return  # exposure needs a caller of `runc update` on a schedule: the static CPU manager
        if runc_fixed:
            return  # runc >= 1.0 skips devices on update (runc#2994); 1.0.0-rc9x does not
        note = f"runc {rt.runc_version} < 1.0.0 re-applies devices on update" if runc is not None else ""
    else:
        driver: DriverFacts = facts.get("driver")
        links = driver.char_links
        missing = [n for n in ["/dev/char/195:255"] + [f"/dev/char/195:{m}" for ca in hooked for m in ca.gpu_minors]
                   if n not in links]
        note = "hook-injected devices are absent from the scope's DeviceAllow"
        if missing:
            note += f"; /dev/char links missing: {', '.join(sorted(set(missing))[:4])}"
    if note:
        summary, severity = (f"{len(hooked)} GPU container(s) got their devices only from the NVIDIA hook; {note}: "
                             "the next cgroup re-apply will drop them."), Severity.MEDIUM
    else:
        # runc's version not known here (a live check does not run the node's runc; `gpuwarden collect` records
        # `runc --version`): only rc92-rc95 re-apply devices, so "will drop them" would claim what is not shown
        # (run 21a on the H200: runc 1.3.6 kept the hook's devices, and this was MEDIUM)
        summary, severity = (f"{len(hooked)} GPU container(s) got their devices only from the NVIDIA hook, and runc's "
                             "version is not known here: runc 1.0.0-rc92 to rc95 drop them at the static CPU "
                             "manager's next update, runc >= 1.0 keeps them (`gpuwarden collect` records "
                             "`runc --version` and settles it)."), Severity.LOW
    yield Hit(
        Status.AT_RISK,
        summary,
        affected=[_who(ca) for ca in hooked],
        evidence=[Evidence(ca.container.spec_source, "linux.devices lists no /dev/nvidia* node") for ca in hooked[:3]] + mev,
        severity=severity,
        mechanism=mechanism,
    )


@rule(
    "GPU-DEV-002",
    title="GPU devices dropped from a running container's device cgroup",
    severity=Severity.HIGH,
    family="device-access",
    needs=("gpu_access",),
    uses=("driver", "kubelet", "reapply", "runtime"),
    automation="A2 (recreate pods)",
    remedy=loss_cause.REMEDY[loss_cause.STATIC],
    references=(
        "incidents 2 and 3 (shared/incidents/2-*.zh.md, 3-*.zh.md)", "kubernetes/kubernetes#77073",
        "kubernetes/kubernetes#101771", "opencontainers/runc#2994", "opencontainers/runc#3019",
        "NVIDIA/nvidia-container-toolkit#138", "NVIDIA/nvidia-container-runtime#55", "NVIDIA/k8s-device-plugin#145",
    ),
)
def runc_update_loss(facts: NodeFacts) -> Iterator[Hit]:
    """A running GPU container is denied nvidiactl or its GPU by its own device cgroup.

    Proven (CONFIRMED): the loss itself -- read from the container's device policy (v1
    devices.list, the unified hierarchy's device programs, or an open() from inside its
    cgroup), with the nodes still in its /dev when they were given at start. The finding's
    first line says which container lost which devices and since when.

    The cause is a separate statement, named only when the node shows it: the static CPU
    manager (cpuManagerPolicy=static in the kubelet's flag, config or cpu_manager_state, with
    runc < 1.0 or unknown and the devices injected by the NVIDIA hook rather than listed in the
    spec) -- its reconcile loop sends cpusets through CRI UpdateContainerResources -> `runc
    update`, and runc before 1.0 re-applied the spec's device rules, wiping the hook's (incidents
    2 and 3: `Failed to initialize NVML: Unknown Error`). Otherwise the finding says "cause not
    determined", lists the candidates (an in-place resize, a hand-run `docker update` or
    `crictl update`, the CPU manager where its policy is unknown) with what tells them apart, and
    what the node rules out; the remedy is then the catch-all that survives any re-apply
    (DeviceSpecs in Allocate, CDI, runc >= 1.0). A loss under the systemd cgroup driver with no
    proven CPU-manager cause is GPU-DEV-003's.

    AT-RISK: hook-only GPU containers, static CPU manager, runc < 1.0 or unknown (a configuration
    read from the node, not an inference).

    The fix below is the proven CPU-manager cause's; a finding whose cause is not determined
    carries the catch-all fix instead (recreate the pods; DeviceSpecs in Allocate or CDI; runc
    >= 1.0; /dev/char links under systemd; then the checks listed with each candidate).
    """
    yield from _loss_hits(facts, "GPU-DEV-002")


@rule(
    "GPU-DEV-003",
    title="GPU devices dropped from a running container's device cgroup (systemd cgroup driver)",
    severity=Severity.HIGH,
    family="device-access",
    needs=("gpu_access",),
    uses=("driver", "kubelet", "reapply", "runtime"),
    automation="A1 (/dev/char links) + A2 (recreate pods)",
    remedy=loss_cause.REMEDY[loss_cause.RELOAD],
    references=(
        "incident 3 (shared/incidents/3-static-cpu-manager-devices-cgroup.zh.md)",
        "NVIDIA/nvidia-container-toolkit#48", "NVIDIA/nvidia-container-toolkit#251",
        "opencontainers/runc#3708", "opencontainers/runc#4568", "NVIDIA/gpu-operator#430",
    ),
)
def daemon_reload_loss(facts: NodeFacts) -> Iterator[Hit]:
    """With the systemd cgroup driver, systemd owns each container scope's device policy.

    runc tells systemd DeviceAllow= only for devices in the OCI spec (as
    /dev/char/M:m paths). Devices added by the NVIDIA hook, or spec devices whose
    /dev/char link is missing (runc 1.1.3-1.1.6), are not in DeviceAllow; the next
    `systemctl daemon-reload` re-applies the scope's policy and drops them: long
    running GPU containers all fail at once with `Failed to initialize NVML: Unknown Error`.

    CONFIRMED: a GPU container denied nvidiactl or its GPU under the systemd cgroup driver
    (proven, as for GPU-DEV-002). The daemon-reload is named as the cause only when the node
    dates one after the container started: systemd flushes and re-creates its generator
    directories (/run/systemd/generator*) on every reload, so their mtime is the last reload's
    time. Without that the finding says "cause not determined" with the candidates and the
    catch-all remedy. AT-RISK: hook-only GPU containers under systemd; spec devices without a
    /dev/char link on runc 1.1.3-1.1.6. The fix below is the proven reload's; a finding whose
    cause is not determined carries GPU-DEV-002's catch-all fix.
    """
    yield from _loss_hits(facts, "GPU-DEV-003")
