"""core/v1 Events about the Node or a Pod, aggregated like client-go's recorder.

An Event is keyed by (involved object, type, reason, message); a repeat within
`aggregate_s` bumps `count` and `lastTimestamp` of the existing Event (a merge patch)
instead of creating a new one. Events about the Node live in `event_namespace`
("default", as the kubelet's); Events about a Pod live in the Pod's namespace
(apiserver validation requires it). reportingComponent is "gpuwarden" and
reportingInstance the node name; Events for actions also carry `action`. The agent's Events carry the
label `gpuwarden.io/node=<node>` (`node_label`), so its own start-up and `kubectl gpuwarden node X`
read one node's Events with a label selector instead of every gpuwarden Event in the cluster
(kube-apiserver has no field selector on reportingInstance).

With an outbox (the agent's `Outbox`, agent/outbox.py) an Event the API does not take (unreachable, 5xx, 429) waits on
the node's disk and is sent when the API serves again; without one it is best effort.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any, Callable

from msgspec import Struct

from gpuwarden.kube.conditions import one_line
from gpuwarden.kube.errors import retryable
from gpuwarden.parsers.wallclock import format_rfc3339

COMPONENT = "gpuwarden"
MAX_REASON = 128
MAX_ACTION = 128
NODE_LABEL = "gpuwarden.io/node"
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def node_label(node: str) -> str:
    """The `gpuwarden.io/node` label value of a node: its name, or (a name longer than a label value
    may be) a stable digest of it."""
    if _LABEL_VALUE.match(node):
        return node
    return "h-" + hashlib.sha256(node.encode()).hexdigest()[:40]


def node_selector(node: str) -> str:
    """Label selector of the Events the agent of `node` emitted."""
    return f"{NODE_LABEL}={node_label(node)}"


class ObjectRef(Struct, frozen=True):
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


def event_pod(ev: dict) -> dict | None:
    """The pod an agent's Event is about: its `related` object (the agent reports on its Node), or the
    involvedObject of an Event written before that; None when about no pod."""
    for k in ("related", "involvedObject"):
        o = ev.get(k) or {}
        if o.get("kind") == "Pod":
            return o
    return None


def _dns_name(s: str) -> str:
    s = re.sub(r"[^a-z0-9.-]+", "-", s.lower()).strip("-.")
    return s[:200] or "gpuwarden"


class EventRecorder:
    def __init__(self, kube: Any, node_name: str, node_namespace: str = "default",
                 aggregate_s: float = 3600.0, clock: Callable[[], float] = time.time, log: Any = None,
                 outbox: Any = None, label_node: bool = False) -> None:
        self.kube = kube
        self.node_name = node_name
        self.node_namespace = node_namespace
        self.aggregate_s = aggregate_s
        self.clock = clock
        self.log = log
        self.outbox = outbox
        self.labels = {NODE_LABEL: node_label(node_name)} if label_node else {}
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
        ts = format_rfc3339(now)
        if self.outbox is not None and self.outbox.events and not self.flush():
            # older Events still wait: this one queues behind them (their order is kept)
            self._queue(key, self._body(obj, ns, etype, reason, message, action, related, annotations, ts))
            return None
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
            body = self._body(obj, ns, etype, reason, message, action, related, annotations, ts)
            ev = self.kube.create_event(ns, body)
            self._seen[key] = (ns, body["metadata"]["name"], 1, now)
            self.emitted.append(ev)
            return ev
        except Exception as exc:  # never fail a check or an action on an Event
            queued = self.outbox is not None and retryable(exc)
            if queued:
                self._queue(key, self._body(obj, ns, etype, reason, message, action, related, annotations, ts))
            if self.log:
                self.log.warn("event-failed", reason=reason, object=f"{obj.kind}/{obj.namespace}/{obj.name}",
                              error=str(exc), queued=queued)
            return None

    def emit_once(self, obj: ObjectRef, etype: str, reason: str, message: str, name: str, action: str = "",
                  annotations: dict[str, str] | None = None) -> str:
        """Create the Event under a name fixed by what it reports (never aggregated): a second create of
        it is refused by the API server (409), so whoever writes it, and however often, there is one.
        Returns "created", "exists" (it was there already), or "failed: why" (not sent or refused)."""
        ns = obj.namespace if obj.kind != "Node" and obj.namespace else self.node_namespace
        body = self._body(obj, ns, etype, reason[:MAX_REASON], one_line(message), action, None, annotations,
                          format_rfc3339(self.clock()), name=name)
        try:
            ev = self.kube.create_event(ns, body)
        except Exception as exc:
            if getattr(exc, "status", None) == 409:
                return "exists"
            if self.log:
                self.log.warn("event-failed", reason=reason, object=f"{obj.kind}/{obj.namespace}/{obj.name}",
                              event=name, error=str(exc), queued=False)
            return f"failed: {exc}"
        self.emitted.append(ev)
        return "created"

    def _body(self, obj: ObjectRef, ns: str, etype: str, reason: str, message: str, action: str,
              related: ObjectRef | None, annotations: dict[str, str] | None, ts: str, name: str = "") -> dict:
        meta: dict[str, Any] = {"name": name or f"{_dns_name(obj.name)}.{time.time_ns():x}", "namespace": ns}
        if self.labels:
            meta["labels"] = dict(self.labels)
        if annotations:
            meta["annotations"] = annotations
        body = {
            "apiVersion": "v1", "kind": "Event", "metadata": meta,
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
        return body

    def _queue(self, key: tuple, body: dict) -> None:
        self.outbox.put_event(json.dumps(key), body["metadata"]["namespace"], body)

    def flush(self) -> bool:
        """Send the Events waiting in the outbox; True when none is left."""
        if self.outbox is None or not self.outbox.events:
            return True

        def send(ns: str, body: dict) -> None:
            ev = self.kube.create_event(ns, body)
            self.emitted.append(ev)

        def remember(e: dict) -> None:
            key = tuple(json.loads(e["key"]))
            b = e["body"]
            self._seen[key] = (e["namespace"], b["metadata"]["name"], int(b.get("count") or 1), self.clock())

        waiting = list(self.outbox.events)
        n = self.outbox.flush_events(send, retryable)
        for e in waiting[:n]:
            remember(e)
        if n and self.log:
            self.log.info("outbox-delivered", events=n, waiting=len(self.outbox.events))
        return not self.outbox.events

