"""The node side of DRA: per-claim CDI specs, their containers, and a node served by both allocation worlds.

A DRA node gives a container its GPU through a claim: the kubelet asks the DRA driver to prepare the
claim, the driver writes a CDI spec for it, and the runtime creates the container from that spec's
device nodes, mounts and hooks. Incident 1 and stale-spec failures come back here per claim.
"""

from __future__ import annotations

from typing import Iterator

from gpuwarden import known_versions
from gpuwarden.facts import NodeFacts
from gpuwarden.facts.dra import DraClaim, DraFacts
from gpuwarden.facts.driver import DriverFacts
from gpuwarden.facts.gpu_access import ContainerAccess, GpuAccessFacts
from gpuwarden.findings import Affected, Evidence, Severity, Status
from gpuwarden.rules.base import Hit, rule
from gpuwarden.rules.device_nodes import LIB_VERSION, expected_major
from gpuwarden.rules.logview import events
from gpuwarden.parsers.kubelet_checkpoint import base_device_id

UVM = "/dev/nvidia-uvm"
CTL = "/dev/nvidiactl"
MAX_QUOTED = 4
DRA_REFS = ("kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/cdi.go (CreateClaimSpecFile)",
            "cncf-tags/container-device-interface pkg/cdi/doc.go (spec directories and precedence)")


def _claim_who(claim: DraClaim, facts_node: str = "") -> Affected:
    names = sorted({d.device for d in claim.devices if d.device})  # each once: a state may list one many times
    more = f" +{len(names) - MAX_QUOTED} more" if len(names) > MAX_QUOTED else ""
    return Affected("claim", claim.name or claim.uid, claim.namespace, claim.uid,
                    f"devices {', '.join(names[:MAX_QUOTED]) or 'unknown'}{more}")


def _ctr_who(pod, c) -> Affected:
    return Affected("container", f"{pod.name or pod.uid}/{c.ref}", pod.namespace, pod.uid, f"id {c.id[:12]}")


def _pods_of(claim: DraClaim) -> list[str]:
    names = {f"{p.namespace}/{p.name}" if p.name else f"pod {p.uid}" for p, _, _ in claim.containers}
    return sorted(names) or [f"pod {u}" for u in claim.pod_uids]


def _access(access: GpuAccessFacts | None, pod_uid: str, cid: str) -> ContainerAccess | None:
    for ca in access.containers if access is not None else []:
        if ca.pod.uid == pod_uid and ca.container.id == cid:
            return ca
    return None


def _claim_paths(claim: DraClaim) -> set[str] | None:
    """Every device node path a container of the claim gets from its spec; None when no spec is read."""
    sf = claim.spec
    if sf is None or sf.spec is None:
        return None
    paths: set[str] = set()
    names = [cid.partition("=")[2] for cid in claim.cdi_ids() if cid.partition("=")[0] == sf.spec.kind]
    if not names or any(n not in sf.spec.devices for n in names):
        return None  # the claim's device is not in its spec: unresolvable, not a spec short of nodes
    for name in names:
        for e in sf.spec.edits_for(name):
            paths |= e.paths()
    return paths


def claim_spec_lacks(facts: NodeFacts, path: str) -> set[tuple[str, str]]:
    """(pod uid, container id) of the containers that got a DRA claim whose spec lacks `path`
    (for the device-plugin rules to leave them to GPU-DRA-010), and of every container of the pods
    of a claim whose spec holds impossible values, or that a claim state read as impossible names:
    which of them a claim reached, and what its spec gave them, is not known, and damage confirms
    nothing (the file's gap says so)."""
    dra: DraFacts | None = facts.maybe("dra")
    out: set[tuple[str, str]] = set()
    ctrs = facts.maybe("containers")
    unknown = set(dra.damaged_pods) if dra is not None else set()
    for claim in dra.claims if dra is not None else []:
        if claim.spec_problem:
            unknown |= set(claim.pod_uids)
    for pod in ctrs.pods if ctrs is not None and unknown else []:  # O(pods): a damaged file may name many
        if pod.uid in unknown:
            out |= {(pod.uid, c.id) for c in pod.containers}
    for claim in dra.claims if dra is not None else []:
        paths = _claim_paths(claim)
        if paths is not None and path not in paths:
            out |= {(p.uid, c.id) for p, c, _ in claim.containers}
    return out


def _gpu_nodes(claim: DraClaim, driver: DriverFacts) -> list[str]:
    out = []
    for uuid in claim.gpu_uuids():
        g = driver.gpu_by_uuid(uuid)
        if g is not None and g.minor is not None:
            out.append(f"/dev/nvidia{g.minor}")
    return out


# -- GPU-DRA-010 -------------------------------------------------------------------------------------

@rule(
    "GPU-DRA-010",
    title="A DRA claim's CDI spec lacks /dev/nvidia-uvm, /dev/nvidiactl or its GPU's node",
    severity=Severity.HIGH,
    family="device-access",
    needs=("dra", "driver"),
    uses=("gpu_access",),
    automation="A2 (recreate the claim's pods)",
    remedy="""
        1. Make sure the host nodes exist: `nvidia-modprobe -u -c=0` (creates /dev/nvidia-uvm and -tools;
           `ls -l /dev/nvidia*`).
        2. If the DRA kubelet plugin's own /dev lacks the node (`ls /dev/nvidia-uvm` run in this node's
           gpu-kubelet-plugin pod), restart that plugin pod so its device discovery sees it.
        3. Recreate only the pods named here: deleting a pod unprepares its claim (the driver deletes the
           spec) and the new pod's claim is prepared with a new spec. Other GPU pods of the node are not affected.
        Prevention: create the nodes at boot before the kubelet and the DRA driver start (a unit running
        `nvidia-modprobe -u -c=0`, or nvidia-persistenced).
    """,
    references=("incident 1 (shared/incidents/1-uvm-missing-after-device-plugin-start.zh.md), in its DRA form",
                "kubernetes-sigs/dra-driver-nvidia-gpu#1380 (missing device nodes only warned)",
                "kubernetes-sigs/dra-driver-nvidia-gpu PR #1458") + DRA_REFS,
)
def claim_spec_missing_nodes(facts: NodeFacts) -> Iterator[Hit]:
    """The NVIDIA DRA driver writes one CDI spec per prepared claim
    (`k8s.gpu.nvidia.com-claim_<claimUID>.yaml`) from the device nodes its device discovery finds;
    a node it cannot see (not yet created, or absent from the plugin's /dev) is only a warning in its
    log, and the spec goes out without it. The runtime creates the container from that spec, so its
    device cgroup lacks the node: CUDA fails (no nvidia-uvm: 'unknown error'; no nvidiactl or GPU
    node: no device) while the pod looks Running.

    Reads the kubelet's `dra_manager_state` and the driver's checkpoint (claim, pods, GPU UUID, CDI
    device IDs), the claim's spec as CDI resolves it (spec-wide and per-device `deviceNodes`), the
    host's nodes and GPUs (driver), and each of the claim's containers' device policy (gpu_access).
    Only nodes the host has are required (a host without nvidia-uvm is GPU-DRV-003's).

    CONFIRMED (high): the claim's spec lacks a required node and a container that got the claim
    is denied it by its device policy. AT-RISK (medium): the spec lacks it but no container's policy
    could be read as denying it (no container yet, or the policy unread): the next container of the
    claim will be.
    """
    dra: DraFacts = facts.get("dra")
    driver: DriverFacts = facts.get("driver")
    access: GpuAccessFacts | None = facts.maybe("gpu_access")
    for claim in dra.claims:
        paths = _claim_paths(claim)
        if paths is None or claim.spec is None:
            continue
        required = [CTL] + ([UVM] if driver.uvm_major is not None and UVM in driver.nodes else [])
        required += _gpu_nodes(claim, driver)
        missing = [p for p in required if p not in paths and p in driver.nodes]
        if not missing:
            continue
        ev = [Evidence(claim.spec.path, f"deviceNodes: {', '.join(sorted(paths)) or 'none'} (no {', '.join(missing)})")]
        ev += [Evidence(s, f"claim {claim.ref} uid {claim.uid}, pods {', '.join(claim.pod_uids) or 'none'}")
               for s in claim.sources[:1]]
        ev += [Evidence(p, "char {}:{} on the host".format(driver.nodes[p].major, driver.nodes[p].minor)) for p in missing]
        denied = []
        for pod, c, why in claim.containers:
            ev.append(Evidence(why.split(": ", 1)[0], why.split(": ", 1)[-1]))
            ca = _access(access, pod.uid, c.id)
            verdicts = [ca.verdict(p) for p in missing] if ca is not None else []
            no = [v for v in verdicts if v is not None and v.allowed is False]
            ev += [Evidence(v.source, f"{v.node.path} ({v.node.rule}): {v.evidence}") for v in no[:MAX_QUOTED]]
            if no:
                denied.append((pod, c))
        pods = _pods_of(claim)
        what = ", ".join(missing)
        affected = [_claim_who(claim)] + [_ctr_who(p, c) for p, c in (denied or [(p, c) for p, c, _ in claim.containers])]
        data = {"claim": claim.uid, "missing": missing, "pods": pods}
        if denied:
            yield Hit(Status.CONFIRMED,
                      f"Claim {claim.ref}'s CDI spec lacks {what}, and {len(denied)} container(s) of "
                      f"{', '.join(pods)} are denied it: CUDA fails in them while nvidia-smi may work. "
                      f"Recreate only these pods.",
                      affected=affected, evidence=ev, mechanism="claim spec written without " + what, data=data)
        else:
            yield Hit(Status.AT_RISK,
                      f"Claim {claim.ref}'s CDI spec lacks {what}: a container created from it "
                      f"({', '.join(pods)}) gets no such device; no container's device policy was read to deny it yet.",
                      affected=affected, evidence=ev, severity=Severity.MEDIUM,
                      mechanism="claim spec written without " + what, data=data)


# -- GPU-DRA-011 -------------------------------------------------------------------------------------

@rule(
    "GPU-DRA-011",
    title="A DRA claim's CDI spec is stale: device numbers or driver libraries no longer match the node",
    severity=Severity.HIGH,
    family="device-access",
    needs=("dra", "driver"),
    uses=(),
    automation="A2 (recreate the claim's pods)",
    remedy="""
        1. If the driver was reloaded or upgraded, make sure the DRA kubelet plugin runs against the new one
           (restart its pod on this node: its CDI cache and device discovery predate the reload).
        2. Recreate the pods named here: their claims are unprepared (the stale spec deleted) and prepared
           again with a spec of the loaded driver. Containers created from the stale spec cannot be fixed in place.
        The node's own spec is GPU-DEV-004's (`nvidia-ctk cdi generate`); a claim's spec is the DRA driver's.
    """,
    references=("NVIDIA/NemoClaw#4733 (stale CDI spec after a driver reload: nvidia-smi works, cuInit fails)",
                "Azure/AgentBaker#8736", "catalog GPU-DEV-004 (the node spec's form)") + DRA_REFS,
)
def claim_spec_stale(facts: NodeFacts) -> Iterator[Hit]:
    """The same staleness GPU-DEV-004 finds in the node's spec, per claim: a claim's spec written
    before a driver reload or upgrade keeps the old dynamic majors (nvidia-caps, nvidia-uvm when
    the spec records numbers), names device nodes the host no longer has (a GPU gone, MIG devices
    recreated), or mounts driver libraries of another version than the loaded module. Containers
    created from it get rules for a dead major, fail to start, or load the wrong libcuda.

    Reads each claim's spec (`deviceNodes` with major/minor and hostPath, `mounts` hostPath with
    the version in libcuda.so.<ver>-style names), /proc/devices, the host's NVIDIA nodes (stat) and
    the loaded module's version (driver).

    CONFIRMED (high): a deviceNode whose major differs from /proc/devices', whose minor differs
    from the live node's, or whose node is absent on the host (NVIDIA nodes only, where /proc/devices
    names the major); or libraries of another version than the loaded module. Names the claim and
    its pods.
    """
    dra: DraFacts = facts.get("dra")
    driver: DriverFacts = facts.get("driver")
    majors = driver.devices.nvidia_majors()
    module = driver.version.version if driver.version else None
    if not majors:
        return
    for claim in dra.claims:
        sf = claim.spec
        if sf is None or sf.spec is None:
            continue
        found: list[Evidence] = []
        versions: set[str] = set()
        for edits in [sf.spec.common] + list(sf.spec.devices.values()):
            for dn in edits.device_nodes:
                host = dn.host_path or dn.path
                name, want = expected_major(host, majors)
                if want is None:
                    continue
                live = driver.nodes.get(host)
                if dn.major is not None and dn.major != want:
                    found.append(Evidence(sf.path, f"deviceNodes {dn.path} major {dn.major}, but /proc/devices says {want} {name}"))
                elif live is None and host.startswith("/dev/nvidia") and not host.startswith("/dev/nvidia-caps"):
                    found.append(Evidence(sf.path, f"deviceNodes {dn.path}: {host} does not exist on the host"))
                elif (live is not None and dn.minor is not None and live.minor is not None and dn.minor != live.minor):
                    found.append(Evidence(sf.path, f"deviceNodes {dn.path} minor {dn.minor}, but {host} is char {live.major}:{live.minor}"))
            for hp in edits.mount_hosts:
                if m := LIB_VERSION.search(hp):
                    versions.add(m.group(1))
        if module and versions and module not in versions:
            found.append(Evidence(sf.path, f"mounts driver libraries of version {', '.join(sorted(versions))}; "
                                           f"the loaded module is {module}"))
            found.append(Evidence("/proc/driver/nvidia/version", driver.version.line))
        if not found:
            continue
        pods = _pods_of(claim)
        yield Hit(Status.CONFIRMED,
                  f"Claim {claim.ref}'s CDI spec no longer matches the loaded driver: containers of {', '.join(pods)} "
                  "created from it get a dead device major, a missing node or old driver libraries.",
                  affected=[_claim_who(claim)] + [_ctr_who(p, c) for p, c, _ in claim.containers],
                  evidence=found[:2 * MAX_QUOTED] + [Evidence(s, f"claim {claim.ref} uid {claim.uid}") for s in claim.sources[:1]],
                  mechanism="stale claim spec", data={"claim": claim.uid, "pods": pods})


# -- GPU-DRA-012 -------------------------------------------------------------------------------------

@rule(
    "GPU-DRA-012",
    title="Both the NVIDIA device plugin and the NVIDIA DRA driver serve this node's GPUs",
    severity=Severity.HIGH,
    family="allocation",
    needs=("dra",),
    uses=("kubelet", "plugin_sockets"),
    automation="A3",
    remedy="""
        Pick one allocation mode per node: with the GPU Operator >= 26.7 set the node's mode (device plugin
        or DRA) so that only one of them is deployed there; otherwise label the node out of one DaemonSet
        (`nodeSelector`/`affinity`). Then recreate the pods whose GPU is held twice (named here).
    """,
    references=("NVIDIA/gpu-operator commit e81d0b268 (per-node choice between device plugin and DRA)",
                "kubernetes KEP-5004 (DRA for extended resources)") + DRA_REFS,
)
def both_allocators(facts: NodeFacts) -> Iterator[Hit]:
    """The device plugin advertises every GPU as `nvidia.com/gpu` and the DRA driver publishes the
    same GPUs as devices of its ResourceSlices; neither knows of the other, so the scheduler can give
    one GPU to a pod of each: two tenants on one GPU, with neither's isolation or limits.

    Reads the DRA driver's registration socket and checkpoint (dra), the device plugin's socket in
    the kubelet's device-plugins directory (plugin_sockets) and the kubelet's device checkpoint
    (registered and allocated `nvidia.com/*` device IDs).

    CONFIRMED (high): a GPU (by UUID) allocated by the device plugin to one pod and prepared by the
    DRA driver for a claim at the same time. AT-RISK (medium): both are registered with the kubelet
    (the device plugin's socket or its registered devices, and the DRA driver's registration socket).
    """
    dra: DraFacts = facts.get("dra")
    if not dra.nvidia:
        return
    kub = facts.maybe("kubelet")
    socks = facts.maybe("plugin_sockets")
    cp = kub.checkpoint if kub is not None else None
    dp_registered = {r: ids for r, ids in (cp.registered.items() if cp else []) if r.startswith("nvidia.com/") and ids}
    dp_socks = socks.nvidia if socks is not None else []
    dra_reg = dra.registration.get("gpu.nvidia.com")
    if not (dp_registered or dp_socks) or dra_reg is None or not dra_reg.present:
        return
    held: dict[str, list[str]] = {}
    for e in cp.entries if cp else []:
        if e.resource.startswith("nvidia.com/"):
            for i in e.device_ids:
                held.setdefault(base_device_id(i), []).append(f"pod {e.pod_uid} container {e.container} ({e.resource})")
    both = []
    for claim in dra.claims:
        for uuid in claim.gpu_uuids():
            if uuid in held:
                both.append((uuid, claim))
    ev = [Evidence(dra_reg.path, "DRA driver gpu.nvidia.com registration socket")]
    ev += [Evidence(f"{socks.directory}/{s}", "device plugin socket") for s in dp_socks[:2]] if socks else []
    ev += [Evidence(kub.checkpoint_path, f"RegisteredDevices {r}: {len(ids)} device(s)") for r, ids in dp_registered.items()] if kub else []
    if both:
        for uuid, claim in both[:MAX_QUOTED]:
            ev.append(Evidence(kub.checkpoint_path, f"{uuid} held by " + "; ".join(held[uuid][:2])))
            ev.append(Evidence(dra.checkpoint_path, f"{uuid} prepared for claim {claim.ref} (pods {', '.join(_pods_of(claim))})"))
        yield Hit(Status.CONFIRMED,
                  f"{len({u for u, _ in both})} GPU(s) are allocated twice: by the device plugin to a pod and by the DRA "
                  "driver to a claim. Two tenants share a GPU neither was promised.",
                  affected=[Affected("gpu", u) for u in sorted({u for u, _ in both})] + [_claim_who(c) for _, c in both],
                  evidence=ev, mechanism="device plugin and DRA driver on one node",
                  data={"gpus": sorted({u for u, _ in both})})
    else:
        yield Hit(Status.AT_RISK,
                  "The NVIDIA device plugin and the NVIDIA DRA driver are both registered with this node's kubelet: "
                  "each offers the same GPUs, and the scheduler can give one GPU to a pod of each.",
                  affected=[Affected("node", "allocation mode", detail="device plugin + DRA")], evidence=ev,
                  severity=Severity.MEDIUM, mechanism="device plugin and DRA driver on one node", data={"gpus": []})


# -- GPU-DRA-013 -------------------------------------------------------------------------------------

IDLE_DEADLOCK = "kubelet-dra-idle-deadlock"


def _kubelet_version(facts: NodeFacts) -> tuple[str | None, list[Evidence]]:
    got = events(facts, "kubelet.version", logs=("kubelet",))
    if not got:
        return None, []
    last = got[-1]
    return last.fields.get("version"), [last.evidence()]


@rule(
    "GPU-DRA-013",
    title="Kubelet 1.34.0-1.34.1 with a DRA driver: NodePrepareResources stops reaching the driver after 30 idle minutes",
    severity=Severity.HIGH,
    family="allocation",
    needs=("dra", "logs"),
    uses=("boot",),
    automation="A3",
    remedy="""
        1. Restart the kubelet on this node (`systemctl restart kubelet`): the pods stuck in ContainerCreating then
           get their claims prepared. This clears the deadlock until the connection idles again.
        2. Upgrade the kubelet to 1.34.2 or later (1.35+ is fixed too).
    """,
    references=known_versions.references(IDLE_DEADLOCK),
)
def kubelet_idle_deadlock(facts: NodeFacts) -> Iterator[Hit]:
    """Kubelet 1.34.0 and 1.34.1 deadlock in gRPC's idle manager when their connection to a DRA
    driver has been idle for 30 minutes: from then on no NodePrepareResources (or Unprepare) reaches
    the driver, and new pods with claims stay in ContainerCreating with a single Scheduled Event, no
    kubelet error and nothing in the driver's log; a kubelet restart clears it.

    Reads the kubelet's version (its "Kubelet version" start line, current boot), the DRA driver's
    registration, the kubelet's `dra_manager_state` (a claim it recorded for a pod with the NVIDIA
    driver but with no device from it: its prepare has not returned), the driver's checkpoint (the
    claim absent, or only PrepareStarted) and the plugin's log ("Returning newly prepared devices for
    claim ...").

    AT-RISK (high): an affected kubelet and a claim waiting for a prepare that never reached the
    driver (the driver's checkpoint lacks it or holds only PrepareStarted, and its log shows no prepare of it): most likely this deadlock (a plugin hung before its checkpoint looks the same from the
    node; the plugin probe tells them apart). AT-RISK (medium): an affected kubelet with the NVIDIA
    DRA driver registered and no claim waiting yet. Never CONFIRMED from the node alone.
    """
    dra: DraFacts = facts.get("dra")
    if not (dra.nvidia or any(c.drivers for c in dra.claims)):
        return
    version, ev = _kubelet_version(facts)
    m = known_versions.get(IDLE_DEADLOCK).check(version) if version else None
    if m is None or not m.affected:
        return
    prepared = {e.fields.get("claim", "") for e in events(facts, "plugin.dra.prepared", logs=("pod",))}
    waiting = []
    for c in dra.claims:
        if not c.in_kubelet_state or "gpu.nvidia.com" not in c.drivers or c.prepared_by_kubelet("gpu.nvidia.com"):
            continue
        if c.prepare_state == "PrepareCompleted" or f"{c.namespace}/{c.name}:{c.uid}" in prepared:
            continue  # the driver did prepare it: the call reached it
        waiting.append(c)
    ev.append(Evidence(dra.state_path, "; ".join(
        f"claim {c.ref} (pods {', '.join(c.pod_uids) or 'none'}): no gpu.nvidia.com device recorded" for c in waiting[:MAX_QUOTED])
        if waiting else "no claim waiting for a prepare"))
    if dra.checkpoint_read:
        ev.append(Evidence(dra.checkpoint_path, "; ".join(
            f"claim {c.uid}: {c.prepare_state or 'absent'}" for c in waiting[:MAX_QUOTED]) or "read"))
    fix = f"; upgrade to {m.fix}" if m.fix else ""
    if waiting:
        yield Hit(Status.AT_RISK,
                  f"Kubelet {version} has the DRA idle-connection deadlock and {len(waiting)} claim(s) "
                  f"({', '.join(c.ref for c in waiting[:MAX_QUOTED])}) wait for a NodePrepareResources that never "
                  f"reached the driver: their pods stay in ContainerCreating. Restart the kubelet{fix}.",
                  affected=[Affected("node", "kubelet", detail=version or "")] + [_claim_who(c) for c in waiting],
                  evidence=ev, mechanism="kubelet DRA gRPC idle deadlock",
                  data={"kubelet": version, "claims": [c.uid for c in waiting]})
    else:
        yield Hit(Status.AT_RISK,
                  f"Kubelet {version} has the DRA idle-connection deadlock (kubernetes#133920): after 30 idle minutes "
                  f"pods with claims will hang in ContainerCreating until the kubelet restarts{fix}.",
                  affected=[Affected("node", "kubelet", detail=version or "")], evidence=ev, severity=Severity.MEDIUM,
                  mechanism="kubelet DRA gRPC idle deadlock", data={"kubelet": version, "claims": []})
