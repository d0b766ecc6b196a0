"""core/v1 Events about the Node or a Pod, aggregated like client-go's recorder.

An Event is keyed by (involved object, type, reason, message); a repeat within
`aggregate_s` bumps `count` and `lastTimestamp` of the existing Event (a merge patch)
instead of creating a new one. Events about the Node live in `event_namespace`
("default", as the kubelet's); Events about a Pod live in the Pod's namespace
(apiserver validation requires it). reportingComponent is "gpuwarden" and
reportingInstance the node name; Events for actions also carry `action`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, Callable

from gpuwarden.agent.conditions import now_rfc3339, one_line

COMPONENT = "gpuwarden"
MAX_REASON = 128
MAX_ACTION = 128


@dataclass(frozen=True)
class ObjectRef:
    kind: str  # "Node" | "Pod"
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"

    def to_json(self) -> dict:
        d = {"kind": self.kind, "name": self.name, "apiVersion": self.api_version}
        if self.namespace:
            d["namespace"] = self.namespace
        if self.uid:
            d["uid"] = self.uid
        return d


def node_ref(node: dict | str) -> ObjectRef:
    if isinstance(node, str):
        return ObjectRef("Node", node)
    md = node.get("metadata") or {}
    return ObjectRef("Node", md.get("name", ""), uid=md.get("uid", ""))


def pod_ref(pod: dict) -> ObjectRef:
    md = pod.get("metadata") or {}
    return ObjectRef("Pod", md.get("name", ""), md.get("namespace", ""), md.get("uid", ""))


def _dns_name(s: str) -> str:
    s = re.sub(r"[^a-z0-9.-]+", "-", s.lower()).strip("-.")
    return s[:200] or "gpuwarden"


class EventRecorder:
    def __init__(self, kube: Any, node_name: str, node_namespace: str = "default",
                 aggregate_s: float = 3600.0, clock: Callable[[], float] = time.time, log: Any = None) -> None:
        self.kube = kube
        self.node_name = node_name
        self.node_namespace = node_namespace
        self.aggregate_s = aggregate_s
        self.clock = clock
        self.log = log
        self._seen: dict[tuple, tuple[str, str, int, float]] = {}  # key -> (ns, name, count, last)
        self.emitted: list[dict] = []  # what was sent (created or bumped), newest last

    def emit(self, obj: ObjectRef, etype: str, reason: str, message: str, action: str = "",
             related: ObjectRef | None = None, annotations: dict[str, str] | None = None) -> dict | None:
        """Create or aggregate an Event; returns the Event as sent, None when the API refused it."""
        now = self.clock()
        ns = obj.namespace if obj.kind != "Node" and obj.namespace else self.node_namespace
        message = one_line(message)
        reason = reason[:MAX_REASON]
        key = (obj.kind, obj.namespace, obj.name, obj.uid, etype, reason, message, action)
        prev = self._seen.get(key)
        ts = now_rfc3339(now)
        try:
            if prev and now - prev[3] < self.aggregate_s:
                pns, pname, count, _ = prev
                patch = {"count": count + 1, "lastTimestamp": ts}
                try:
                    ev = self.kube.patch_event(pns, pname, patch)
                    self._seen[key] = (pns, pname, count + 1, now)
                    self.emitted.append(ev)
                    return ev
                except Exception as exc:
                    if getattr(exc, "status", None) != 404:
                        raise
            name = f"{_dns_name(obj.name)}.{time.time_ns():x}"
            body = {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": name, "namespace": ns, **({"annotations": annotations} if annotations else {})},
                "involvedObject": obj.to_json(),
                "type": etype, "reason": reason, "message": message,
                "source": {"component": COMPONENT, "host": self.node_name},
                "reportingComponent": COMPONENT, "reportingInstance": self.node_name,
                "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
            }
            if action:
                body["action"] = action[:MAX_ACTION]
            if related is not None:
                body["related"] = related.to_json()
            ev = self.kube.create_event(ns, body)
            self._seen[key] = (ns, name, 1, now)
            self.emitted.append(ev)
            return ev
        except Exception as exc:  # an Event is best effort: never fail a check or an action on it
            if self.log:
                self.log.warn("event-failed", reason=reason, object=f"{obj.kind}/{obj.namespace}/{obj.name}",
                              error=str(exc))
            return None
