"""The `dra` fact: what a node that allocates GPUs through DRA holds on disk, joined per claim.

Reads, under the kubelet's root directory: the kubelet's claim state (`dra_manager_state`: claim,
its pods, each driver's devices and CDI device IDs), the NVIDIA DRA driver's checkpoint
(`plugins/gpu.nvidia.com/checkpoint.json`: prepared claims, their GPUs by UUID, prepare state), the
registration sockets (`plugins_registry/<driver>-reg.sock`) and service sockets
(`plugins/<driver>/dra.sock`) by existence and type only (probing them is probes' work), and joins
each claim with its CDI spec (the `cdi` fact) and the containers that got its devices (the
`containers` fact): a container of one of the claim's pods whose OCI spec carries the claim's
CDI device IDs in a `cdi.k8s.io/` annotation, or the device nodes of the claim's spec in
`linux.devices`.

Empty (no claims, no driver) where the kubelet's plugins_registry is listed with no DRA driver in it
and no claim state exists: not a DRA node. Unavailable when none of these could be read.
"""

from __future__ import annotations

from msgspec import Struct, field

from gpuwarden.facts.cdi import CdiFacts, SpecFile
from gpuwarden.facts.containers import Container, ContainerFacts, Pod
from gpuwarden.facts.node import FactUnavailable, NodeFacts, NotApplicable, fact
from gpuwarden.parsers import dra_checkpoint
from gpuwarden.parsers.dra_checkpoint import ClaimDevice
from gpuwarden.root import Missing, StatInfo

DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"
NVIDIA_DRIVER = "gpu.nvidia.com"
STATE_MAX = 16 << 20


class DraSocket(Struct):
    """A DRA kubelet plugin's socket (registration or service)."""
    path: str
    kind: str  # the root's kind: "other" for a socket (roots do not tell sockets from fifos), "missing" …

    @property
    def present(self) -> bool:
        return self.kind == "other"


class DraClaim(Struct):
    """A resource claim prepared on this node, joined from both checkpoints and its CDI spec."""
    uid: str
    name: str
    namespace: str
    pod_uids: tuple[str, ...]
    devices: list[ClaimDevice]  # of every driver (the kubelet's view, with the NVIDIA driver's UUIDs added)
    prepare_state: str = ""  # the NVIDIA driver's checkpointState, "" when it does not know the claim
    spec: SpecFile | None = None  # the NVIDIA driver's CDI spec for this claim
    sources: list[str] = field(default_factory=list)
    #: (pod, container) that got the claim's devices, and the evidence line for each
    containers: list[tuple[Pod, Container, str]] = field(default_factory=list)
    #: the drivers the kubelet's state lists for the claim (one with no devices has not prepared it)
    drivers: tuple[str, ...] = ()
    in_kubelet_state: bool = False
    #: its spec file was read but holds values no node has ("<path>: <why>"): the claim has no spec to
    #: judge, and the device-plugin rules leave its pods' containers alone too
    spec_problem: str = ""

    def prepared_by_kubelet(self, driver: str) -> bool:
        """The kubelet recorded devices of `driver` for this claim: its NodePrepareResources returned."""
        return any(d.driver == driver for d in self.devices)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.name else f"claim {self.uid}"

    def cdi_ids(self) -> list[str]:
        return sorted({i for d in self.devices for i in d.cdi_ids})

    def gpu_uuids(self) -> list[str]:
        return sorted({d.uuid for d in self.devices if d.uuid})


class DraFacts(Struct):
    """The node's DRA state: checkpoints read and the claims prepared."""
    kubelet_root: str
    state_path: str
    state_read: bool  # the kubelet's dra_manager_state was read and parsed
    checkpoint_path: str
    checkpoint_read: bool
    claims: list[DraClaim]
    #: driver name -> its registration socket; driver name -> its service socket
    registration: dict[str, DraSocket] = field(default_factory=dict)
    service: dict[str, DraSocket] = field(default_factory=dict)
    boot_id: str = ""  # the boot the NVIDIA driver last validated its checkpoint in
    problems: list[str] = field(default_factory=list)
    #: the pods a claim state read as impossible names: nothing is concluded about their containers
    damaged_pods: tuple[str, ...] = ()

    def claim(self, uid: str) -> DraClaim | None:
        return next((c for c in self.claims if c.uid == uid), None)

    @property
    def nvidia(self) -> bool:
        """The NVIDIA DRA driver is (or was) on this node: its socket, directory state or claims."""
        return NVIDIA_DRIVER in self.registration or NVIDIA_DRIVER in self.service or self.checkpoint_read


def _sock(facts: NodeFacts, path: str) -> DraSocket:
    st = facts.root.stat(path, follow=False)
    return DraSocket(path, st.kind if isinstance(st, StatInfo) else st.kind)


def _spec_paths(spec: SpecFile | None, claim: DraClaim) -> set[str]:
    if spec is None or spec.spec is None:
        return set()
    paths: set[str] = set()
    for name in spec.spec.devices:
        if name.startswith(claim.uid):
            for e in spec.spec.edits_for(name):
                paths |= e.paths()
    return paths


def _join_containers(claim: DraClaim, ctrs: ContainerFacts | None) -> None:
    if ctrs is None:
        return
    ids = set(claim.cdi_ids())
    nodes = {p for p in _spec_paths(claim.spec, claim) if p.startswith("/dev/nvidia") and p[11:].isdigit()}
    for uid in claim.pod_uids:
        pod = ctrs.pod_by_uid(uid)
        for c in pod.containers if pod is not None else []:
            if c.sandbox:
                continue
            named = sorted(k for k, v in c.annotations.items()
                           if k.startswith("cdi.k8s.io/") and ids & {x.strip() for x in v.split(",")})
            if named:
                claim.containers.append((pod, c, f"{c.spec_source}: annotation {named[0]}={c.annotations[named[0]]}"))
                continue
            got = sorted(nodes & {str(d.get("path", "")) for d in c.spec_devices or []})
            if got:
                claim.containers.append((pod, c, f"{c.spec_source}: linux.devices has {', '.join(got)} of the claim's spec"))


def _no_dra(facts: NodeFacts, out: DraFacts, reg: list[str] | Missing) -> None:
    """No DRA driver registered or serving, no claim state: NotApplicable when that is what the node shows,
    FactUnavailable when it is only what could not be read.

    Not a DRA node: its kubelet directory is there, neither state file exists, and the plugin registry
    lists no DRA driver or does not exist. A registry or a state file that cannot be read (denied, an
    error), or no kubelet directory at all (an empty root), is a gap: DRA may be there unseen.
    """
    unread = [p for p in (out.state_path, out.checkpoint_path)
              if isinstance(st := facts.root.stat(p), Missing) and st.kind != "missing"]
    kubelet = facts.root.listdir(out.kubelet_root)
    if not unread and not isinstance(kubelet, Missing) and (not isinstance(reg, Missing) or reg.kind == "missing"):
        listed = "lists no DRA driver" if not isinstance(reg, Missing) else "does not exist"
        raise NotApplicable(f"no DRA on this node: no claim state ({out.state_path}, {out.checkpoint_path}) and "
                            f"{out.kubelet_root}/plugins_registry {listed}")
    why = f"{unread[0]} unreadable" if unread else (
        f"{out.kubelet_root} not listed ({kubelet.kind})" if isinstance(kubelet, Missing) else
        f"{out.kubelet_root}/plugins_registry not listed ({reg.kind})" if isinstance(reg, Missing) else "")
    raise FactUnavailable(f"no DRA state on this node ({out.state_path}, {out.checkpoint_path}) and {why}")


def _malformed(facts: NodeFacts, out: DraFacts, path: str, why: str) -> None:
    """A checkpoint read but not one its writer could produce: no claim is taken from it, and the
    report says so once (a gap), however many entries it repeats."""
    out.problems.append(f"{path}: {why}")
    facts.gap(path, f"unreadable (malformed): {why}")


@fact("dra")
def collect_dra(facts: NodeFacts) -> DraFacts:
    kub = facts.maybe("kubelet")
    root = kub.root_dir if kub is not None else DEFAULT_KUBELET_ROOT
    out = DraFacts(root, f"{root}/dra_manager_state", False, f"{root}/plugins/{NVIDIA_DRIVER}/checkpoint.json", False, [])
    reg = facts.root.listdir(f"{root}/plugins_registry")
    for n in sorted(reg) if not isinstance(reg, Missing) else []:
        if n.endswith("-reg.sock") and "." in n[:-9]:  # DRA drivers are DNS names; device plugins register elsewhere
            driver = n[:-9]
            out.registration[driver] = _sock(facts, f"{root}/plugins_registry/{n}")
    plugins = facts.root.listdir(f"{root}/plugins")
    for d in sorted(plugins) if not isinstance(plugins, Missing) else []:
        if "." in d:
            s = _sock(facts, f"{root}/plugins/{d}/dra.sock")
            if s.kind != "missing" or d in out.registration:
                out.service[d] = s
    kclaims: list[dra_checkpoint.KubeletClaim] = []
    text = facts.read_text(out.state_path, STATE_MAX)
    if text is not None:
        state = dra_checkpoint.parse_kubelet(text)
        if state is None or state.problem:
            _malformed(facts, out, out.state_path, state.problem if state else "not a DRA checkpoint (unparsable)")
            out.damaged_pods = state.pod_uids if state else ()
        else:
            out.state_read, kclaims = True, state.claims
    dcp = None
    text = facts.read_text(out.checkpoint_path, STATE_MAX)
    if text is not None:
        dcp = dra_checkpoint.parse_driver(text, NVIDIA_DRIVER)
        if dcp is None or dcp.problem:
            _malformed(facts, out, out.checkpoint_path, dcp.problem if dcp else "not the driver's checkpoint (unparsable)")
            dcp = None
        else:
            out.checkpoint_read, out.boot_id = True, dcp.boot_id
    if not (out.state_read or out.checkpoint_read or out.registration or out.service or out.problems):
        _no_dra(facts, out, reg)  # raises: not a DRA node, or its evidence unreadable
    cdi: CdiFacts | None = facts.maybe("cdi")
    specs = cdi.claim_specs() if cdi is not None else {}
    damaged = {u: f"{f.path}: {f.problem}" for u, f in (cdi.damaged_claim_specs() if cdi is not None else {}).items()}
    prepared = dict(dcp.claims) if dcp is not None else {}
    for kc in kclaims:
        pc = prepared.pop(kc.uid, None)
        uuids = {d.device: d for d in pc.devices} if pc is not None else {}
        devs = [ClaimDevice(d.driver, d.pool, d.device, d.cdi_ids, uuids[d.device].uuid, uuids[d.device].kind)
                if d.driver == NVIDIA_DRIVER and d.device in uuids else d for d in kc.devices]
        srcs = [out.state_path] + ([out.checkpoint_path] if pc is not None else [])
        out.claims.append(DraClaim(kc.uid, kc.name, kc.namespace, kc.pod_uids, devs,
                                   pc.state if pc is not None else "", specs.get(kc.uid), srcs,
                                   drivers=kc.drivers, in_kubelet_state=True, spec_problem=damaged.get(kc.uid, "")))
    for pc in prepared.values():  # prepared by the driver, unknown to the kubelet (or its state unread)
        out.claims.append(DraClaim(pc.uid, pc.name, pc.namespace, (), list(pc.devices), pc.state, specs.get(pc.uid),
                                   [out.checkpoint_path], spec_problem=damaged.get(pc.uid, "")))
    ctrs = facts.maybe("containers")
    for c in out.claims:
        _join_containers(c, ctrs)
    return out
