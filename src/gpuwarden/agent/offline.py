"""The demo's API server: `gpuwarden agent --example NAME --no-kube` runs the agent's real condition,
Event and remediation code against this stand-in, which answers reads from the example node and
prints every write as the agent would send it, instead of sending it.

Reads: the Node (its name, our conditions as last written), the pods the example's cgroups and
runtime name (no other pods), no breaker ConfigMap, no earlier Events. The example does not say
which controller owns each pod, so every pod is given a placeholder owner marked as unknown (on a
cluster, a pod with no controller is never deleted); nothing else is invented.
"""

from __future__ import annotations

import collections
import json
import sys
from typing import Any, Deque, TextIO
from urllib.parse import unquote

from gpuwarden import terminal
from gpuwarden.kube.client import Kube
from gpuwarden.kube.errors import KubeError

UNKNOWN_OWNER = {"apiVersion": "v1", "kind": "Unknown", "name": "not-known-offline", "uid": "", "controller": True}


def example_pods(root: Any, node_name: str) -> list[dict]:
    """The pods of an example node, as the API would list them on that node (names, namespaces, UIDs)."""
    from gpuwarden.facts import NodeFacts

    facts = NodeFacts(root)
    containers = facts.maybe("containers")
    out = []
    for p in (containers.pods if containers is not None else []):
        out.append({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": p.name, "namespace": p.namespace, "uid": p.uid, "labels": {},
                                 "ownerReferences": [dict(UNKNOWN_OWNER)]},
                    "spec": {"nodeName": node_name},
                    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    return out


WRITES_KEPT = 64


class OfflineKube(Kube):
    """A Kube whose requests never leave the process: reads from the example, writes printed."""

    def __init__(self, node_name: str, pods: list[dict], out: TextIO | None = None) -> None:
        super().__init__(api_client=None)
        self.out = out if out is not None else sys.stdout
        self.node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name, "uid": "", "labels": {}},
                     "spec": {}, "status": {"conditions": []}}
        self.pods = pods
        #: the latest writes (bounded: an agent runs for months, a heartbeat writes every few minutes)
        self.writes: Deque[tuple[str, str, Any]] = collections.deque(maxlen=WRITES_KEPT)
        self.written = 0  # all writes, for the names of the Events it makes up
        self._say(f"[offline] no API server: what the agent would write for node {node_name} is printed, not sent; "
                  f"its pods are the example's {len(pods)}, their controllers not known")

    def close(self) -> None:
        pass

    def _say(self, text: str) -> None:
        print(terminal.safe(text), file=self.out, flush=True)  # condition and Event messages quote the node

    def request_text(self, method: str, path: str, body: Any = None, query: list[tuple[str, str]] | None = None,
                     content_type: str | None = None, timeout: float | None = None,
                     accept: str = "application/json") -> str:
        self.reachable = True
        path = unquote(path)
        name = self.node["metadata"]["name"]
        if method == "GET":
            if path == f"/api/v1/nodes/{name}":
                return json.dumps(self.node)
            if path.endswith("/pods") or path == "/api/v1/pods":
                return json.dumps({"items": self.pods})
            if path.endswith("/events"):
                return json.dumps({"items": []})
            raise KubeError(404, "Not Found", json.dumps({"message": f"{path}: not in the example"}))
        self.writes.append((method, path, body))
        self.written += 1
        if path == f"/api/v1/nodes/{name}/status":
            self._conditions(body)
            return json.dumps(self.node)
        if method == "POST" and path.endswith("/events"):
            self._event(body)
            return json.dumps(dict(body, metadata=dict(body.get("metadata") or {}, name=f"offline.{self.written}")))
        if method == "PATCH" and "/events/" in path:
            return json.dumps(body)  # a repeat, aggregated: nothing new to show
        self._say(f"[would {method}] {path}" + (f" {json.dumps(body, sort_keys=True)}" if body else ""))
        return json.dumps(body or {})

    def _conditions(self, patch: dict) -> None:
        conds = (patch.get("status") or {}).get("conditions") or []
        have = {c.get("type"): c for c in self.node["status"]["conditions"]}
        for c in conds:
            before = have.get(c.get("type"))
            have[c.get("type")] = dict(before or {}, **c)
            if before is None or (before.get("status"), before.get("reason")) != (c.get("status"), c.get("reason")):
                if c.get("status") == "True" or before is not None:
                    self._say(f"[would write] Node {self.node['metadata']['name']} condition {c.get('type')}="
                              f"{c.get('status')} reason={c.get('reason')}: {c.get('message')}")
        self.node["status"]["conditions"] = list(have.values())

    def _event(self, ev: dict) -> None:
        def ref(o: dict) -> str:
            return f"{o.get('kind')}/{o.get('namespace') + '/' if o.get('namespace') else ''}{o.get('name')}"

        rel = ev.get("related") or {}
        about = f" about {ref(rel)}" if rel.get("kind") == "Pod" else ""
        self._say(f"[would write] Event {ev.get('type')} {ev.get('reason')} on {ref(ev.get('involvedObject') or {})}"
                  f"{about}: {ev.get('message')}")
