"""The plan: which actions the raised findings call for on this node, given the cluster's state.

A pure function of (findings, cluster state, options, when the device plugin was last restarted):
no API calls, so dry-run prints exactly what `on` would try, and tests need no cluster. The
executor then applies the run-time guards (breaker, cooldown, rate limit) to each action.

| finding | action(s) |
|---|---|
| GPU-DEV-001 with a stale plugin (`data.stale_plugin`, or the at-risk "snapshot predates") | restart-device-plugin (delete its pod on this node; its DaemonSet recreates it), then — once a newer plugin pod is Ready — delete-pod for each affected pod |
| GPU-DEV-001 caused by a node CDI spec without nvidia-uvm (`data.cause` `stale-cdi-spec`) | none: delete-pod is withheld (a new pod would get the same spec) until the spec is regenerated |
| GPU-DEV-001 without a stale plugin, GPU-DEV-002, GPU-DEV-003 (confirmed) | delete-pod for each affected pod (its device cgroup is fixed at creation) |
| critical confirmed GPU-DRV-* / GPU-HW-* | taint-node `<taint_key>=<family>:NoSchedule` or cordon-node |
| the same, naming some but not all GPUs of a DRA node (each one a device of the node's ResourceSlices) | taint-device: a DeviceTaintRule on exactly each named device (`<taint_key>=<family>`, NoSchedule; NoExecute only with device_taint_effect) instead of the node taint |
| a DeviceTaintRule of ours whose device no raised finding names any more | untaint-device (delete it) |
| GPU-NODE-001 (confirmed) with an attributed pod in `data` | evict-pod-for-memory (the eviction API, so PodDisruptionBudgets apply) |
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from msgspec import Struct, field
from msgspec.structs import asdict

from gpuwarden.findings import Finding, Severity, Status
from gpuwarden.parsers.wallclock import rfc3339_epoch
from gpuwarden.remediation.guard import protected_node, protected_pod

KINDS = ("untaint-device", "taint-device", "taint-node", "cordon-node", "restart-device-plugin", "delete-pod",
         "evict-pod-for-memory", "untaint-node")
_ORDER = {k: i for i, k in enumerate(KINDS)}
POD_KINDS = ("restart-device-plugin", "delete-pod", "evict-pod-for-memory")


class Target(Struct, frozen=True):
    kind: str  # "Pod" | "Node" | "Device" (name: driver/pool/device)
    name: str
    namespace: str = ""
    uid: str = ""
    #: a pod's controller ownerReference (kind, name) and its creationTimestamp: what the cascade controller
    #: needs to follow the workload when the pod is gone before it looked (docs/controller.md)
    owner: tuple[str, str] | None = None
    created: str = ""

    @property
    def ref(self) -> str:
        return f"{self.kind.lower()} {self.namespace + '/' if self.namespace else ''}{self.name}"

    @property
    def key(self) -> str:
        """Cooldown key: namespace/name (a StatefulSet successor keeps the name), or the node name."""
        if self.kind == "Device":
            return f"device/{self.name}"
        return f"{self.namespace}/{self.name}" if self.kind == "Pod" else f"node/{self.name}"


class Action(Struct):
    kind: str
    target: Target
    code: str  # the finding that calls for it
    why: str  # one line
    detail: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        extra = ""
        if self.kind in ("taint-node", "untaint-node"):
            t = self.detail.get("taint", {})
            extra = f" {t.get('key')}={t.get('value')}:{t.get('effect')}"
        elif self.kind in ("taint-device", "untaint-device"):
            rule = self.detail.get("rule") or {}
            t = (rule.get("spec") or {}).get("taint") or {}
            extra = f" DeviceTaintRule {(rule.get('metadata') or {}).get('name', '')}" + (
                f" {t.get('key')}={t.get('value', '')}:{t.get('effect')}" if self.kind == "taint-device" else "")
        uid = f" (uid {self.target.uid})" if self.target.uid else ""
        return f"{self.kind} {self.target.ref}{uid}{extra} — {self.code}: {self.why}"

    def to_json(self) -> dict:
        return {"action": self.kind, "target": asdict(self.target), "code": self.code, "why": self.why,
                "detail": self.detail}


class WithheldAction(Struct):
    kind: str
    target: Target | None
    code: str
    why: str

    def describe(self) -> str:
        tgt = f" {self.target.ref}" if self.target else ""
        return f"{self.kind}{tgt} — {self.code}: {self.why}"


class RemediationPlan(Struct):
    node: str
    actions: list[Action] = field(default_factory=list)
    skipped: list[WithheldAction] = field(default_factory=list)  # guards: never touched
    deferred: list[WithheldAction] = field(default_factory=list)  # later: waits for something

    def empty(self) -> bool:
        return not (self.actions or self.skipped or self.deferred)

    def render(self) -> str:
        lines = [f"remediation plan for node {self.node}: {len(self.actions)} action(s)"]
        lines += [f"  {i}. {a.describe()}" for i, a in enumerate(self.actions, 1)]
        lines += [f"  deferred: {d.describe()}" for d in self.deferred]
        lines += [f"  never: {s.describe()}" for s in self.skipped]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"node": self.node, "actions": [a.to_json() for a in self.actions],
                "deferred": [d.describe() for d in self.deferred], "skipped": [s.describe() for s in self.skipped]}

    def signature(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True, default=str)


class ClusterState(Struct):
    node: dict
    pods: list[dict]  # every pod bound to the node
    plugin_pods: list[dict]  # the device-plugin pods among them (or elsewhere on the node)
    #: a DRA node: its ResourceSlices of the GPU driver (kube.dra.NodeSlices) and gpuwarden's own
    #: DeviceTaintRules of the node; None: not read (no device fence is planned, none removed)
    dra: Any = None
    device_rules: list[dict] = field(default_factory=list)
    #: the DeviceTaintRule version the API server serves (kube.dra.taint_rule_version)
    taint_rule_version: str = ""


class Options(Struct):
    node_fault_action: str = "taint"
    taint_key: str = "gpuwarden.io/unhealthy"
    delete_unowned_pods: bool = False
    plugin_label_selector: str = "app.kubernetes.io/name=nvidia-device-plugin"
    plugin_name_prefix: str = "nvidia-device-plugin"
    device_taint_effect: str = "NoSchedule"


# --- helpers ----------------------------------------------------------------------------------------


def _md(obj: dict) -> dict:
    return obj.get("metadata") or {}


def pod_target(pod: dict) -> Target:
    md = _md(pod)
    refs = md.get("ownerReferences") or []
    ref = next((o for o in refs if o.get("controller")), refs[0] if refs else None)
    owner = (str(ref.get("kind", "")), str(ref.get("name", ""))) if isinstance(ref, dict) and ref.get("name") else None
    return Target("Pod", md.get("name", ""), md.get("namespace", ""), md.get("uid", ""), owner,
                  str(md.get("creationTimestamp") or ""))


def _labels_match(labels: dict, selector: str) -> bool:
    """Equality-based selectors only: `k=v`, `k==v`, `k!=v`, `k`, `!k`."""
    for term in filter(None, (s.strip() for s in selector.split(","))):
        if "!=" in term:
            k, v = (x.strip() for x in term.split("!=", 1))
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = (x.strip() for x in term.replace("==", "=").split("=", 1))
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def is_plugin_pod(pod: dict, opts: Options) -> bool:
    md = _md(pod)
    if opts.plugin_label_selector and _labels_match(md.get("labels") or {}, opts.plugin_label_selector):
        return True
    return bool(opts.plugin_name_prefix) and md.get("name", "").startswith(opts.plugin_name_prefix)


def epoch_or_zero(s: str | None) -> float:
    """An object's RFC 3339 time in epoch seconds; 0 when absent or not a time."""
    return (rfc3339_epoch(s) or 0.0) if s else 0.0


def pod_ready(pod: dict) -> bool:
    if _md(pod).get("deletionTimestamp"):
        return False
    st = pod.get("status") or {}
    if st.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])


def created_at(pod: dict) -> float:
    return epoch_or_zero(_md(pod).get("creationTimestamp"))


def _find_pod(state: ClusterState, namespace: str, name: str, uid: str) -> dict | None:
    for p in state.pods:
        md = _md(p)
        if uid and md.get("uid") == uid:
            return p
    for p in state.pods:
        md = _md(p)
        if not uid and md.get("namespace") == namespace and md.get("name") == name:
            return p
    return None


def affected_pods(f: Finding) -> list[tuple[str, str, str]]:
    """(namespace, pod name, pod uid) of the pods a finding lists as affected."""
    out = []
    for a in f.affected:
        if a.kind not in ("container", "pod"):
            continue
        name = a.name.split("/", 1)[0] if a.kind == "container" else a.name
        item = (a.namespace, name, a.uid)
        if item not in out:
            out.append(item)
    return out


def attributed_pod(f: Finding) -> tuple[str, str, str] | None:
    """The pod a GPU-NODE-001 finding blames, from its `data` (the memory-guard hook's contract).

    Accepted, in order: data["pod"] or data["attribution"]["pod"] as {"namespace", "name", "uid"}
    or "ns/name" (an explicit attribution); else the first pod among data["attribution"]["suspects"]
    (`{"kind": "pod", "ref": "ns/name", "uid"}`, the memory ledger's shape) when the attribution's
    confidence is "high". Nothing less certain ever leads to an eviction.
    """
    d = f.data or {}
    att = d.get("attribution") if isinstance(d.get("attribution"), dict) else {}
    for c in (d.get("pod"), att.get("pod")):
        if isinstance(c, dict) and c.get("name"):
            return str(c.get("namespace", "")), str(c["name"]), str(c.get("uid", ""))
        if isinstance(c, str) and "/" in c:
            ns, name = c.split("/", 1)
            return ns, name, ""
    if att.get("confidence") == "high":
        for s in att.get("suspects") or []:
            if not isinstance(s, dict) or s.get("kind") != "pod":
                continue
            ref, uid = str(s.get("ref", "")), str(s.get("uid", ""))
            if "/" in ref:
                ns, name = ref.split("/", 1)
                return ns, name, uid
            if uid:  # the node knew the pod only by its cgroup's UID; the API resolves it by UID
                return "", "", uid
    return None


def _taint_value(f: Finding) -> str:
    import re

    v = re.sub(r"[^A-Za-z0-9_.-]+", "-", f.family or f.code.lower()).strip("-._")[:63]
    return v or "gpu"


def _stale_plugin(f: Finding) -> bool:
    if f.data.get("stale_plugin") is True:
        return True
    return f.status == Status.AT_RISK and "snapshot" in (f.mechanism or "")


# --- the planner ------------------------------------------------------------------------------------


def build(findings: Iterable[Finding], state: ClusterState, opts: Options,
          plugin_restarted_at: float | None = None, holding: Iterable[Finding] = ()) -> RemediationPlan:
    """The actions these (raised) findings ask for on this node. `holding`: findings still raised
    though not observed in this check (the debouncer has not cleared them yet): they keep their
    device fences and the node's taint."""
    findings = list(findings)
    node_name = _md(state.node).get("name", "")
    plan = RemediationPlan(node_name)
    node_tgt = Target("Node", node_name, uid=_md(state.node).get("uid", ""))
    node_guard = protected_node(state.node)
    seen: set[tuple[str, str]] = set()

    def add(a: Action) -> None:
        if node_guard:
            plan.skipped.append(WithheldAction(a.kind, a.target, a.code, node_guard))
            return
        k = (a.kind, a.target.key)
        if k in seen:
            return
        seen.add(k)
        plan.actions.append(a)

    def pod_action(kind: str, f: Finding, ns: str, name: str, uid: str, why: str) -> None:
        pod = _find_pod(state, ns, name, uid)
        tgt = pod_target(pod) if pod else Target("Pod", name, ns, uid)
        if pod is None:
            plan.skipped.append(WithheldAction(kind, tgt, f.code, "pod not found on this node (gone already)"))
            return
        guard = protected_pod(pod, allow_unowned=opts.delete_unowned_pods)
        if guard:
            plan.skipped.append(WithheldAction(kind, tgt, f.code, guard))
            return
        add(Action(kind, tgt, f.code, why))

    for f in sorted(findings, key=lambda f: (-int(f.severity), f.code)):
        if f.code == "GPU-DEV-001" and _stale_plugin(f):
            _plan_plugin_restart(f, state, opts, plan, add, pod_action, plugin_restarted_at)
        elif f.code == "GPU-DEV-001" and f.data.get("cause") == "stale-cdi-spec":
            # a recreated pod would get the same devices from the same spec: the spec is regenerated first,
            # by hand or by the toolkit; once it lists nvidia-uvm this cause no longer holds and the pods go
            for ns, name, uid in (affected_pods(f) if f.status == Status.CONFIRMED else []):
                plan.skipped.append(WithheldAction("delete-pod", Target("Pod", name, ns, uid), f.code,
                                                   "the node CDI spec lacks /dev/nvidia-uvm: a new pod would get the "
                                                   "same devices; regenerate the spec first"))
        elif f.code in ("GPU-DEV-001", "GPU-DEV-002", "GPU-DEV-003") and f.status == Status.CONFIRMED:
            for ns, name, uid in affected_pods(f):
                pod_action("delete-pod", f, ns, name, uid,
                           "its device cgroup lost GPU devices; a new pod gets a fresh one")
        elif _node_fault(f):
            fenced = _device_fence(f, state)
            if opts.node_fault_action == "none":
                plan.skipped.append(WithheldAction("taint-device" if fenced else "taint-node", node_tgt, f.code,
                                                   "node_fault_action is none"))
            elif fenced:  # one bad GPU of several on a DRA node: fence the device, not the node
                for dev in fenced:
                    _plan_device_fence(f, dev, state, opts, node_name, add)
            elif opts.node_fault_action == "cordon":
                if (state.node.get("spec") or {}).get("unschedulable"):
                    continue
                add(Action("cordon-node", node_tgt, f.code, f"critical {f.family or 'GPU'} fault: stop new pods landing here"))
            else:
                taint = {"key": opts.taint_key, "value": _taint_value(f), "effect": "NoSchedule"}
                have = (state.node.get("spec") or {}).get("taints") or []
                if any(t.get("key") == taint["key"] and t.get("effect") == "NoSchedule" for t in have):
                    continue
                add(Action("taint-node", node_tgt, f.code, f"critical {f.family or 'GPU'} fault: stop new pods landing here",
                           {"taint": taint}))
        elif f.code == "GPU-NODE-001" and f.status == Status.CONFIRMED:
            who = attributed_pod(f)
            if who is None:
                plan.skipped.append(WithheldAction("evict-pod-for-memory", None, f.code, "no attributed pod in the finding's data"))
                continue
            pod_action("evict-pod-for-memory", f, *who, why="holds the GPU context whose driver allocations no cgroup is charged for")
    _plan_device_unfence(list(findings) + list(holding), state, add)
    node_fenced = any((_node_fault(f) or _holds_fence(f)) and not _device_fence(f, state) for f in findings + list(holding))
    if not node_fenced and opts.node_fault_action == "taint":
        # the fault that made this agent taint its node is gone (its finding cleared after debounce):
        # lift our own taint, and only ours (our key, NoSchedule); a cordon is left to the operator,
        # who cannot be told apart from us there
        for t in (state.node.get("spec") or {}).get("taints") or []:
            if t.get("key") == opts.taint_key and t.get("effect") == "NoSchedule":
                add(Action("untaint-node", node_tgt, f"cleared:{t.get('value') or 'fault'}",
                           "no critical driver or hardware fault is raised on this node any more", {"taint": dict(t)}))
                break
    plan.actions.sort(key=lambda a: _ORDER.get(a.kind, 99))
    return plan


#: codes outside the driver and hardware families that fence the node when critical and confirmed
NODE_FAULT_CODES = ("GPU-K8S-012",)


def _node_fault(f: Finding) -> bool:
    """A finding that fences the node (node_fault_action): a critical, confirmed driver or hardware fault,
    or a lost GPU failing every allocation of the node (GPU-K8S-012: every GPU pod sent here is rejected)."""
    return bool((f.code.startswith(("GPU-DRV-", "GPU-HW-")) or f.family in ("driver", "hardware")
                 or f.code in NODE_FAULT_CODES) and f.status == Status.CONFIRMED and f.severity >= Severity.CRITICAL)


def _holds_fence(f: Finding) -> bool:
    """A finding that keeps our node taint on but never puts it on: GPU-K8S-012 at risk (the GPU is still lost
    and still advertised) after its rejections aged out of the window. Lifting the taint then would let the
    next GPU pod land and be rejected; the taint goes once the GPU is back (the finding cleared)."""
    return f.code in NODE_FAULT_CODES and f.status == Status.AT_RISK


def _device_fence(f: Finding, state: ClusterState) -> list[Any]:
    """The slice devices of the GPUs a node-fault finding names, when it names some but not all of
    the node's GPUs and each one is exactly one device of the node's slices; else [] (the node is
    fenced as before: a finding that names no GPU, every GPU, or one the slices do not show, and a
    node where a device-plugin pod also allocates GPUs)."""
    from gpuwarden.kube.dra import pci_key

    if state.dra is None or not state.taint_rule_version:
        return []
    if state.plugin_pods:  # the device plugin also hands out GPUs here: a device taint would not stop it
        return []
    devices = list(state.dra.devices)
    named = [a.name for a in f.affected if a.kind == "gpu" and a.name]
    if not named or len(devices) < 2:
        return []
    out = []
    for name in dict.fromkeys(named):
        keys = {name, pci_key(name)} - {""}
        match = [d for d in devices if d.names() & keys]
        if len(match) != 1:
            return []
        if match[0] not in out:
            out.append(match[0])
    return out if len(out) < len(devices) else []


def _plan_device_fence(f: Finding, dev: Any, state: ClusterState, opts: Options, node_name: str, add: Any) -> None:
    from gpuwarden.kube.dra import rule_device, taint_rule

    if any(rule_device(r) == dev.ref for r in state.device_rules):
        return  # fenced already
    rule = taint_rule(dev.ref, node_name, opts.device_taint_effect, opts.taint_key, _taint_value(f), f.code,
                      state.taint_rule_version)
    add(Action("taint-device", Target("Device", str(dev.ref)), f.code,
               f"critical {f.family or 'GPU'} fault on GPU {dev.uuid or dev.pci or dev.ref.device} only: "
               f"stop new pods claiming this device, not the node's other GPUs", {"rule": rule}))


def _plan_device_unfence(findings: list[Finding], state: ClusterState, add: Any) -> None:
    """Remove our DeviceTaintRules whose device no raised node-fault finding names any more."""
    from gpuwarden.kube.dra import rule_device

    if state.dra is None or not state.device_rules:
        return
    still = {str(d.ref) for f in findings if _node_fault(f) or _holds_fence(f) for d in _device_fence(f, state)}
    for r in state.device_rules:
        dev = rule_device(r)
        if dev is None or str(dev) in still:
            continue
        md = _md(r)
        add(Action("untaint-device", Target("Device", str(dev), uid=md.get("uid", "")),
                   (md.get("annotations") or {}).get("gpuwarden.io/finding", ""),
                   "no raised finding names this GPU any more", {"rule": r}))


def _plan_plugin_restart(f: Finding, state: ClusterState, opts: Options, plan: RemediationPlan, add: Any, pod_action: Any,
                         restarted_at: float | None) -> None:
    plugins = [p for p in state.plugin_pods if not _md(p).get("deletionTimestamp")]
    fresh = [p for p in plugins if restarted_at is not None and created_at(p) >= restarted_at - 1 and pod_ready(p)]
    if restarted_at is not None and fresh:
        # the plugin came back after our restart: recreate the pods it had served
        for ns, name, uid in affected_pods(f):
            pod_action("delete-pod", f, ns, name, uid,
                       "served by the device plugin before its restart; its device cgroup lacks nvidia-uvm")
        return
    if restarted_at is not None:
        for ns, name, uid in affected_pods(f):
            plan.deferred.append(WithheldAction("delete-pod", Target("Pod", name, ns, uid), f.code,
                                         "waiting for the restarted device plugin to be Ready"))
        return
    if not plugins:
        plan.skipped.append(WithheldAction("restart-device-plugin", None, f.code,
                                    f"no device-plugin pod on this node (selector {opts.plugin_label_selector!r}, "
                                    f"prefix {opts.plugin_name_prefix!r})"))
        return
    for p in plugins:
        guard = protected_pod(p, allow_unowned=opts.delete_unowned_pods)
        if guard:
            plan.skipped.append(WithheldAction("restart-device-plugin", pod_target(p), f.code, guard))
            continue
        add(Action("restart-device-plugin", pod_target(p), f.code,
                   "its /dev snapshot predates /dev/nvidia-uvm; a new plugin pod sees the node"))
    for ns, name, uid in affected_pods(f):
        plan.deferred.append(WithheldAction("delete-pod", Target("Pod", name, ns, uid), f.code,
                                     "after the device plugin restarts and is Ready"))
