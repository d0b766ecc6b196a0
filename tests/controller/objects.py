"""Kubernetes objects as plain dicts, shaped like the API server returns them (and accepts them)."""

from __future__ import annotations

from gpuwarden.parsers.wallclock import format_rfc3339

T0 = 1_795_000_000.0  # 2026-11-18T...Z: a fixed "now" for pure tests


def node(name: str, ready: str | None = "True", ready_at: float = T0 - 86400, gpus: int = 8, labels: dict | None = None,
         conds: dict | None = None, reason: str = "", rv: str = "1") -> dict:
    """A node; `conds` maps a condition type to (status, lastTransitionTime[, reason, message])."""
    conditions = []
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready,
                           "reason": reason or ("KubeletReady" if ready == "True" else "NodeStatusUnknown"),
                           "message": "", "lastTransitionTime": format_rfc3339(ready_at)})
    for t, spec in (conds or {}).items():
        status, at, *rest = spec
        conditions.append({"type": t, "status": status, "reason": rest[0] if rest else f"No{t}Problem",
                           "message": rest[1] if len(rest) > 1 else "", "lastTransitionTime": format_rfc3339(at)})
    status: dict = {"conditions": conditions}
    if gpus:
        status["capacity"] = {"nvidia.com/gpu": str(gpus)}
        status["allocatable"] = {"nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels or {}, "resourceVersion": rv},
            "spec": {}, "status": status}


def pod(name: str, node_name: str, created: float, owner: tuple[str, str] | None = ("ReplicaSet", "trainer-5d8f"),
        namespace: str = "ml", gpus: int = 1, labels: dict | None = None, annotations: dict | None = None,
        uid: str | None = None, phase: str = "Running") -> dict:
    md = {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}",
          "creationTimestamp": format_rfc3339(created), "labels": labels if labels is not None else {"pod-template-hash": "5d8f"},
          "annotations": annotations or {}}
    if owner:
        md["ownerReferences"] = [{"apiVersion": "apps/v1" if owner[0] != "Job" else "batch/v1", "kind": owner[0],
                                  "name": owner[1], "uid": f"uid-{owner[1]}", "controller": True}]
    res = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md,
            "spec": {"nodeName": node_name, "containers": [{"name": "main", "image": "registry.example/cuda:12",
                                                            "resources": res}]},
            "status": {"phase": phase}}


def replicaset(name: str, deployment: str | None, namespace: str = "ml") -> dict:
    md = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if deployment:
        md["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment,
                                  "uid": f"uid-{deployment}", "controller": True}]
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": md}


def node_event(node_name: str, reason: str, first: float, last: float | None = None, etype: str = "Warning",
               message: str = "", count: int = 1) -> dict:
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{node_name}.{reason}.{int(first)}", "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": node_name, "apiVersion": "v1"},
            "type": etype, "reason": reason, "message": message or f"{reason} on {node_name}",
            "source": {"component": "gpuwarden", "host": node_name},
            "reportingComponent": "gpuwarden", "reportingInstance": node_name,
            "firstTimestamp": format_rfc3339(first), "lastTimestamp": format_rfc3339(last if last is not None else first),
            "count": count}


def deployment(name: str, replicas: int = 3, namespace: str = "ml", annotations: dict | None = None,
               rv: str = "7") -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}, "resourceVersion": rv},
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "main", "image": "registry.example/cuda:12"}]}}}}
