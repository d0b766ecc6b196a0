"""One node as the agent published it: its gpuwarden NodeConditions and the Events it emitted.

The agent reports through the API server only (docs/agent.md): one NodeCondition per family and
core/v1 Events with `reportingInstance` = the node, about the Node (an affected Pod as `related`).
Nothing here opens a shell on the node. `build` is a pure function of what was read; the
conditions and node Events are summarised by the fleet view's own `node_row`.
"""

from __future__ import annotations

import heapq
from typing import Any, Iterable, Mapping

from gpuwarden.controller import fleet
from gpuwarden.controller.model import age, event_first, event_last, involved_node, md, parse_time, trim_event
from gpuwarden.kube.events import event_pod
from gpuwarden.parsers.wallclock import format_rfc3339


#: the most Events the view reads into memory (the newest; `kubectl get events` has the rest)
MAX_EVENTS = 500


def on_node(ev: Mapping, node: str) -> bool:
    """An Event about the Node, from its own agent or another reporter (the controller, the kubelet)."""
    return involved_node(ev) == node


def gather(kube: Any, node: str) -> tuple[dict, list[dict]]:
    """(the Node, gpuwarden's Events about it and its pods). KubeError when the Node cannot be read.

    O(this node): gpuwarden's Events whose involvedObject is the Node, selected by the API server
    (involvedObject.kind and .name: the agent names its Node without its uid), the newest
    `MAX_EVENTS` kept. Its agent reports on its pods on the Node too (the pod as `related`). The
    involved object is what the chart's policy checks against the agent's token and keeps from
    changing on update: another node's agent can neither write here nor move an Event away. A label
    or the reporting instance is no key: an Event relabelled or retargeted would hide."""
    obj = kube.get_node(node)
    fields = f"involvedObject.kind=Node,involvedObject.name={node},source=gpuwarden"
    return obj, newest(ev for ev in kube.iter_items("/api/v1/events", "", fields) if on_node(ev, node))


def newest(events: Iterable[Mapping], keep: int = MAX_EVENTS) -> list[dict]:
    """The `keep` most recent Events (by last seen), each trimmed to what the view shows, read as a
    stream: a node with 25,000 Events costs a page and `keep` trimmed Events, not the whole list."""
    heap: list[tuple[float, int, dict]] = []
    for i, ev in enumerate(events):
        item = (event_last(ev) or 0.0, i, ev)
        if len(heap) < keep:
            heapq.heappush(heap, (item[0], i, trim_event(ev)))
        elif item[0] > heap[0][0]:
            heapq.heapreplace(heap, (item[0], i, trim_event(ev)))
    return [ev for _, _, ev in sorted(heap, reverse=True)]


def build(node: Mapping, events: Iterable[Mapping], now: float, since_s: float = 86400.0) -> dict:
    events = list(events)
    name = md(node).get("name", "")
    row = fleet.node_row(node, [ev for ev in events if involved_node(ev) == name], now, since_s)
    pods = []
    for ev in events:
        io = event_pod(ev) or {}
        last = event_last(ev) or 0.0
        if not io or now - last > since_s:
            continue
        first = event_first(ev)
        pods.append({"pod": f"{io.get('namespace', '')}/{io.get('name', '')}", "type": ev.get("type", ""),
                     "reason": ev.get("reason", ""), "message": ev.get("message", ""),
                     "count": int(ev.get("count") or 1), "at": format_rfc3339(last),
                     "first": format_rfc3339(first) if first else None})
    pods.sort(key=lambda p: p["at"], reverse=True)
    return {"apiVersion": "gpuwarden.node/v1", "generatedAt": format_rfc3339(now), "sinceSeconds": since_s,
            "node": row, "podEvents": pods, "eventsCapped": len(events) >= MAX_EVENTS}


def render_text(view: Mapping, now: float) -> str:
    r = view["node"]
    sched = "cordoned" if r["unschedulable"] else ("tainted " + ", ".join(
        f"{t.get('key')}={t.get('value', '')}:{t.get('effect', '')}" for t in r["taints"]) if r["taints"] else "ok")
    out = [f"node {r['name']}: {r['state']}   Ready={r['ready']}   GPUs {r['gpus'] or '-'}   scheduling {sched}",
           ""]
    if not r["conditions"]:
        out.append("no gpuwarden conditions: no agent has reported on this node (run `kubectl gpuwarden check "
                   f"{r['name']}` for a one-shot check)")
    else:
        out.append("CONDITIONS (set by the gpuwarden agent on this node)")
        width = max(len(t) for t in r["conditions"])
        for t, c in sorted(r["conditions"].items(), key=lambda kv: (kv[1]["status"] != "True", kv[0])):
            since = parse_time(c.get("since"))
            when = f"since {age(now - since)}" if since else ""
            out.append(f"  {t:<{width}}  {c['status']:<5} {c['reason']:<24} {when}")
            if c["status"] == "True" and c.get("message"):
                out.append(f"      {c['message']}")
    if r["findings"]:
        out += ["", "FINDINGS (latest first)"]
        out += [fleet.finding_line(f, now) for f in r["findings"]]
    if view.get("eventsCapped"):
        out += ["", f"(the newest {MAX_EVENTS} of this node's Events; kubectl get events --field-selector "
                    f"involvedObject.name={r['name']} lists all)"]
    if view["podEvents"]:
        out += ["", "PODS ON THIS NODE (Events from its agent, latest first)"]
        for p in view["podEvents"]:
            count = f" x{p['count']}" if p["count"] > 1 else ""
            out.append(f"  {p['at']}  {p['type']:<7} {p['reason']:<22} {p['pod']}{count}: {p['message']}")
    return "\n".join(out) + "\n"
