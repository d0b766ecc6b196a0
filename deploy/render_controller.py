#!/usr/bin/env python3
"""Render deploy/manifests/controller.yaml: the gpuwarden controller (Deployment, ServiceAccount, RBAC).

    python3 deploy/render_controller.py            # rewrite deploy/manifests/controller.yaml
    python3 deploy/render_controller.py --check    # exit 1 if the committed file is stale

The objects mirror deploy/helm/gpuwarden/templates/controller-*.yaml one for one, from the
chart's `controller:` values when values.yaml has them, else from DEFAULTS below (the same
defaults the templates use). Release name "gpuwarden", namespace values.namespace.
tests/controller/test_controller_manifests.py checks the file is current, strictly valid, and that
its RBAC covers every API call the controller makes. The helpers it shares with the agent's
manifest are in deploy/render.py.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
OUT = HERE / "manifests" / "controller.yaml"
NAME = "gpuwarden-controller"

# deploy/render.py by its path: this script runs from anywhere, and tests load it by path too
_spec = importlib.util.spec_from_file_location("gpuwarden_deploy_render", HERE / "render.py")
common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(common)
load_values = common.load_values

DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "replicas": 2,
    "execute": False,  # dry run: Events and logs only
    "actions": ["workload"],  # and/or "taint"
    "args": [],  # more `gpuwarden controller` flags, e.g. ["--window=20m"]
    "port": 9466,
    "breakerConfigMap": "gpuwarden-breaker",
    "resources": {"requests": {"cpu": "20m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}},
    "nodeSelector": {},
    "tolerations": [],
}


def settings(values: dict) -> dict:
    c = copy.deepcopy(DEFAULTS)
    c.update(values.get("controller") or {})
    return c


def cluster_rules(c: dict) -> list[dict]:
    """Least privilege: a dry run only reads (and records Events); --execute adds the patches its actions need."""
    execute = bool(c["execute"])
    taint = execute and "taint" in c["actions"]
    workload = execute and ("workload" in c["actions"] or "taint" in c["actions"])
    read = ["get", "list", "watch"]
    return [
        # watch Nodes (conditions); taint the GPU pool (--actions taint)
        {"apiGroups": [""], "resources": ["nodes"], "verbs": read + (["patch"] if taint else [])},
        # watch Pods: which workload's pods were on which node
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        # watch the agents' Events; create (patch aggregates) the controller's own
        {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "watch", "create", "patch"]},
        # owner chains (ReplicaSet -> Deployment, Job -> CronJob); quarantine: scale to 0 / suspend + annotation
        {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets", "replicasets"],
         "verbs": ["get", "list"] + (["patch"] if workload else [])},
        {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"],
         "verbs": ["get", "list"] + (["patch"] if workload else [])},
    ]


def namespace_rules(c: dict) -> list[dict]:
    rules = [
        # leader election (create cannot be limited to a name)
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "update"],
         "resourceNames": [NAME]},
    ]
    if c["execute"]:
        # open the agents' circuit breaker in a storm (created when missing)
        rules += [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
                  {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"],
                   "resourceNames": [c["breakerConfigMap"]]}]
    else:
        rules.append({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                      "resourceNames": [c["breakerConfigMap"]]})
    return rules


def args(c: dict) -> list[str]:
    out = ["controller", f"--listen=0.0.0.0:{int(c['port'])}", f"--actions={','.join(c['actions'])}"]
    if c["execute"]:
        out.append("--execute")
    return out + [str(a) for a in c["args"]]


def objects(values: dict) -> list[dict]:
    c = settings(values)
    if not c["enabled"]:
        return []
    ns = values["namespace"]
    lab = common.labels(values, NAME, "controller")
    port = int(c["port"])
    out: list[dict] = [{"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": NAME, "namespace": ns, "labels": lab}}]
    if values["rbac"]["create"]:
        out += common.rbac(NAME, ns, lab, NAME, cluster_rules(c), namespace_rules(c))
    container = {
        "name": "controller",
        "image": f"{values['image']['repository']}:{values['image']['tag']}",
        "imagePullPolicy": values["image"]["pullPolicy"],
        "args": args(c),
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ],
        **common.metrics_port(port, liveness_period=20),
        "resources": c["resources"],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                            "runAsUser": 65532, "capabilities": {"drop": ["ALL"]}},
    }
    pod_spec: dict[str, Any] = {"serviceAccountName": NAME, "containers": [container],
                                "terminationGracePeriodSeconds": 15}
    if c["nodeSelector"]:
        pod_spec["nodeSelector"] = c["nodeSelector"]
    if c["tolerations"]:
        pod_spec["tolerations"] = c["tolerations"]
    if values.get("priorityClassName"):
        pod_spec["priorityClassName"] = values["priorityClassName"]
    out.append({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": NAME, "namespace": ns, "labels": lab},
        "spec": {
            "replicas": int(c["replicas"]),
            "selector": {"matchLabels": common.selector(NAME)},
            "template": common.scraped_template(lab, port, pod_spec),
        },
    })
    return out


def render(values: dict | None = None) -> str:
    v = values or load_values()
    header = ("# Rendered by deploy/render_controller.py from deploy/helm/gpuwarden/values.yaml (defaults): do not "
              "edit.\n# The gpuwarden controller (docs/controller.md); apply after gpuwarden.yaml (its namespace).\n")
    return header + yaml.safe_dump_all(objects(v), sort_keys=False, explicit_start=True)


def main(argv: list[str]) -> int:
    return common.write_or_check(argv, OUT, render(), "deploy/render_controller.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
