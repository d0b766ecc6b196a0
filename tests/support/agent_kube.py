"""Cluster fixtures for the agent's tests against the real test API server.

The test server runs no kubelet, scheduler or controllers: these helpers play them (register a
Node with the kubelet's and node-problem-detector's conditions, create bound pods, mark them
Running/Ready, recreate the device-plugin pod as its DaemonSet would).
"""

from __future__ import annotations

import io
from typing import Any

from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.loop import Agent
from gpuwarden.kube.client import Kube
from gpuwarden.kube.errors import KubeError

T0 = "2026-01-01T00:00:00Z"
KUBELET_READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                 "lastHeartbeatTime": T0, "lastTransitionTime": T0}
KUBELET_MEMORY = {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                  "message": "kubelet has sufficient memory available", "lastHeartbeatTime": T0, "lastTransitionTime": T0}
NPD_KERNEL = {"type": "KernelDeadlock", "status": "False", "reason": "KernelHasNoDeadlock",
              "message": "kernel has no deadlock", "lastHeartbeatTime": T0, "lastTransitionTime": T0}
OWNED_BY_RS = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "trainer", "uid": "7d1c0c5e-0000-4000-8000-000000000001",
                "controller": True}]
OWNED_BY_DS = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvidia-device-plugin-daemonset",
                "uid": "7d1c0c5e-0000-4000-8000-000000000002", "controller": True}]


class Quiet:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def info(self, msg: str, **kv: Any) -> None:
        self.lines.append((msg, kv))

    warn = error = info


def ensure_namespace(kube: Kube, name: str) -> None:
    try:
        kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except KubeError as exc:
        if not exc.conflict:
            raise


#: Nodes made by these helpers; `cleanup_nodes` deletes them (the API server is shared by the session)
CREATED_NODES: list[str] = []


def cleanup_nodes(kube: Kube) -> None:
    while CREATED_NODES:
        try:
            kube.request("DELETE", f"/api/v1/nodes/{CREATED_NODES.pop()}")
        except KubeError:
            pass


def make_node(kube: Kube, name: str, conditions: list[dict] | None = None, taints: list[dict] | None = None,
              annotations: dict | None = None) -> dict:
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}, "annotations": annotations or {}},
            "spec": {"taints": taints or []},
            "status": {"conditions": conditions if conditions is not None else [KUBELET_READY, KUBELET_MEMORY, NPD_KERNEL]}}
    node = kube.request("POST", "/api/v1/nodes", body)
    CREATED_NODES.append(name)
    return node


def make_pod(kube: Kube, namespace: str, name: str, node: str, labels: dict | None = None,
             annotations: dict | None = None, owners: list | None = None, ready: bool = True, gpu: bool = True) -> dict:
    res = {"limits": {"nvidia.com/gpu": "1"}} if gpu else {}
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}, "annotations": annotations or {},
                         "ownerReferences": OWNED_BY_RS if owners is None else owners},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": name.split("-")[0], "image": "registry.example/x:1", "resources": res}]}}
    pod = kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    if ready:
        pod = set_ready(kube, pod)
    return pod


def set_ready(kube: Kube, pod: dict) -> dict:
    md = pod["metadata"]
    status = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    return kube.request("PATCH", f"/api/v1/namespaces/{md['namespace']}/pods/{md['name']}/status", status,
                        content_type="application/merge-patch+json")


def plugin_pod(kube: Kube, namespace: str, name: str, node: str, ready: bool = True) -> dict:
    return make_pod(kube, namespace, name, node, labels={"app.kubernetes.io/name": "nvidia-device-plugin"},
                    owners=OWNED_BY_DS, ready=ready, gpu=False)


def pods_named(kube: Kube, namespace: str) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in kube.list_pods(namespace=namespace)}


def delete_all_pods(kube: Kube, namespace: str) -> None:
    for p in kube.list_pods(namespace=namespace):
        try:
            kube.delete_pod(namespace, p["metadata"]["name"], grace_s=0)
        except KubeError:
            pass


def conditions_of(kube: Kube, node: str) -> dict[str, dict]:
    return {c["type"]: c for c in kube.get_node(node)["status"].get("conditions") or []}


def our_events(kube: Kube, node: str, namespace: str = "") -> list[dict]:
    return [e for e in kube.list_events(namespace=namespace, field_selector="reportingComponent=gpuwarden")
            if e.get("reportingInstance") == node]


def new_agent(kube: Kube, node: str, root: Any, namespace: str, **kw: Any) -> tuple[Agent, io.StringIO]:
    base = dict(node_name=node, namespace=namespace, listen="", probes=False, grpc=False, boot_grace_s=0,
                debounce_raise=2, debounce_clear=3)
    base.update(kw)
    out = io.StringIO()
    a = Agent(AgentConfig(**base), kube=kube, root=root, out=out, log=Quiet())
    a.start()
    return a, out


# -- API load: what the agent costs the control plane ------------------------------------------------

def request_counts(server_url: str) -> dict[tuple[str, str, str], int]:
    """(verb, resource, subresource) -> requests so far, from the API server's own
    `apiserver_request_total` (its /metrics), not from the client."""
    import re
    import urllib.request

    text = urllib.request.urlopen(server_url + "/metrics", timeout=10).read().decode()
    out: dict[tuple[str, str, str], int] = {}
    for m in re.finditer(r'^apiserver_request_total\{([^}]*)\} (\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
        out[key] = out.get(key, 0) + int(float(m.group(2)))
    return out


def agent_hour(kube: Kube, server_url: str, node: str, root: Any, namespace: str, hours: float = 1.0,
               interval_s: float = 60.0, **kw: Any) -> tuple[dict[tuple[str, str, str], int], Agent]:
    """Run the agent's check loop over a simulated `hours` (its clock moves `interval_s` a check)
    against the real API server; the requests it made after start-up, by verb and resource."""
    clock = [1_800_000_000.0]
    base = dict(node_name=node, namespace=namespace, listen="", probes=False, grpc=False, boot_grace_s=0,
                interval_s=interval_s)
    base.update(kw)
    agent = Agent(AgentConfig(**base), kube=kube, root=root, clock=lambda: clock[0], out=io.StringIO(), log=Quiet())
    agent.start()
    before = request_counts(server_url)
    for _ in range(int(hours * 3600 / interval_s)):
        agent.check()
        clock[0] += interval_s
    after = request_counts(server_url)
    diff = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}
    diff.pop(("GET", "", "/metrics"), None)
    return diff, agent
