"""What the API says about this node's DRA world, judged against what the node shows.

The scheduler places a pod that claims a GPU by the node's ResourceSlices alone; three ways they
lie to it, each judged here from the slices (kube/dra.py reads them, field-selected) and the node
(the kubelet plugin's sockets, the driver's GPUs, the kernel's Xids):

- GPU-K8S-020: slices still advertise GPUs of a node whose DRA kubelet plugin is gone (both its
  registration and its dra.sock are absent): the scheduler keeps binding pods that can never be
  prepared (kubernetes/kubernetes#141912).
- GPU-K8S-021: the node's slices advertise no device while the driver's GPUs are there, past a
  start-up grace: the driver published empty slices while starting and never republished
  (kubernetes-sigs/dra-driver-nvidia-gpu#1008); no GPU pod is placed here.
- GPU-K8S-022: a device taint in a slice (the driver's health checking: `gpu.nvidia.com/xid`,
  `gpu.nvidia.com/gpu-lost`) older than a hold time, on a GPU the node shows present and without an
  Xid since the taint was added: the driver clears such taints only when its plugin restarts, so
  the GPU stays fenced after its cause is gone. AT-RISK, not CONFIRMED: the node cannot prove a
  silent cause gone.

`judge` is a pure function of what was read, so every verdict is tested without a node or a
cluster; `observe` reads (agent loop). A part that cannot be read makes its code "unknown", never
"good".
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct, field

from gpuwarden.agent.monitors import make_finding
from gpuwarden.findings import Affected, Evidence, Finding, Severity, Status
from gpuwarden.kube.dra import DeviceHealth, NodeSlices, SliceDevice, device_health, node_slices, prepare_failures
from gpuwarden.parsers.wallclock import format_rfc3339, rfc3339_epoch

CODES = ("GPU-K8S-020", "GPU-K8S-021", "GPU-K8S-022")
#: the driver's own health taints (its NVMLDeviceHealthCheck), which only a plugin restart removes
DRIVER_TAINT_PREFIX = "gpu.nvidia.com/"
#: a slice younger than this may still be empty because the driver is starting
EMPTY_GRACE_S = 120.0
#: a taint must be this old, with no Xid of its GPU since, before it counts as outliving its cause
TAINT_HOLD_S = 600.0
#: at most this many pending pods' Events are read per check (each one a field-selected list)
MAX_EVENT_READS = 20

#: title, severity, family, remedy and references of each code: the catalog's (rules/dra_api.py, scope "api"),
#: stamped by make_finding as on every agent-raised code


def _finding(code: str, status: Status, summary: str, evidence: list[Evidence], affected: list[Affected],
             data: dict, severity: Severity | None = None) -> Finding:
    return make_finding(code, status, summary, evidence=evidence, affected=affected, data=data, severity=severity)


class NodeSide(Struct):
    """What the node shows: the plugin's sockets, its GPUs, their Xids."""

    driver: str
    #: "present" (a socket exists), "absent" (both are missing), "unknown" (could not be read)
    plugin: str
    plugin_evidence: list[Evidence] = field(default_factory=list)
    #: GPU UUID -> where the node shows it (None: the node's GPUs could not be read)
    gpus: dict[str, str] | None = None
    #: GPU UUID -> epoch times of its Xids in the kernel log (None: the log could not be read)
    xid_times: dict[str, list[float]] | None = None


class Observation(Struct):
    findings: list[Finding] = field(default_factory=list)
    observed: dict[str, str] = field(default_factory=dict)  # code -> good | bad | unknown
    errors: list[str] = field(default_factory=list)


def _slice_times(sl: NodeSlices) -> float | None:
    ts = [t for t in (rfc3339_epoch(c) for c in sl.created() if c) if t]
    return max(ts) if ts else None


def _slice_names(sl: NodeSlices) -> str:
    return ", ".join(sl.names())


def _pods_affected(stuck: list[tuple[dict, list[dict]]]) -> tuple[list[Affected], list[Evidence]]:
    aff, ev = [], []
    for pod, events in stuck:
        md = pod.get("metadata") or {}
        aff.append(Affected("pod", str(md.get("name", "")), str(md.get("namespace", "")), str(md.get("uid", "")),
                            "FailedPrepareDynamicResources"))
        for e in events[:1]:
            ev.append(Evidence(f"Event {md.get('namespace')}/{e.get('metadata', {}).get('name', '')}",
                               f"{e.get('reason')}: {str(e.get('message', ''))[:300]} (count {e.get('count', 1)})"))
    return aff, ev


def judge(sl: NodeSlices, side: NodeSide, health: list[DeviceHealth], stuck: list[tuple[dict, list[dict]]],
          now: float, grace_s: float = EMPTY_GRACE_S, hold_s: float = TAINT_HOLD_S) -> Observation:
    """The three verdicts from what was read (pure)."""
    out = Observation()
    node = sl.node
    where = f"ResourceSlices of node {node}, driver {sl.driver}"
    gens = ", ".join(f"pool {p or '(unnamed)'} generation {g}" for p, g in sorted(sl.generations.items()))

    # GPU-K8S-020: advertised, plugin gone
    if not sl.devices:
        out.observed["GPU-K8S-020"] = "good"
    elif side.plugin == "absent":
        aff, ev = _pods_affected(stuck)
        out.findings.append(_finding(
            "GPU-K8S-020", Status.CONFIRMED,
            f"{len(sl.devices)} device(s) of driver {sl.driver} are still advertised for node {node}, but its kubelet "
            f"plugin is gone (no registration socket, no dra.sock): the scheduler keeps placing pods here that "
            f"cannot be prepared" + (f"; {len(stuck)} pod(s) already failed to prepare" if stuck else "") + ".",
            [Evidence(where, f"{_slice_names(sl)}: {len(sl.devices)} device(s) ({gens})"), *side.plugin_evidence, *ev],
            [Affected("node", node, detail=f"driver {sl.driver}"), *aff],
            {"driver": sl.driver, "devices": [str(d.ref) for d in sl.devices], "slices": _slice_names(sl)}))
        out.observed["GPU-K8S-020"] = "bad"
    else:
        out.observed["GPU-K8S-020"] = "good" if side.plugin == "present" else "unknown"

    # GPU-K8S-021: empty slices while the node has GPUs
    newest = _slice_times(sl)
    if not sl.slices or sl.devices:
        out.observed["GPU-K8S-021"] = "good"
    elif side.gpus is None or newest is None:
        out.observed["GPU-K8S-021"] = "unknown"
    elif not side.gpus:
        out.observed["GPU-K8S-021"] = "good"  # no GPU to advertise
    elif now - newest < grace_s:
        out.observed["GPU-K8S-021"] = "unknown"  # the driver may still be starting
    else:
        out.findings.append(_finding(
            "GPU-K8S-021", Status.CONFIRMED,
            f"The ResourceSlices of driver {sl.driver} for node {node} advertise no device, "
            f"{now - newest:.0f}s after they were published, while the node has {len(side.gpus)} GPU(s): "
            f"the scheduler places no GPU pod here.",
            [Evidence(where, f"{_slice_names(sl)}: 0 devices ({gens}), created {format_rfc3339(newest)}"),
             *(Evidence(src, f"GPU {uuid}") for uuid, src in sorted(side.gpus.items()))],
            [Affected("node", node, detail=f"driver {sl.driver}")],
            {"driver": sl.driver, "gpus": sorted(side.gpus), "slices": _slice_names(sl)}))
        out.observed["GPU-K8S-021"] = "bad"

    # GPU-K8S-022: driver taints that outlive their cause
    unhealthy = {str(h.ref) for h in health if h.health == "Unhealthy"}
    stale: list[tuple[SliceDevice, dict, float]] = []
    unknown = False
    for d in sl.devices:
        for t in d.taints:
            if not str(t.get("key", "")).startswith(DRIVER_TAINT_PREFIX) or t.get("effect") == "None":
                continue
            added = rfc3339_epoch(str(t.get("timeAdded") or ""))
            if added is None or not d.uuid or side.gpus is None or side.xid_times is None:
                unknown = True
                continue
            if now - added < hold_s or d.uuid not in side.gpus or str(d.ref) in unhealthy:
                continue
            if any(x >= added - 1 for x in side.xid_times.get(d.uuid, [])):
                continue
            stale.append((d, t, added))
    if stale:
        out.findings.append(_finding(
            "GPU-K8S-022", Status.AT_RISK,
            f"{len(stale)} device taint(s) of driver {sl.driver} on node {node} have stayed for longer than "
            f"{hold_s:.0f}s on GPUs the node shows present with no Xid since: the driver removes them only when "
            f"its plugin restarts, so the GPU stays fenced.",
            [Evidence(f"ResourceSlice {d.slice_name}",
                      f"device {d.ref.device} ({d.uuid}): taint {t.get('key')}={t.get('value', '')}:{t.get('effect')} "
                      f"added {format_rfc3339(added)}; GPU present ({side.gpus[d.uuid]}), no Xid since")
             for d, t, added in stale],
            [Affected("gpu", d.uuid, detail=f"device {d.ref}") for d, _, _ in stale],
            {"taints": [{"device": str(d.ref), "uuid": d.uuid, "key": t.get("key"), "effect": t.get("effect"),
                         "time_added": added} for d, t, added in stale]}))
        out.observed["GPU-K8S-022"] = "bad"
    else:
        out.observed["GPU-K8S-022"] = "unknown" if unknown else "good"
    return out


# -- reading -------------------------------------------------------------------------------------


def node_side(root: Any, facts: Any, driver: str) -> NodeSide:
    """The plugin's sockets (through the root), the driver's GPUs and their Xids (through the facts)."""
    socks = (f"/var/lib/kubelet/plugins_registry/{driver}-reg.sock", f"/var/lib/kubelet/plugins/{driver}/dra.sock")
    states, ev = [], []
    for p in socks:
        st = root.stat(p)
        kind = getattr(st, "kind", "")
        if hasattr(st, "major"):  # a StatInfo: something is there
            states.append("present")
            ev.append(Evidence(p, "present"))
        else:
            states.append("absent" if kind == "missing" else "unknown")
            ev.append(Evidence(p, str(st)))
    plugin = "present" if "present" in states else "absent" if all(s == "absent" for s in states) else "unknown"
    if plugin == "absent":
        # absent only where the kubelet keeps its plugins: another kubelet root dir is not a gone plugin
        reg = root.stat("/var/lib/kubelet/plugins_registry")
        if getattr(reg, "kind", "") != "dir":
            plugin = "unknown"
            ev.append(Evidence("/var/lib/kubelet/plugins_registry", f"{reg} (not this node's kubelet plugin registry?)"))
    gpus: dict[str, str] | None = None
    xid_times: dict[str, list[float]] | None = None
    try:
        from gpuwarden.facts.xids import gpu_map

        refs = gpu_map(facts)
        if facts.maybe("driver") is not None:
            gpus = {g.uuid: f"driver: {g.bus_id or g.key}" for g in refs.values() if g.uuid}
        xf = facts.maybe("xids")
        if xf is not None:
            by_key = {g.key: g.uuid for g in refs.values() if g.uuid}
            xid_times = {}
            for e in xf.events:
                uuid = by_key.get(e.key or "")
                if uuid and e.event.time is not None:
                    xid_times.setdefault(uuid, []).append(e.event.time)
    except Exception:  # a fact's bug must not hide the API's verdicts: those parts are unknown
        pass
    return NodeSide(driver, plugin, ev, gpus, xid_times)


def _pending_with_claims(pods: list[dict]) -> list[dict]:
    return [p for p in pods if (p.get("status") or {}).get("phase") == "Pending"
            and (p.get("spec") or {}).get("resourceClaims")]


def observe(kube: Any, node: str, driver: str, root: Any, facts: Any, pods: list[dict], now: float) -> Observation:
    """Read the node's slices (field-selected), its pending pods' prepare failures, and judge."""
    try:
        sl = node_slices(kube, node, driver)
    except Exception as exc:
        return Observation(observed={c: "unknown" for c in CODES}, errors=[f"dra: ResourceSlices: {exc}"])
    stuck: list[tuple[dict, list[dict]]] = []
    errors: list[str] = []
    for pod in _pending_with_claims(pods)[:MAX_EVENT_READS] if sl.devices else []:
        try:
            evs = prepare_failures(kube, pod)
        except Exception as exc:
            errors.append(f"dra: Events of {pod.get('metadata', {}).get('name')}: {exc}")
            continue
        if evs:
            stuck.append((pod, evs))
    out = judge(sl, node_side(root, facts, driver), device_health(pods), stuck, now)
    out.errors += errors
    return out
