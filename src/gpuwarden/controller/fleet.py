"""`gpuwarden fleet`: every GPU node's gpuwarden conditions and latest findings in one table, worst
first, with the quarantined workloads, the agents' circuit breaker and the controller's latest
decisions — the view an on-call engineer opens first.

`gather(kube, ...)` does the reads (a handful of lists); `build(...)` is a pure function of what
was read and the time; `render_text` / JSON are functions of the view.

Worst first: a node that is not Ready (100), then each gpuwarden condition that is True
(GPUHardware, GPUDriver, GPUUnchargedMemory 20; GPUDeviceAccess, GPUDevicePlugin 10), recent
Warning findings (1 each, at most 5), cordoned or tainted by gpuwarden (2); ties by name.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from gpuwarden.controller.model import (GPU_RESOURCE, QUARANTINABLE, WORKLOAD_KINDS, WorkloadRef, age, conditions,
                                        event_first, event_last, involved_node, is_gpu_node, md, node_gpus, parse_time)
from gpuwarden.controller import dra
from gpuwarden.controller.quarantine import ANNOTATION, holders, read_record
from gpuwarden.kube.conditions import CONDITION_TYPES, code_from_reason
from gpuwarden.kube.events import event_pod
from gpuwarden.parsers.wallclock import format_rfc3339

WEIGHT = {"GPUHardware": 20, "GPUDriver": 20, "GPUUnchargedMemory": 20, "GPUDeviceAccess": 10, "GPUDevicePlugin": 10}
SHORT = {"GPUDeviceAccess": "DEVACCESS", "GPUDriver": "DRIVER", "GPUDevicePlugin": "PLUGIN",
         "GPUUnchargedMemory": "MEMORY", "GPUHardware": "HARDWARE"}
CONTROLLER_REASONS = ("CascadeDetected", "WorkloadQuarantined", "GPUNodeStorm", "QuarantineReleased",
                      "BreakerClosed", "NodeFailsEveryPod", "NodeFailsEveryPodCleared")
MAX_FINDINGS = 5
#: findings whose GPU is lost now: fallen off the bus in this boot (GPU-HW-002), a lost GPU failing every
#: allocation (GPU-K8S-012); a condition message names the GPU as `CODE [GPU 3 (0000:3b:00.0) GPU-…]: summary`
LOST_CODES = ("GPU-HW-002", "GPU-K8S-012")
_PART = re.compile(r"(GPU-[A-Z0-9]+-\d+) \[([^\]]*)\]: ([^|]*)")
_GPU = re.compile(r"GPU (?:(\d+) \(([^)\s,]*)\)|([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.\d)?))"
                  r"(?: (GPU-[0-9a-fA-F-]+))?")
_NOT_NOW = ("before the last reboot",)


def lost_gpus(messages: Iterable[str]) -> list[dict]:
    """The GPUs the agent's condition messages say are lost now: index, bus id, UUID, the code."""
    out: dict[str, dict] = {}
    for msg in messages:
        for code, tag, summary in _PART.findall(str(msg)):
            if code not in LOST_CODES or any(x in summary for x in _NOT_NOW):
                continue
            for idx, bus, bare, uuid in _GPU.findall(tag):
                index = int(idx) if idx else None
                bus_id = bus or bare
                key = uuid or bus_id or idx
                have = out.setdefault(key, {"index": index, "busId": bus_id, "uuid": uuid, "codes": []})
                if code not in have["codes"]:
                    have["codes"].append(code)
    return sorted(out.values(), key=lambda g: (g["index"] is None, g["index"] or 0, g["busId"]))


def _quantity(node: Mapping, section: str) -> int | None:
    v = ((node.get("status") or {}).get(section) or {}).get(GPU_RESOURCE)
    try:
        return int(str(v)) if v is not None else None
    except ValueError:
        return None


def gpu_count(node: Mapping, conds: Mapping[str, Mapping]) -> dict:
    """Usable GPUs against what the node advertises: capacity, allocatable nvidia.com/gpu, the lost ones."""
    lost = lost_gpus(c.get("message", "") for c in conds.values() if c.get("status") == "True")
    cap, alloc = _quantity(node, "capacity"), _quantity(node, "allocatable")
    total = cap if cap is not None else alloc
    usable = max(total - len(lost), 0) if total is not None else None
    return {"capacity": cap, "allocatable": alloc, "usable": usable, "lost": lost,
            "overcounted": usable is not None and alloc is not None and alloc > usable}


def _code(reason: str) -> str:
    return code_from_reason(reason) or reason


def node_row(node: Mapping, node_events: Iterable[Mapping], now: float, since_s: float) -> dict:
    m = md(node)
    conds = conditions(node)
    ready = conds.get("Ready")
    ours = {}
    findings: list[dict] = []
    score = 0
    for t in CONDITION_TYPES:
        c = conds.get(t)
        if c is None:
            continue
        ours[t] = {"status": c.get("status", ""), "reason": c.get("reason", ""), "message": c.get("message", ""),
                   "since": c.get("lastTransitionTime")}
        if c.get("status") == "True":
            score += WEIGHT.get(t, 10)
            code = _code(c.get("reason", ""))
            findings.append({"code": code, "source": f"condition {t}",
                             "at": parse_time(c.get("lastTransitionTime")),
                             "message": str(c.get("message", "")).removeprefix(code + ": "),
                             "count": 1})
    warnings = 0
    for ev in node_events:
        last = event_last(ev) or 0.0
        if now - last > since_s or ev.get("reason") in CONTROLLER_REASONS or event_pod(ev) is not None:
            continue  # an Event about one of its pods is the pod's (the node view lists it there)
        is_warning = ev.get("type") == "Warning"
        warnings += is_warning
        code = _code(ev.get("reason", ""))
        findings.append({"code": code, "source": "event" if is_warning else "event (normal)",
                         "at": last, "first": event_first(ev),
                         "message": str(ev.get("message", "")).removeprefix(code + ": "),
                         "count": int(ev.get("count") or 1)})
    findings.sort(key=lambda f: -(f.get("at") or 0.0))
    ready_status = (ready or {}).get("status", "-")
    if ready is not None and ready_status != "True":
        score += 100
    score += min(warnings, 5)
    spec = node.get("spec") or {}
    ours_taints = [t for t in spec.get("taints") or [] if str(t.get("key", "")).startswith("gpuwarden.io/")]
    if spec.get("unschedulable") or ours_taints:
        score += 2
    failing = ready_status not in ("True", "-") or any(c["status"] == "True" and WEIGHT.get(t, 0) >= 20
                                                        for t, c in ours.items())
    state = "failing" if failing else ("degraded" if score > 0 else "ok")
    return {"name": m.get("name", ""), "ready": ready_status, "readyReason": (ready or {}).get("reason", ""),
            "readySince": (ready or {}).get("lastTransitionTime"), "gpus": node_gpus(node),
            "gpuCount": gpu_count(node, ours),
            "unschedulable": bool(spec.get("unschedulable")), "taints": ours_taints,
            "quarantineHolders": holders(node),
            "conditions": ours, "findings": [_jsonable(f) for f in findings[:MAX_FINDINGS]],
            "score": score, "state": state}


def _jsonable(f: dict) -> dict:
    out = dict(f)
    for k in ("at", "first"):
        if out.get(k):
            out[k] = format_rfc3339(out[k])
    return out


def build(nodes: Iterable[Mapping], events: Iterable[Mapping], workloads: Iterable[Mapping], breaker: Mapping | None,
          lease: Mapping | None, now: float, since_s: float = 3600.0, warnings: list[str] | None = None,
          dra_read: tuple[Mapping, list] | None = None, all_nodes: bool = True) -> dict:
    """The view; `dra_read` (dra_watch.read_for_fleet: slices by node, DeviceTaintRules) adds each node's
    advertised GPU devices against its usable ones and the slices of dead nodes (`all_nodes`: `nodes`
    are every node, so a node not among them is deleted)."""
    nodes = list(nodes)
    events = list(events)
    by_node: dict[str, list[Mapping]] = {}
    for ev in events:
        n = involved_node(ev)
        if n:
            by_node.setdefault(n, []).append(ev)
    dra_nodes = dra_read[0] if dra_read is not None else {}  # a node whose slices advertise GPUs is a GPU node
    rows = [node_row(n, by_node.get(md(n).get("name", ""), ()), now, since_s) for n in nodes
            if is_gpu_node(n) or md(n).get("name", "") in dra_nodes]
    rows.sort(key=lambda r: (-r["score"], r["name"]))
    stale: list[dict] = []
    if dra_read is not None:
        stale = dra_rows(rows, nodes, dra_read, now, all_nodes)
    quarantined = []
    for w in workloads:
        rec = read_record(w)
        if rec is None:
            continue
        m = md(w)
        ref = WorkloadRef(w.get("kind", ""), m.get("namespace", ""), m.get("name", ""))
        quarantined.append({"workload": ref.key, "at": rec.get("at"), "nodes": rec.get("nodes") or [],
                            "undo": rec.get("undo") or {}, "reason": rec.get("reason", rec.get("garbled", "")),
                            "chain": rec.get("chain") or [], "replicas": (w.get("spec") or {}).get("replicas")})
    quarantined.sort(key=lambda q: q.get("at") or "", reverse=True)
    decisions = []
    for ev in events:
        if ev.get("reason") in CONTROLLER_REASONS and now - (event_last(ev) or 0.0) <= since_s:
            io = ev.get("involvedObject") or {}
            decisions.append({"at": format_rfc3339(event_last(ev) or 0.0), "reason": ev.get("reason"),
                              "object": f"{str(io.get('kind', '')).lower()}/{io.get('namespace', '')}/{io.get('name', '')}",
                              "message": ev.get("message", ""), "count": int(ev.get("count") or 1)})
    decisions.sort(key=lambda d: d["at"], reverse=True)
    br: dict[str, Any] = {"configmap": None, "open": False, "reason": ""}
    if breaker is not None:
        data = breaker.get("data") or {}
        br = {"configmap": f"{md(breaker).get('namespace', '')}/{md(breaker).get('name', '')}",
              "open": str(data.get("open", "")).strip().lower() in ("true", "yes", "1"),
              "reason": data.get("reason", "")}
    ctl: dict[str, Any] = {"lease": None}
    if lease is not None:
        spec = lease.get("spec") or {}
        renewed = parse_time(spec.get("renewTime"))
        duration = float(spec.get("leaseDurationSeconds") or 15)
        ctl = {"lease": f"{md(lease).get('namespace', '')}/{md(lease).get('name', '')}",
               "leader": spec.get("holderIdentity") or None,
               "renewed": format_rfc3339(renewed) if renewed else None,
               "current": bool(spec.get("holderIdentity")) and renewed is not None and now - renewed <= duration}
    counts = {s: sum(r["state"] == s for r in rows) for s in ("failing", "degraded", "ok")}
    return {"apiVersion": "gpuwarden.fleet/v1", "generatedAt": format_rfc3339(now), "sinceSeconds": since_s,
            "summary": {"gpuNodes": len(rows), **counts, "quarantined": len(quarantined)},
            "nodes": rows, "staleSlices": stale, "quarantined": quarantined, "breaker": br, "controller": ctl,
            "decisions": decisions[:20], "warnings": list(warnings or [])}


def dra_rows(rows: list[dict], nodes: list[Mapping], dra_read: tuple[Mapping, list], now: float,
             all_nodes: bool) -> list[dict]:
    """Set each DRA node's `draDevices` (its slices' GPU devices against the lost ones its agent
    reports); the slices of nodes deleted (only when `all_nodes`) or NotReady past SLICE_STALE_S."""
    slices, rules = dra_read
    for r in rows:
        ns = slices.get(r["name"])
        if ns is not None:
            r["draDevices"] = dra.device_count(ns, r["gpuCount"]["lost"], rules).to_json()
    by_name = {md(n).get("name", ""): n for n in nodes}
    found = dra.stale_slices(slices, by_name, now, dra.SLICE_STALE_S)
    return [{"node": s.node, "slices": s.slices, "devices": s.devices, "why": s.why, "gone": s.gone}
            for s in found if all_nodes or not s.gone]


def dra_lines(view: Mapping) -> list[str]:
    """The DRA section: nodes whose slices offer a lost GPU or fence some, and the slices of dead nodes."""
    out = []
    for r in view["nodes"]:
        dd = r.get("draDevices")
        if not dd or not (dd["overcounted"] or dd["fenced"]):
            continue
        offered = f"; lost and still offered: {', '.join(dd['offeredLost'])}" if dd["offeredLost"] else ""
        out.append(f"node {r['name']}: ResourceSlices advertise {dd['advertised']} GPU device(s), {dd['fenced']} "
                   f"fenced, usable {dd['usable']}{offered}")
    for s in view.get("staleSlices") or []:
        out.append(f"node {s['node']}: {len(s['slices'])} ResourceSlice(s) still advertise {s['devices']} device(s): "
                   f"{s['why']} (the scheduler keeps allocating them)")
    return out


def _cut(s: str, n: int) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def finding_line(f: Mapping, now: float, width: int = 10_000) -> str:
    """One finding of a node row: code, where it was seen (condition or Event), how long ago, message."""
    when = age(now - parse_time(f["at"])) + " ago" if f.get("at") else "?"
    count = f" x{f['count']}" if f.get("count", 1) > 1 else ""
    return f"  {f['code']:<13} {f['source']}{count}, {when}: {_cut(f['message'], width)}"


def lost_lines(r: Mapping) -> list[str]:
    """`node X: GPU 3 of 8 lost (0000:3b:00.0 GPU-…; GPU-K8S-012)`, then usable against allocatable."""
    gc = r["gpuCount"]
    total = gc["capacity"] if gc["capacity"] is not None else gc["allocatable"]
    of = f" of {total}" if total is not None else ""
    out = []
    for g in gc["lost"]:
        name = f"GPU {g['index']}" if g["index"] is not None else f"GPU {g['busId']}"
        where = " ".join(x for x in (g["busId"] if g["index"] is not None else "", g["uuid"]) if x)
        out.append(f"node {r['name']}: {name}{of} lost ({where + '; ' if where else ''}{', '.join(g['codes'])})")
    alloc = "?" if gc["allocatable"] is None else str(gc["allocatable"])
    usable = "?" if gc["usable"] is None else str(gc["usable"])
    tail = ": the scheduler still counts the lost GPU(s)" if gc["overcounted"] else ""
    out.append(f"  usable {usable}, allocatable nvidia.com/gpu {alloc}{tail}")
    return out


def render_text(view: Mapping, now: float, width: int = 160) -> str:
    s = view["summary"]
    out = [f"gpuwarden fleet: {s['gpuNodes']} GPU node(s): {s['failing']} failing, {s['degraded']} degraded, "
           f"{s['ok']} ok; {s['quarantined']} quarantined workload(s)   [{view['generatedAt']}]"]
    br = view["breaker"]
    if br.get("configmap") is None:
        out.append("breaker:    closed (no breaker ConfigMap)")
    else:
        state = "OPEN: the agents take no action" if br["open"] else "closed"
        reason = f" — {_cut(br['reason'], 100)}" if br.get("reason") else ""
        out.append(f"breaker:    {state} ({br['configmap']}){reason}" + (
            "   [close: gpuwarden release breaker]" if br["open"] else ""))
    ctl = view["controller"]
    if ctl.get("lease") is None:
        out.append("controller: no Lease (the controller has not run)")
    else:
        ago = f"renewed {age(now - parse_time(ctl['renewed']))} ago" if ctl.get("renewed") else "never renewed"
        if not ctl.get("leader"):
            out.append(f"controller: no leader (the Lease {ctl['lease']} was released; {ago})")
        else:
            live = "" if ctl.get("current") else "  (STALE: the leader stopped renewing; is the controller running?)"
            out.append(f"controller: leader {ctl['leader']}, {ago}{live}")
    for w in view.get("warnings") or []:
        out.append(f"warning:    {w}")
    out.append("")
    header = ["NODE", "STATE", "READY", "GPUS", *SHORT.values(), "SCHED", "LATEST FINDING"]
    rows = []
    for r in view["nodes"]:
        gc = r.get("gpuCount") or {}
        gpus = f"{gc['usable']}/{r['gpus']}" if gc.get("lost") and gc.get("usable") is not None else str(r["gpus"] or "-")
        cells = [r["name"], r["state"], r["ready"], gpus]
        for t in SHORT:
            c = r["conditions"].get(t)
            cells.append("-" if c is None else ("FAIL" if c["status"] == "True" else "ok"))
        sched = "cordoned" if r["unschedulable"] else ("tainted" if r["taints"] else "ok")
        cells.append(sched)
        f = r["findings"][0] if r["findings"] else None
        if f:
            when = age(now - parse_time(f["at"])) if f.get("at") else "?"
            cells.append(f"{when} ago {f['code']}: {f['message']}")
        else:
            cells.append("-")
        rows.append(cells)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)] if rows else [len(h) for h in header]
    fixed = sum(widths[:-1]) + 2 * (len(widths) - 1)
    for cells in [header] + rows:
        line = "  ".join(str(c).ljust(w) for c, w in zip(cells[:-1], widths[:-1]))
        out.append(f"{line}  {_cut(cells[-1], max(20, width - fixed))}")
    if not rows:
        out.append("(no GPU nodes: none has nvidia.com/gpu capacity, the nvidia.com/gpu.present=true label, "
                   "or a gpuwarden condition)")
    lost = [r for r in view["nodes"] if (r.get("gpuCount") or {}).get("lost")]
    if lost:
        out += ["", "LOST GPUS (usable / allocatable nvidia.com/gpu)"]
        for r in lost:
            out += lost_lines(r)
    dra_out = dra_lines(view)
    if dra_out:
        out += ["", "DRA DEVICES (ResourceSlices: advertised, fenced, usable)"] + dra_out
    bad = [r for r in view["nodes"] if r["findings"] and r["state"] != "ok"]
    if bad:
        out += ["", "FINDINGS (latest first)"]
        for r in bad:
            ready = "" if r["ready"] in ("True", "-") else \
                f"  Ready={r['ready']} ({r['readyReason'] or '-'}) since {r['readySince'] or '?'}"
            out.append(f"{r['name']}{ready}")
            out += [finding_line(f, now, width - 40) for f in r["findings"]]
    if view["quarantined"]:
        out += ["", "QUARANTINED WORKLOADS"]
        for q in view["quarantined"]:
            undo = q["undo"]
            restore = ", ".join(f"{k}={v}" for k, v in undo.items() if k in ("replicas", "suspend"))
            if undo.get("taint"):
                restore += (", " if restore else "") + "pool taint"
            out.append(f"{q['workload']}  since {q['at']}  nodes {' -> '.join(q['nodes']) or '-'}  "
                       f"undo: {restore or '-'}  [gpuwarden release {q['workload']}]")
            for i, ln in enumerate(q["chain"], 1):
                sig = "; ".join(ln.get("signals") or [])
                out.append(f"  {i}) {ln.get('node')} failed {ln.get('failedAt')} [{_cut(sig, 80)}] pod {ln.get('pod')}")
    if view["decisions"]:
        out += ["", "CONTROLLER DECISIONS (latest first)"]
        for d in view["decisions"][:10]:
            out.append(f"  {d['at']}  {d['reason']:<20} {d['object']}: {_cut(d['message'], width - 60)}")
    return "\n".join(out) + "\n"


def gather(kube: Any, namespace: str, agent_namespace: str, breaker_name: str, lease_name: str,
           node_selector: str = "") -> tuple:
    """(nodes, events, workloads, breaker ConfigMap, Lease, warnings). Raises only when Nodes cannot be listed."""
    from gpuwarden.kube.errors import KubeError

    warnings: list[str] = []
    nodes = kube.list_nodes(node_selector)
    try:
        events = list(kube.list("/api/v1/events", field_selector="source=gpuwarden").get("items") or [])
    except KubeError as exc:
        events = []
        warnings.append(f"cannot list gpuwarden Events: {exc}")
    workloads = []
    for kind in QUARANTINABLE:
        api_version, plural = WORKLOAD_KINDS[kind]
        try:
            # metadata only: the annotation is all the scan reads; the few annotated ones are then listed
            # whole by name (the list verb the readers already hold, no get)
            for w in kube.list_all(api_version, plural, metadata_only=True):
                m = md(w)
                if ANNOTATION in (m.get("annotations") or {}):
                    ref = WorkloadRef(kind, m.get("namespace", ""), m.get("name", ""))
                    whole = kube.list(ref.path.rsplit("/", 1)[0], field_selector=f"metadata.name={ref.name}")
                    workloads += [{**x, "kind": kind} for x in whole.get("items") or []]
        except KubeError as exc:
            warnings.append(f"cannot list {plural}: {exc}")
    breaker = lease = None
    try:
        breaker = kube.get_configmap(agent_namespace, breaker_name)
    except KubeError as exc:
        warnings.append(f"cannot read the breaker ConfigMap {agent_namespace}/{breaker_name}: {exc}")
    try:
        lease = kube.get_lease(namespace, lease_name)
    except KubeError as exc:
        warnings.append(f"cannot read the controller Lease {namespace}/{lease_name}: {exc}")
    return nodes, events, workloads, breaker, lease, warnings

