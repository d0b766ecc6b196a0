"""One API call (or read-modify-write) per action kind; raises on failure.

- restart-device-plugin, delete-pod: DELETE the pod with a uid precondition (a same-named
  successor is never deleted). The device plugin's DaemonSet recreates its pod; the GPU pod's
  controller recreates it with a fresh device cgroup. Delete, not evict: these pods are broken
  already and a PodDisruptionBudget must not keep them broken.
- evict-pod-for-memory: the eviction API (policy/v1), so PodDisruptionBudgets apply.
- cordon-node: spec.unschedulable=true (strategic merge patch).
- taint-node: adds `<key>=<value>:NoSchedule` to spec.taints with a merge patch carrying the
  Node's resourceVersion (taints have no merge key: the whole list is sent, so a concurrent
  change must make the write fail and be retried, not be overwritten).
- untaint-node: removes that taint (our key, NoSchedule) and nothing else, the same way, once
  the fault that set it has cleared.
- taint-device: creates the DeviceTaintRule of the plan (resource.k8s.io; exactly one device:
  driver, pool and device all set), so the scheduler stops placing claims on that GPU only (and,
  with NoExecute, evicts the pods using it). An existing rule of ours on the device is kept.
- untaint-device: deletes our DeviceTaintRule of the device, with a uid precondition.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.kube import dra
from gpuwarden.kube.client import MERGE
from gpuwarden.kube.errors import KubeError
from gpuwarden.remediation.plan import Action


def apply(kube: Any, action: Action) -> str:
    t = action.target
    if action.kind in ("restart-device-plugin", "delete-pod"):
        kube.delete_pod(t.namespace, t.name, uid=t.uid)
        return f"deleted pod {t.namespace}/{t.name}"
    if action.kind == "evict-pod-for-memory":
        kube.evict_pod(t.namespace, t.name, uid=t.uid)
        return f"evicted pod {t.namespace}/{t.name}"
    if action.kind == "cordon-node":
        kube.patch_node(t.name, {"spec": {"unschedulable": True}})
        return f"cordoned node {t.name}"
    if action.kind == "taint-node":
        return _taint(kube, t.name, action.detail["taint"])
    if action.kind == "untaint-node":
        return _untaint(kube, t.name, action.detail["taint"])
    if action.kind == "taint-device":
        return dra.create_taint_rule(kube, action.detail["rule"])
    if action.kind == "untaint-device":
        return dra.delete_taint_rule(kube, action.detail["rule"])
    raise ValueError(f"unknown action kind {action.kind!r}")


def _same(x: dict, taint: dict) -> bool:
    return x.get("key") == taint["key"] and x.get("effect") == taint["effect"]


def _untaint(kube: Any, node_name: str, taint: dict) -> str:
    """Remove our taint (its key and effect) and nothing else."""
    return _edit_taints(kube, node_name, lambda ts: [x for x in ts if not _same(x, taint)] if any(
        _same(x, taint) for x in ts) else None,
        f"removed taint {taint['key']}={taint.get('value', '')}:{taint['effect']} from node {node_name}",
        f"node {node_name} no longer has taint {taint['key']}:{taint['effect']}")


def _taint(kube: Any, node_name: str, taint: dict) -> str:
    return _edit_taints(kube, node_name, lambda ts: None if any(_same(x, taint) for x in ts) else ts + [dict(taint)],
                        f"tainted node {node_name} {taint['key']}={taint['value']}:{taint['effect']}",
                        f"node {node_name} already has taint {taint['key']}:{taint['effect']}")


def _edit_taints(kube: Any, node_name: str, edit: Any, done: str, nothing: str, attempts: int = 3) -> str:
    """Read the Node, edit its taints (`edit` returns the new list, or None: nothing to change) and write
    the whole list under the Node's resourceVersion: taints have no merge key, so a concurrent change
    must make the write fail and be retried, never be overwritten."""
    last: Exception | None = None
    for _ in range(attempts):
        node = kube.get_node(node_name)
        new = edit(list((node.get("spec") or {}).get("taints") or []))
        if new is None:
            return nothing
        rv = (node.get("metadata") or {}).get("resourceVersion", "")
        try:
            kube.patch_node(node_name, {"metadata": {"resourceVersion": rv}, "spec": {"taints": new or None}},
                            content_type=MERGE)
            return done
        except KubeError as exc:
            if not exc.conflict:
                raise
            last = exc
    raise last or RuntimeError("taint: conflict")
