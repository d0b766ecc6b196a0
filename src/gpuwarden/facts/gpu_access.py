"""Which containers use GPUs, which device nodes they need, and whether their cgroup allows each.

This combines the kubelet checkpoint (who got which GPU), the container's OCI
spec and env, the driver's GPU table and the container's device policy as the kernel
applies it: the cgroup v1 `devices.list` read as text and the unified hierarchy's BPF
programs evaluated by gpuwarden.bpf (captured program bytes in a bundle, or read live by a
probe); on a hybrid host both, and a device is allowed only if both allow it.
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct, field

from gpuwarden.facts import bpf_programs
from gpuwarden.facts.containers import CgroupLayout, Container, ContainerFacts, Pod
from gpuwarden.facts.device_verdict import AccessVerdict, combine
from gpuwarden.facts.driver import DeviceNode, DriverFacts
from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.parsers import devices_list, plausible
from gpuwarden.parsers.kubelet_checkpoint import AllocSpec, decode_alloc

GPU_RESOURCE_PREFIX = "nvidia.com/"
_VOID = ("", "void", "none")


class ContainerAccess(Struct):
    """One GPU container: the GPUs it was given and whether its cgroup lets it use them."""
    pod: Pod
    container: Container
    gpu_minors: list[int]
    assignment: list[str]  # evidence lines: why we think this is a GPU container
    alloc: AllocSpec | None = None  # what the plugin's Allocate returned (from the checkpoint)
    resource: str = ""
    verdicts: dict[str, AccessVerdict] = field(default_factory=dict)

    def denied(self) -> list[AccessVerdict]:
        return [v for v in self.verdicts.values() if v.allowed is False]

    def verdict(self, path: str) -> AccessVerdict | None:
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


class GpuAccessFacts(Struct):
    """Every GPU container's device access, and where the policy was read."""
    containers: list[ContainerAccess]
    policy_source: str  # "devices.list" | "bpf" | "devices.list+bpf" | "open()" | "none"


def _minors_from_ids(ids: list[str] | tuple[str, ...], driver: DriverFacts) -> list[int]:
    out = []
    gpus_sorted = sorted(driver.gpus, key=lambda g: g.bus_id)
    for dev_id in ids:
        dev_id = dev_id.strip()
        if dev_id.lower() == "all":
            return sorted(g.minor for g in driver.gpus if g.minor is not None)
        g = driver.gpu_by_uuid(dev_id)
        if g is None and plausible.decimal(dev_id) and int(dev_id) < len(gpus_sorted):
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


def _v1_verdict(c: Container, node: DeviceNode) -> AccessVerdict:
    assert c.device_rules is not None
    hit = devices_list.allows(c.device_rules, "c", node.major, node.minor, "rw")
    if hit is not None:
        return AccessVerdict(node, True, "devices.list", f"'{hit.line or hit}' allows {node.rule} rw", c.device_rules_source)
    if c.device_rules_bad:
        # no entry found, but the list is corrupt (truncated or garbage): absence proves nothing
        return AccessVerdict(node, None, "devices.list",
                       f"undecided: no parsable entry allows {node.rule} rw and {c.device_rules_bad} line(s) "
                       "could not be parsed", c.device_rules_source)
    related = [r.line for r in c.device_rules if r.major in (node.major, None)][:4]
    tail = f" (entries for major {node.major}: {'; '.join(related)})" if related else f" (no entry for major {node.major})"
    return AccessVerdict(node, False, "devices.list", f"no entry allows {node.rule} rw{tail}", c.device_rules_source)


def _programs(facts: NodeFacts) -> tuple[dict[str, Any] | None, str]:
    """The unified-hierarchy programs read (live) or recorded (bundle), or why there are none."""
    try:
        return facts.get("bpf_programs"), ""
    except FactUnavailable as exc:
        return None, str(exc)


def _unified_verdicts(facts: NodeFacts, c: Container, needed: list[DeviceNode],
                      progs: tuple[dict[str, Any] | None, str]) -> dict[str, AccessVerdict]:
    table, why = progs
    if c.unified_cgroup is None:
        return bpf_programs.unevaluated(needed, f"not evaluated: {c.unified_unknown}")
    if table is None:
        return bpf_programs.unevaluated(needed, why if why.startswith("not evaluated") else f"not evaluated: {why}")
    return bpf_programs.verdicts_for(table.get(c.id), needed)


@fact("gpu_access")
def collect_gpu_access(facts: NodeFacts) -> GpuAccessFacts:
    ctrs: ContainerFacts = facts.get("containers")
    driver: DriverFacts = facts.get("driver")
    out: list[ContainerAccess] = []
    kinds: set[str] = set()
    progs: tuple[dict[str, Any] | None, str] | None = None
    for pod, c in ctrs.containers():
        ca = _assign(pod, c, facts, driver)
        if ca is None:
            continue
        needed = driver.control_nodes() + [driver.gpu_node(m) for m in ca.gpu_minors]
        parts: dict[str, list[AccessVerdict]] = {n.path: [] for n in needed}
        if c.unified_cgroup is not None or c.unified_unknown:
            progs = progs or _programs(facts)
            for path, v in _unified_verdicts(facts, c, needed, progs).items():
                parts[path].append(v)
            kinds.add("bpf")
        if c.device_rules is not None:
            for node in needed:
                parts[node.path].append(_v1_verdict(c, node))
            kinds.add("devices.list")
        for node in needed:
            if parts[node.path]:
                ca.verdicts[node.path] = combine(node, parts[node.path])
        out.append(ca)
    if progs is not None and progs[0] is None and out:
        names = [f"{ca.pod.name or ca.pod.uid}/{ca.container.ref}" for ca in out
                 if ca.container.unified_cgroup is not None or ca.container.unified_unknown]
        facts.gap("unified-hierarchy device programs",
                  f"{progs[1]}; the device rules (GPU-DEV-001..003) did not evaluate them for {len(names)} GPU "
                  f"container(s){': ' + ', '.join(names[:4]) if names else ''}: a denial there would go unseen")
    policy = "+".join(k for k in ("devices.list", "bpf") if k in kinds) or "none"
    if facts.settings.probe_access and facts.root.live and out:
        _probe_access(facts, ctrs, driver, out)
        policy = policy if policy != "none" else "open()"
    return GpuAccessFacts(out, policy)


def _probe_dirs(layout: CgroupLayout, c: Container) -> list[str]:
    """The cgroups a probe must join to face the kernel's whole device check for this container:
    the v1 devices cgroup and, on pure v2 or hybrid hosts, its unified-hierarchy cgroup."""
    dirs = []
    if layout.version == 1:
        d = layout.dir("devices", c.cgroup)
        if d:
            dirs.append(d)
    if c.unified_cgroup is not None:
        d = layout.dir("unified", c.unified_cgroup)
        if d:
            dirs.append(d)
    return dirs


def _probe_access(facts: NodeFacts, ctrs: ContainerFacts, driver: DriverFacts, found: list[ContainerAccess]) -> None:
    """--probe-access: the kernel's own answer, from a child placed in each container's cgroup."""
    from gpuwarden.probes import devaccess

    for ca in found:
        dirs = _probe_dirs(ctrs.layout, ca.container)
        if not dirs:
            continue
        if ctrs.layout.hybrid and len(dirs) < 2:
            facts.gap(f"probe-access {ca.container.id[:12]}", "the container's unified cgroup was not found: "
                      "an open from its v1 devices cgroup alone would miss the unified programs; not probed")
            continue
        needed = driver.control_nodes() + [driver.gpu_node(m) for m in ca.gpu_minors]
        paths = {n.path: n for n in needed}
        out = devaccess.probe(facts.root, dirs, list(paths), facts.settings.probe_timeout_s)
        if not out.ok:
            facts.gap(f"probe-access {ca.container.id[:12]}", out.detail)
            continue
        for path, result in out.value.items():
            node = paths[path]
            ok = devaccess.allowed(result)
            if ok is None:
                continue
            read = ca.verdicts.get(node.path)
            text = f"open({node.path}, O_RDWR) from inside the cgroup: {result}"
            if read is not None and read.allowed is not None and read.allowed != ok:
                text += f" (the policy as read said {'allowed' if read.allowed else 'denied'}: {read.evidence})"
            ca.verdicts[node.path] = AccessVerdict(node, ok, "open()", text, f"probe-access: {' + '.join(dirs)}", read)
