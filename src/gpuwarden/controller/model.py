"""Reading Kubernetes objects (plain JSON dicts) for the controller: pure functions, no I/O.

- time: a field's RFC 3339 text to epoch seconds (parsers.wallclock reads and writes it);
- GPU nodes: capacity/allocatable `nvidia.com/gpu`, label `nvidia.com/gpu.present=true`, or any
  gpuwarden NodeCondition;
- node failure signals: Ready not True, a gpuwarden condition True, a gpuwarden Warning Event;
- pods: GPU requests, controller owner, the workload at the top of the owner chain
  (Pod -> ReplicaSet -> Deployment, Pod -> Job -> CronJob, Pod -> StatefulSet / DaemonSet / other).
"""

from __future__ import annotations

import datetime as dt
import re
import sys
from typing import Any, Iterable, Mapping

from msgspec import Struct

from gpuwarden.kube.conditions import CONDITION_TYPES, code_from_reason
from gpuwarden.parsers.wallclock import rfc3339_epoch
from gpuwarden.remediation.guard import CONFIG_SOURCE, MIRROR, OPT_OUT

GPU_RESOURCE = "nvidia.com/gpu"
GPU_LABEL = "nvidia.com/gpu.present"
#: extended resources that mean "this pod uses an NVIDIA GPU" (whole GPUs, MIG slices, shared GPUs)
_GPU_RESOURCE_RE = re.compile(r"^nvidia\.com/(gpu|mig-.+|gpu\.shared)$")


# -- time ------------------------------------------------------------------------------------------
def parse_time(s: Any) -> float | None:
    """An object's RFC 3339 field ("2026-11-22T10:00:00Z", "...00.123456Z", "...+02:00") -> epoch
    seconds; None when absent or not a time."""
    return rfc3339_epoch(s) if isinstance(s, str) and s else None


def clock_time(t: float) -> str:
    """Short UTC time of day for messages: "10:04:05Z"."""
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%H:%M:%SZ")


def age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


# -- generic object access -------------------------------------------------------------------------
def md(obj: Mapping | None) -> dict:
    return dict((obj or {}).get("metadata") or {})


def annotations(obj: Mapping | None) -> dict:
    return dict(md(obj).get("annotations") or {})


def controller_ref(obj: Mapping | None) -> dict | None:
    """The ownerReference with controller=true (else the first one), or None."""
    owners = md(obj).get("ownerReferences") or []
    for o in owners:
        if o.get("controller"):
            return o
    return owners[0] if owners else None


# -- nodes -----------------------------------------------------------------------------------------
def conditions(node: Mapping) -> dict[str, dict]:
    return {c.get("type", ""): c for c in ((node.get("status") or {}).get("conditions") or [])}


def node_gpus(node: Mapping) -> int:
    st = node.get("status") or {}
    best = 0
    for section in ("capacity", "allocatable"):
        v = (st.get(section) or {}).get(GPU_RESOURCE)
        try:
            best = max(best, int(str(v)))
        except (TypeError, ValueError):
            pass
    return best


def is_gpu_node(node: Mapping) -> bool:
    if node_gpus(node) > 0:
        return True
    if str((md(node).get("labels") or {}).get(GPU_LABEL, "")).lower() == "true":
        return True
    return any(t in CONDITION_TYPES for t in conditions(node))


class FailureSignal(Struct, frozen=True):
    """One reason a node counts as failed, and since when."""

    node: str
    what: str  # "Ready=Unknown", "GPUUnchargedMemory=True", "event GPU-NODE-001"
    reason: str
    message: str
    at: float
    kind: str  # "ready" | "condition" | "event"

    def describe(self) -> str:
        reason = f" ({self.reason})" if self.reason and self.reason not in self.what else ""
        return f"{self.what}{reason}"


def node_signals(node: Mapping, node_events: Iterable[Mapping], now: float, bad_conditions: Iterable[str],
                 event_codes: Iterable[str], event_hold_s: float) -> list[FailureSignal]:
    """Why this node counts as failed now (empty: healthy).

    - Ready is not "True" (False: the kubelet says so; Unknown: the kubelet stopped posting status);
      a node that has no Ready condition yet is not counted;
    - a condition in `bad_conditions` (gpuwarden's GPUUnchargedMemory, GPUDriver) is "True";
    - a gpuwarden Warning Event about this Node whose code starts with one of `event_codes`
      (GPU-NODE, GPU-DRV), last seen within `event_hold_s`, and not followed by its "...Cleared" Event;
      not one the agent marked at-risk (annotation gpuwarden.io/status): a risk is no failure, and one
      NVML probe timeout is gpuwarden's own deadline, not the node's.
    Each signal's time is its condition's lastTransitionTime (the Event's firstTimestamp), else now.
    """
    name = md(node).get("name", "")
    out: list[FailureSignal] = []
    conds = conditions(node)
    ready = conds.get("Ready")
    if ready is not None and ready.get("status") != "True":
        out.append(FailureSignal(name, f"Ready={ready.get('status') or 'Unknown'}", ready.get("reason", ""),
                          ready.get("message", ""), parse_time(ready.get("lastTransitionTime")) or now, "ready"))
    for t in bad_conditions:
        c = conds.get(t)
        if c is not None and c.get("status") == "True":
            out.append(FailureSignal(name, f"{t}=True", c.get("reason", ""), c.get("message", ""),
                              parse_time(c.get("lastTransitionTime")) or now, "condition"))
    prefixes = tuple(p.upper().rstrip("-") + "-" for p in event_codes)
    cleared: dict[str, float] = {}
    warnings: list[tuple[str, Mapping]] = []
    for ev in node_events:
        reason = ev.get("reason") or ""
        if reason.endswith("Cleared"):
            code = code_from_reason(reason[: -len("Cleared")])
            if code:
                cleared[code] = max(cleared.get(code, 0.0), event_last(ev) or 0.0)
            continue
        code = code_from_reason(reason)
        at_risk = (md(ev).get("annotations") or {}).get("gpuwarden.io/status") == "at-risk"
        if ev.get("type") == "Warning" and code and code.startswith(prefixes) and not at_risk:
            warnings.append((code, ev))
    for code, ev in warnings:
        last = event_last(ev) or 0.0
        if now - last > event_hold_s or cleared.get(code, 0.0) >= last:
            continue
        out.append(FailureSignal(name, f"event {code}", ev.get("reason", ""), ev.get("message", ""),
                          event_first(ev) or now, "event"))
    return out


def event_first(ev: Mapping) -> float | None:
    return (parse_time(ev.get("firstTimestamp")) or parse_time(ev.get("eventTime"))
            or parse_time(md(ev).get("creationTimestamp")))


def event_last(ev: Mapping) -> float | None:
    return (parse_time(ev.get("lastTimestamp")) or parse_time((ev.get("series") or {}).get("lastObservedTime"))
            or event_first(ev))


def involved_node(ev: Mapping) -> str | None:
    io = ev.get("involvedObject") or ev.get("regarding") or {}
    return io.get("name") if io.get("kind") == "Node" else None


# -- pods ------------------------------------------------------------------------------------------
def pod_gpus(pod: Mapping) -> int:
    """GPUs (or MIG slices) the pod asks for: the larger of requests and limits, per container."""
    spec = pod.get("spec") or {}
    total = 0
    for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        res = c.get("resources") or {}
        for section in ("limits", "requests"):
            for k, v in (res.get(section) or {}).items():
                if _GPU_RESOURCE_RE.match(k):
                    try:
                        total = max(total, int(str(v)))
                    except (TypeError, ValueError):
                        total = max(total, 1)
    return total


#: pod.status.reason the kubelet sets when it refuses a pod at admission
ADMISSION_REASONS = ("UnexpectedAdmissionError", "TopologyAffinityError", "DeviceAllocationFailed")
ADMISSION_PREFIXES = ("OutOf",)  # OutOfnvidia.com/gpu, OutOfcpu, ...
#: container state reasons of a pod that died at start
START_REASONS = ("StartError", "ContainerCannotRun", "RunContainerError", "CreateContainerError")
MAX_FAILURE_MESSAGE = 200

#: what a failure says about the node. GPU_ADMISSION: the kubelet's device manager or DRA refused the
#: pod's GPUs (the node's GPU stack, whatever the workload); GPU_START: the container runtime's GPU hook
#: or CDI injection failed (the node's, unless the same workload fails so on other nodes too);
#: ADMISSION, START: another refusal (CPU, memory, topology) or death at start (the image, the command).
GPU_ADMISSION, GPU_START, ADMISSION, START = "gpu-admission", "gpu-start", "admission", "start"
#: a kubelet refusal that names a device (device plugin Allocate over gRPC, unhealthy or missing
#: devices, a DRA claim, CDI); the CPU and memory managers' refusals name none
_ADMISSION_GPU_RE = re.compile(r"nvidia|gpu|device|rpc error|resource ?claim|dynamic resource|\bcdi\b", re.I)
#: the runtime's GPU hook (libnvidia-container's CLI, the toolkit's runtime and hook) or CDI injection,
#: as runc/containerd say it; read with quoted text removed: a command name is quoted (`exec: "x"`)
#: and a tenant must not fence a node by naming its entrypoint after the hook
_START_GPU_RE = re.compile(r"nvidia-container-(cli|runtime|toolkit)|nvidia-ctk|unresolvable cdi devices"
                           r"|(inject|injecting) cdi devices|nvml error|/dev/nvidia", re.I)
_QUOTED_RE = re.compile(r'"(?:[^"\\]|\\.)*"')


def _excerpt(text: str, m: re.Match | None) -> str:
    """At most MAX_FAILURE_MESSAGE characters of `text`, keeping the matched GPU phrase in view."""
    if len(text) <= MAX_FAILURE_MESSAGE or m is None or m.end() <= MAX_FAILURE_MESSAGE:
        return text[:MAX_FAILURE_MESSAGE]
    head = text[: text.index(":") + 1] if ":" in text[:60] else ""
    return (head + " …" + text[max(m.start(), 0):])[:MAX_FAILURE_MESSAGE]


def classify_failure(pod: Mapping) -> tuple[str, str]:
    """(kind, "Reason: message") of a pod refused at admission or dead at start; ("", "") otherwise.

    Only the kubelet's and the runtime's own words decide the kind, never quoted text (a command or an
    image name is the tenant's to choose)."""
    st = pod.get("status") or {}
    reason = str(st.get("reason") or "")
    if reason in ADMISSION_REASONS or reason.startswith(ADMISSION_PREFIXES):
        msg = str(st.get("message") or "")
        text = f"{reason}: {msg}".strip(": ")
        if reason.startswith(ADMISSION_PREFIXES):
            gpu = bool(_GPU_RESOURCE_RE.match(reason[len("OutOf"):]))
            return (GPU_ADMISSION if gpu else ADMISSION), text[:MAX_FAILURE_MESSAGE]
        # the topology manager's refusal is the pod's request against the node's NUMA layout, not a fault
        m = _ADMISSION_GPU_RE.search(_QUOTED_RE.sub('""', msg)) if reason != "TopologyAffinityError" else None
        return (GPU_ADMISSION if m else ADMISSION), text[:MAX_FAILURE_MESSAGE]
    for cs in list(st.get("initContainerStatuses") or []) + list(st.get("containerStatuses") or []):
        state = cs.get("state") or {}
        for key in ("terminated", "waiting"):
            r = str((state.get(key) or {}).get("reason") or "")
            if r in START_REASONS:
                text = f"{r}: {(state.get(key) or {}).get('message') or ''}".strip(": ")
                m = _START_GPU_RE.search(_QUOTED_RE.sub(lambda q: '"' + " " * (len(q.group()) - 2) + '"', text))
                return (GPU_START if m else START), _excerpt(text, m)
    return "", ""


def pod_failure(pod: Mapping) -> str:
    """"UnexpectedAdmissionError: ..." when the pod failed admission or at start; "" otherwise."""
    return classify_failure(pod)[1]


def failure_of(pod: Mapping) -> tuple[str, str]:
    """(kind, text) of a cached (trimmed) pod's failure, else classified from the full object."""
    st = pod.get("status") or {}
    if "failure" in st:
        return str(st.get("failureKind") or START), str(st.get("failure") or "")
    return classify_failure(pod)


#: parts many cached pods have alike, kept once and shared (never mutated: readers only read): the
#: GPU request, the owner references of one ReplicaSet's pods, the kept labels of one template, the
#: empty mapping. At 60,000 GPU pods they are most of a trimmed pod's size.
_SHARED: dict[Any, Any] = {}
_SHARED_MAX = 200_000
_EMPTY: dict = {}


def _shared(key: Any, make: Any) -> Any:
    v = _SHARED.get(key)
    if v is None:
        if len(_SHARED) >= _SHARED_MAX:
            _SHARED.clear()
        v = _SHARED[key] = make()
    return v


def trim_pod(pod: Mapping) -> dict:
    """What the controller keeps of a Pod (informer caches stay small): about 1 KB a pod, its parts
    shared with its siblings (`_SHARED`); the trimmed object is read-only."""
    m = md(pod)
    ann = m.get("annotations") or {}
    labels = m.get("labels") or {}
    keep_ann = tuple(sorted((k, str(v)) for k, v in ann.items() if k in (OPT_OUT, MIRROR, CONFIG_SOURCE)))
    keep_labels = tuple(sorted((k, str(v)) for k, v in labels.items()
                               if k in ("pod-template-hash", "component", "k8s-app", "app.kubernetes.io/name",
                                        "controller-revision-hash", "job-name")))
    gpus = pod_gpus(pod)
    node = str((pod.get("spec") or {}).get("nodeName") or "")

    def make_spec() -> dict:
        out: dict[str, Any] = {"nodeName": sys.intern(node)}
        if gpus:
            out["containers"] = [{"name": "gpu", "resources": {"limits": {GPU_RESOURCE: str(gpus)}}}]
        return out

    out_spec = _shared(("spec", node, gpus), make_spec)  # the pods of one node asking as many GPUs
    meta = {k: m[k] for k in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp") if k in m}
    for k in ("namespace", "creationTimestamp"):  # pods created in the same second share the text
        if isinstance(meta.get(k), str):
            meta[k] = sys.intern(meta[k])
    owners = tuple(tuple((k, str(o[k])) for k in ("kind", "name", "uid", "apiVersion") if isinstance(o.get(k), str))
                   + ((("controller", True),) if o.get("controller") else ())
                   for o in m.get("ownerReferences") or [] if isinstance(o, Mapping))
    if owners:
        meta["ownerReferences"] = _shared(("owners", owners), lambda: [dict(o) for o in owners])
    meta["labels"] = _shared(("labels", keep_labels), lambda: dict(keep_labels)) if keep_labels else _EMPTY
    meta["annotations"] = _shared(("ann", keep_ann), lambda: dict(keep_ann)) if keep_ann else _EMPTY
    phase = str((pod.get("status") or {}).get("phase", "") or "")
    kind, why = classify_failure(pod)
    if why:  # refused at admission or dead at start (controller/admission.py)
        status: dict[str, Any] = {"phase": sys.intern(phase), "failure": why, "failureKind": sys.intern(kind)}
    else:
        status = _shared(("status", phase), lambda: {"phase": sys.intern(phase)})
    return {"metadata": meta, "spec": out_spec, "status": status}


def trim_gpu_pod(pod: Mapping) -> dict | None:
    """`trim_pod` of a pod that requests NVIDIA GPUs; None for any other (not kept at all)."""
    return trim_pod(pod) if pod_gpus(pod) > 0 else None


_EVENT_KEEP = ("reason", "type", "action", "count", "firstTimestamp", "lastTimestamp", "eventTime",
               "reportingInstance")
MAX_EVENT_MESSAGE = 512


def trim_event(ev: Mapping) -> dict:
    """What the controller keeps of an Event: detection reads the involved and related object, the
    reason, type, action, times, count, the agent's owner annotations and the message's start. Repeated
    strings (reasons, node and namespace names) are interned: 25,000 Events share them."""
    m = md(ev)
    ann = {k: v for k, v in (m.get("annotations") or {}).items() if k.startswith("gpuwarden.io/")}
    meta = {k: m[k] for k in ("name", "namespace", "uid", "creationTimestamp") if k in m}
    if ann:
        meta["annotations"] = ann
    out: dict[str, Any] = {"metadata": meta}
    for k in _EVENT_KEEP:
        v = ev.get(k)
        if v is not None:
            out[k] = sys.intern(v) if isinstance(v, str) and k != "message" else v
    out["message"] = str(ev.get("message") or "")[:MAX_EVENT_MESSAGE]
    for k in ("involvedObject", "related"):
        o = ev.get(k)
        if o:
            out[k] = {f: sys.intern(str(o[f])) for f in ("kind", "name", "namespace", "uid") if o.get(f)}
    last = (ev.get("series") or {}).get("lastObservedTime")
    if last:
        out["series"] = {"lastObservedTime": last}
    host = (ev.get("source") or {}).get("host")
    if host:
        out["source"] = {"host": sys.intern(host)}
    return out


# -- workloads -------------------------------------------------------------------------------------
#: kind -> (apiVersion, plural)
WORKLOAD_KINDS: dict[str, tuple[str, str]] = {
    "Deployment": ("apps/v1", "deployments"),
    "StatefulSet": ("apps/v1", "statefulsets"),
    "ReplicaSet": ("apps/v1", "replicasets"),
    "DaemonSet": ("apps/v1", "daemonsets"),
    "Job": ("batch/v1", "jobs"),
    "CronJob": ("batch/v1", "cronjobs"),
}
#: what `quarantine` can act on (a DaemonSet runs everywhere by design: it does not hop)
QUARANTINABLE = ("Deployment", "StatefulSet", "ReplicaSet", "Job", "CronJob")
_ALIASES = {"deploy": "Deployment", "deployment": "Deployment", "deployments": "Deployment",
            "sts": "StatefulSet", "statefulset": "StatefulSet", "statefulsets": "StatefulSet",
            "rs": "ReplicaSet", "replicaset": "ReplicaSet", "replicasets": "ReplicaSet",
            "ds": "DaemonSet", "daemonset": "DaemonSet", "daemonsets": "DaemonSet",
            "job": "Job", "jobs": "Job", "cj": "CronJob", "cronjob": "CronJob", "cronjobs": "CronJob",
            "pod": "Pod", "pods": "Pod", "po": "Pod"}


class WorkloadRef(Struct, frozen=True, order=True):
    kind: str
    namespace: str
    name: str

    @property
    def key(self) -> str:
        """"deployment/ns/name": what logs, annotations and `gpuwarden release` use."""
        return f"{self.kind.lower()}/{self.namespace}/{self.name}"

    @property
    def path(self) -> str:
        """REST path of a built-in workload kind (KeyError for others)."""
        api_version, plural = WORKLOAD_KINDS[self.kind]
        return f"/apis/{api_version}/namespaces/{self.namespace}/{plural}/{self.name}"

    @property
    def api_version(self) -> str:
        return WORKLOAD_KINDS.get(self.kind, ("v1", ""))[0]

    @classmethod
    def parse(cls, text: str, namespace: str = "") -> "WorkloadRef":
        """"deployment/ns/name", "deploy/name" (with `namespace`), "Job/ns/name"; ValueError otherwise.

        Kinds other than the built-in workloads (a custom resource, a bare pod) parse too, lowercased:
        they can hold the pool taint (`release` drops it) though they are never scaled."""
        parts = [p for p in text.strip().split("/")]
        if len(parts) == 2 and namespace:
            parts = [parts[0], namespace, parts[1]]
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"{text!r}: expected KIND/NAMESPACE/NAME (e.g. deployment/ml/trainer, job/ml/burn-in)")
        kind = _ALIASES.get(parts[0].lower(), parts[0].lower())
        return cls(kind, parts[1], parts[2])

    @classmethod
    def from_key(cls, key: str) -> "WorkloadRef":
        kind, ns, name = key.split("/", 2)
        canon = _ALIASES.get(kind, None) or next((k for k in WORKLOAD_KINDS if k.lower() == kind), kind)
        return cls(canon, ns, name)


def owner_lookup(pod: Mapping) -> tuple[str, str, str] | None:
    """The (kind, namespace, name) to GET to find the top of this pod's owner chain, if any."""
    ref = controller_ref(pod)
    if ref and ref.get("kind") in ("ReplicaSet", "Job"):
        return ref["kind"], md(pod).get("namespace", ""), ref.get("name", "")
    return None


def resolve_workload(pod: Mapping, owners: Mapping[tuple[str, str, str], Mapping | None]) -> WorkloadRef:
    """The workload at the top of a pod's owner chain.

    `owners` maps (kind, namespace, name) of the pod's ReplicaSet/Job to that object (or None when
    it could not be read). A ReplicaSet that cannot be read falls back on the pod's
    `pod-template-hash` label (the Deployment's ReplicaSets are named `<deployment>-<hash>`).
    A pod with no owner is its own workload (kind Pod).
    """
    m = md(pod)
    ns = m.get("namespace", "")
    ref = controller_ref(pod)
    if ref is None:
        return WorkloadRef("Pod", ns, m.get("name", ""))
    kind, name = ref.get("kind", ""), ref.get("name", "")
    if kind == "ReplicaSet":
        rs = owners.get(("ReplicaSet", ns, name))
        top = controller_ref(rs) if rs else None
        if top and top.get("kind") == "Deployment":
            return WorkloadRef("Deployment", ns, top.get("name", ""))
        if rs is None:
            h = (m.get("labels") or {}).get("pod-template-hash", "")
            if h and name.endswith("-" + h):
                return WorkloadRef("Deployment", ns, name[: -len(h) - 1])
        return WorkloadRef("ReplicaSet", ns, name)
    if kind == "Job":
        job = owners.get(("Job", ns, name))
        top = controller_ref(job) if job else None
        if top and top.get("kind") == "CronJob":
            return WorkloadRef("CronJob", ns, top.get("name", ""))
        return WorkloadRef("Job", ns, name)
    return WorkloadRef(kind, ns, name)
