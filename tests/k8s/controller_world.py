"""Incident 4 played against the real test API server: the test is the kubelet (Node status), the
scheduler (binds the replacement pod), the node lifecycle controller (deletes the evicted pod) and
the Deployment/ReplicaSet/Job controllers (creates their objects and pods with owner references).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid

from kubernetes import client

from gpuwarden.controller.config import ControllerConfig
from gpuwarden.controller.loop import Controller
from gpuwarden.kube.client import Kube
from gpuwarden.parsers.wallclock import format_rfc3339


class Cluster:
    def __init__(self, k8s, n_nodes: int = 3) -> None:
        self.k8s = k8s
        self.ns = k8s.namespace
        self.v1 = client.CoreV1Api(k8s.api)
        self.apps = client.AppsV1Api(k8s.api)
        self.batch = client.BatchV1Api(k8s.api)
        self.pool = f"pool-{uuid.uuid4().hex[:8]}"
        # gpuwarden's own namespace (Lease, breaker): its workloads are never quarantined, so apart
        self.gw = f"gw-{self.pool}"
        self.v1.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.gw}})
        self.selector = f"gpuwarden-test={self.pool}"
        self.nodes = [f"{self.pool}-gpu-{c}" for c in "abcdefgh"[:n_nodes]]
        for n in self.nodes:
            self.v1.create_node({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": n, "labels": {"gpuwarden-test": self.pool, "nvidia.com/gpu.present": "true"}},
                "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                           "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                           "message": "kubelet is posting ready status",
                                           "lastTransitionTime": format_rfc3339(time.time() - 86400),
                                           "lastHeartbeatTime": format_rfc3339(time.time())}]},
            })
        self.owner: dict = {}
        self.pod_n = 0

    # -- the workload's controllers ----------------------------------------------------------------
    def deployment(self, name: str = "trainer", replicas: int = 3) -> dict:
        labels = {"app": name}
        template = {"metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "main", "image": "registry.example/render:1",
                                             "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        dep = self.apps.create_namespaced_deployment(self.ns, {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": template}})
        rs_name = f"{name}-7d9c5b"
        rs = self.apps.create_namespaced_replica_set(self.ns, {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": rs_name, "labels": {**labels, "pod-template-hash": "7d9c5b"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                                              "uid": dep.metadata.uid, "controller": True}]},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": template}})
        self.owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs_name, "uid": rs.metadata.uid,
                      "controller": True}
        self.prefix = rs_name
        self.labels = {**labels, "pod-template-hash": "7d9c5b"}
        return dep

    def job(self, name: str = "render") -> object:
        job = self.batch.create_namespaced_job(self.ns, {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": "main", "image": "registry.example/render:1",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
        self.owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job.metadata.uid,
                      "controller": True}
        self.prefix = name
        self.labels = {"job-name": name}
        return job

    # -- scheduler and kubelet ---------------------------------------------------------------------
    def run_pod(self, node: str) -> str:
        self.pod_n += 1
        name = f"{self.prefix}-{uuid.uuid4().hex[:5]}"
        self.v1.create_namespaced_pod(self.ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": self.labels, "ownerReferences": [self.owner]},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.example/render:1",
                                                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
        self.v1.patch_namespaced_pod_status(name, self.ns, {"status": {"phase": "Running"}})
        return name

    def node_fails(self, node: str, status: str = "Unknown") -> None:
        reason = "NodeStatusUnknown" if status == "Unknown" else "KubeletNotReady"
        self.v1.patch_node_status(node, {"status": {"conditions": [{
            "type": "Ready", "status": status, "reason": reason,
            "message": "Kubelet stopped posting node status." if status == "Unknown" else "PLEG is not healthy",
            "lastTransitionTime": format_rfc3339(time.time())}]}})

    def evict(self, pod: str) -> None:
        self.v1.delete_namespaced_pod(pod, self.ns, grace_period_seconds=0)

    # -- reading -----------------------------------------------------------------------------------
    def events(self, reason: str, namespace: str | None = None) -> list:
        return self.v1.list_namespaced_event(namespace or self.ns, field_selector=f"reason={reason}").items

    def deployment_obj(self, name: str = "trainer"):
        return self.apps.read_namespaced_deployment(name, self.ns)

    def annotation(self, obj, key: str = "gpuwarden.io/quarantine") -> dict | None:
        raw = (obj.metadata.annotations or {}).get(key)
        return json.loads(raw) if raw else None

    # -- the controller ----------------------------------------------------------------------------
    def controller(self, identity: str = "ctl-a", via: str = "", token: str = "", **kw) -> Controller:
        """A controller instance; `via`: the URL of a proxy its requests go through (tests/support/slowproxy.py);
        `token`: the identity it authenticates as (a server enforcing RBAC; else the admin)."""
        opts = {"namespace": self.gw, "agent_namespace": self.gw, "identity": identity,
                "node_selector": self.selector, "watch": False, "log_format": "text",
                "listen": "", **kw}
        cfg = dataclasses.replace(ControllerConfig(), **opts)
        cfg.validate()
        api = self.k8s.server.api_client(token) if token else self.k8s.server.api_client()
        if via:
            api.configuration.host = via
            # a token's kubeconfig re-applies itself (server URL too) before each request: keep the proxy
            api.configuration.refresh_api_key_hook = None
        return Controller(cfg, Kube(api, timeout_s=kw.get("lease_duration_s", 10.0)))
