"""Which containers use GPUs, which device nodes they need, and whether their cgroup allows each.

This combines the kubelet checkpoint (who got which GPU), the container's OCI
spec and env, the driver's GPU table and the container's device policy: cgroup v1
`devices.list` read as text, cgroup v2 BPF programs evaluated by gpuwarden.bpf
(captured program bytes in a bundle, or read live by a probe).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwarden.facts.containers import Container, ContainerFacts, Pod
from gpuwarden.facts.driver import DeviceNode, DriverFacts
from gpuwarden.facts.node import NodeFacts, fact
from gpuwarden.parsers import devices_list
from gpuwarden.parsers.kubelet_checkpoint import AllocSpec, decode_alloc

GPU_RESOURCE_PREFIX = "nvidia.com/"
_VOID = ("", "void", "none")


@dataclass(frozen=True)
class Verdict:
    """Does the container's device policy allow `access` on a node?"""

    node: DeviceNode
    allowed: bool | None  # None: could not be decided
    how: str  # "devices.list" | "bpf" | "open()" | ""
    evidence: str
    source: str


@dataclass
class ContainerAccess:
    pod: Pod
    container: Container
    gpu_minors: list[int]
    assignment: list[str]  # evidence lines: why we think this is a GPU container
    alloc: AllocSpec | None = None  # what the plugin's Allocate returned (from the checkpoint)
    resource: str = ""
    verdicts: dict[str, Verdict] = field(default_factory=dict)

    def denied(self) -> list[Verdict]:
        return [v for v in self.verdicts.values() if v.allowed is False]

    def verdict(self, path: str) -> Verdict | None:
        return self.verdicts.get(path)

    @property
    def hook_injected(self) -> bool | None:
        """True when the NVIDIA devices reached the container behind the runtime's back.

        Devices listed in the OCI spec (`linux.devices`) are re-applied by runc and
        systemd; devices added by the legacy prestart hook are not.
        """
        if self.container.spec_devices is None:
            return None
        return not any(str(d.get("path", "")).startswith("/dev/nvidia") for d in self.container.spec_devices)


@dataclass
class GpuAccessFacts:
    containers: list[ContainerAccess]
    policy_source: str  # "devices.list" | "bpf" | "none"


def _minors_from_ids(ids: list[str] | tuple[str, ...], driver: DriverFacts) -> list[int]:
    out = []
    gpus_sorted = sorted(driver.gpus, key=lambda g: g.bus_id)
    for dev_id in ids:
        dev_id = dev_id.strip()
        if dev_id.lower() == "all":
            return sorted(g.minor for g in driver.gpus if g.minor is not None)
        g = driver.gpu_by_uuid(dev_id)
        if g is None and dev_id.isdigit() and int(dev_id) < len(gpus_sorted):
            g = gpus_sorted[int(dev_id)]
        if g is not None and g.minor is not None:
            out.append(g.minor)
    return sorted(set(out))


def _assign(pod: Pod, c: Container, facts: NodeFacts, driver: DriverFacts) -> ContainerAccess | None:
    kub = facts.maybe("kubelet")
    evidence: list[str] = []
    minors: list[int] = []
    alloc = None
    resource = ""
    if kub and kub.checkpoint:
        for e in kub.checkpoint.entries:
            if e.pod_uid == pod.uid and e.container == c.name and e.resource.startswith(GPU_RESOURCE_PREFIX):
                resource = e.resource
                minors += _minors_from_ids(e.device_ids, driver)
                evidence.append(f"{kub.checkpoint_path}: {e.resource} -> {', '.join(e.device_ids)}")
                alloc = alloc or decode_alloc(e.alloc_resp)
    if c.spec_devices:
        spec_minors = [int(d["minor"]) for d in c.spec_devices
                       if d.get("major") == 195 and isinstance(d.get("minor"), int) and d["minor"] < 254]
        if spec_minors:
            evidence.append(f"{c.spec_source}: linux.devices has /dev/nvidia{{{','.join(map(str, spec_minors))}}}")
            minors += spec_minors
    vis = c.env.get("NVIDIA_VISIBLE_DEVICES")
    if vis is not None and vis.strip().lower() not in _VOID:
        evidence.append(f"{c.spec_source}: NVIDIA_VISIBLE_DEVICES={vis}")
        if not minors:
            minors += _minors_from_ids(vis.split(","), driver)
    if not evidence and c.dev_view:
        seen = sorted(mn for p, (mj, mn) in c.dev_view.items() if mj == 195 and mn < 254 and p.startswith("/dev/nvidia"))
        if seen:
            evidence.append(f"/proc/{c.pids[0]}/root/dev: " + ", ".join(f"nvidia{m}" for m in seen))
            minors += seen
    if not evidence:
        return None
    return ContainerAccess(pod, c, sorted(set(minors)), evidence, alloc, resource)


def _v1_verdict(c: Container, node: DeviceNode) -> Verdict:
    assert c.device_rules is not None
    hit = devices_list.allows(c.device_rules, "c", node.major, node.minor, "rw")
    if hit is not None:
        return Verdict(node, True, "devices.list", f"'{hit.line or hit}' allows {node.rule} rw", c.device_rules_source)
    if c.device_rules_bad:
        # no entry found, but the list is corrupt (truncated or garbage): absence proves nothing
        return Verdict(node, None, "devices.list",
                       f"undecided: no parsable entry allows {node.rule} rw and {c.device_rules_bad} line(s) "
                       "could not be parsed", c.device_rules_source)
    related = [r.line for r in c.device_rules if r.major in (node.major, None)][:4]
    tail = f" (entries for major {node.major}: {'; '.join(related)})" if related else f" (no entry for major {node.major})"
    return Verdict(node, False, "devices.list", f"no entry allows {node.rule} rw{tail}", c.device_rules_source)


def _bpf_verdicts(facts: NodeFacts, c: Container) -> object | None:
    """The cgroup v2 device programs read (live) or recorded (bundle) for this container."""
    if facts.get("containers").layout.version != 2:
        return None
    progs = facts.maybe("bpf_programs")
    return progs.get(c.id) if progs else None


@fact("gpu_access")
def collect_gpu_access(facts: NodeFacts) -> GpuAccessFacts:
    ctrs: ContainerFacts = facts.get("containers")
    driver: DriverFacts = facts.get("driver")
    out: list[ContainerAccess] = []
    policy = "none"
    for pod, c in ctrs.containers():
        ca = _assign(pod, c, facts, driver)
        if ca is None:
            continue
        needed = driver.control_nodes() + [driver.gpu_node(m) for m in ca.gpu_minors]
        if c.device_rules is not None:
            policy = "devices.list"
            for node in needed:
                ca.verdicts[node.path] = _v1_verdict(c, node)
        else:
            progs = _bpf_verdicts(facts, c)
            if progs is not None:
                policy = "bpf"
                from gpuwarden.facts.bpf_access import verdicts_for

                ca.verdicts.update(verdicts_for(progs, needed))
        out.append(ca)
    if facts.settings.probe_access and facts.root.live and out:
        _probe_access(facts, ctrs, driver, out)
        policy = policy if policy != "none" else "open()"
    return GpuAccessFacts(out, policy)


def _probe_access(facts: NodeFacts, ctrs: ContainerFacts, driver: DriverFacts, found: list[ContainerAccess]) -> None:
    """--probe-access: the kernel's own answer, from a child placed in each container's cgroup."""
    from gpuwarden.probes import devaccess

    for ca in found:
        ctl = "devices" if ctrs.layout.version == 1 else "unified"
        d = ctrs.layout.dir(ctl, ca.container.cgroup)
        if not d:
            continue
        procs = facts.root.host_path(f"{d}/cgroup.procs") or f"{d}/cgroup.procs"
        needed = driver.control_nodes() + [driver.gpu_node(m) for m in ca.gpu_minors]
        paths = {facts.root.host_path(n.path) or n.path: n for n in needed}
        out = devaccess.probe([procs], list(paths), facts.settings.probe_timeout_s)
        if not out.ok:
            facts.gap(f"probe-access {ca.container.id[:12]}", out.detail)
            continue
        for host_path, result in out.value.items():
            node = paths[host_path]
            ok = devaccess.allowed(result)
            if ok is None:
                continue
            ca.verdicts[node.path] = Verdict(node, ok, "open()", f"open({node.path}, O_RDWR) from inside the cgroup: {result}",
                                             f"probe-access: {d}")
