#!/usr/bin/env python3
"""Render deploy/manifests/gpuwarden.yaml from the chart's values (no helm needed).

    python3 deploy/render.py            # rewrite deploy/manifests/gpuwarden.yaml
    python3 deploy/render.py --check    # exit 1 if the committed file is stale

The objects here mirror deploy/helm/gpuwarden/templates/ one for one, with the release
namespace replaced by values.namespace and the release name by "gpuwarden";
tests/agent/test_manifests.py checks the file is current and valid against the Kubernetes types.
deploy/render_controller.py renders the controller's manifest with the shared helpers here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
CHART = HERE / "helm" / "gpuwarden"
OUT = HERE / "manifests" / "gpuwarden.yaml"
NAME = "gpuwarden"


# --- shared with deploy/render_controller.py ------------------------------------------------------


def labels(v: dict, name: str = NAME, component: str = "agent") -> dict:
    return {**selector(name), "app.kubernetes.io/version": str(v["image"]["tag"]),
            "app.kubernetes.io/component": component}


def selector(name: str = NAME) -> dict:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": "gpuwarden"}


def rbac(name: str, ns: str, lab: dict, sa: str, cluster: list[dict], namespaced: list[dict]) -> list[dict]:
    """ClusterRole and Role `name` with their rules, each bound to the ServiceAccount `sa` in `ns`."""
    subjects = [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name, "labels": lab}, "rules": cluster},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name, "labels": lab},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": subjects},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name, "namespace": ns, "labels": lab}, "rules": namespaced},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": ns, "labels": lab},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": subjects},
    ]


def metrics_port(port: int, liveness_period: int) -> dict:
    """A container's metrics port and its /healthz (liveness) and /readyz (readiness) probes."""
    return {
        "ports": [{"name": "metrics", "containerPort": port, "protocol": "TCP"}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": liveness_period,
                          "timeoutSeconds": 5, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 10,
                           "timeoutSeconds": 5},
    }


def scraped_template(lab: dict, port: int, pod_spec: dict) -> dict:
    """A pod template that Prometheus scrapes on `port`."""
    return {"metadata": {"labels": lab, "annotations": {"prometheus.io/scrape": "true",
                                                        "prometheus.io/port": str(port)}},
            "spec": pod_spec}


def load_values(path: Path = CHART / "values.yaml") -> dict:
    return yaml.safe_load(path.read_text())


def write_or_check(argv: list[str], out: Path, text: str, script: str) -> int:
    """Write `text` to `out`; with --check, only exit 1 if `out` differs (run `script` to refresh)."""
    if "--check" in argv:
        if not out.exists() or out.read_text() != text:
            print(f"{out} is stale: run python3 {script}", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(out)
    return 0


# --- the agent --------------------------------------------------------------------------------------


def cluster_rules(v: dict) -> list[dict]:
    """Least privilege per remediation mode (docs/agent.md "RBAC" says why each verb)."""
    mode = v["agent"].get("remediate", "off")
    acting = mode == "on"
    rules = [
        # read the Node: our conditions' current state (lastTransitionTime), its taints, its name
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"] if acting else ["get"]},
        # our NodeConditions: a strategic-merge patch of nodes/status that lists only our types
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        # Events about the Node and Pods (create; patch aggregates repeats); list rebuilds cooldowns
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "list"]},
    ]
    if mode in ("dry-run", "on"):
        # the pods bound to this node (device plugin, GPU pods) for the remediation plan
        rules.append({"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "delete"] if acting else ["get", "list"]})
    if acting:
        rules.append({"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]})
    return rules


def agent_config(v: dict) -> str:
    # as the chart's configmap.yaml writes it: root first, then the agent values (toYaml sorts keys)
    return "root: /host\n" + yaml.safe_dump(v["agent"], sort_keys=True)


def objects(v: dict) -> list[dict]:
    ns = v["namespace"]
    lab = labels(v)
    sa = v["serviceAccount"]["name"]
    port = int(v["metrics"]["port"])
    out: list[dict] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": lab}}]
    if v["serviceAccount"]["create"]:
        out.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns, "labels": lab}})
    if v["rbac"]["create"]:
        # the Role: the circuit breaker, read fresh before every action; nothing else in the namespace
        out += rbac(NAME, ns, lab, sa, cluster_rules(v),
                    [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                      "resourceNames": [v["agent"]["breaker_configmap"]]}])
    out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{NAME}-config", "namespace": ns, "labels": lab},
                "data": {"agent.yaml": agent_config(v)}})
    ro = True
    mounts = [
        {"name": "host", "mountPath": "/host", "readOnly": ro},
        {"name": "host-sys", "mountPath": "/host/sys", "readOnly": ro},
        {"name": "host-dev", "mountPath": "/host/dev", "readOnly": ro},
        {"name": "kubelet", "mountPath": "/host/var/lib/kubelet", "readOnly": ro},
        {"name": "device-plugins", "mountPath": "/host/var/lib/kubelet/device-plugins", "readOnly": ro},
        {"name": "pod-resources", "mountPath": "/host/var/lib/kubelet/pod-resources", "readOnly": ro},
        {"name": "config", "mountPath": "/etc/gpuwarden", "readOnly": ro},
    ]
    volumes = [
        {"name": "host", "hostPath": {"path": "/", "type": "Directory"}},
        {"name": "host-sys", "hostPath": {"path": "/sys", "type": "Directory"}},
        {"name": "host-dev", "hostPath": {"path": "/dev", "type": "Directory"}},
        {"name": "kubelet", "hostPath": {"path": "/var/lib/kubelet", "type": "Directory"}},
        {"name": "device-plugins", "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "DirectoryOrCreate"}},
        {"name": "pod-resources", "hostPath": {"path": "/var/lib/kubelet/pod-resources", "type": "DirectoryOrCreate"}},
        {"name": "config", "configMap": {"name": f"{NAME}-config"}},
    ]
    sc = v["securityContext"]
    container = {
        "name": "agent",
        "image": f"{v['image']['repository']}:{v['image']['tag']}",
        "imagePullPolicy": v["image"]["pullPolicy"],
        "args": ["agent", "--config", "/etc/gpuwarden/agent.yaml"],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
        ],
        **metrics_port(port, liveness_period=30),
        "resources": v["resources"],
        "securityContext": {"privileged": bool(sc["privileged"]), "readOnlyRootFilesystem": True,
                            "runAsUser": 0, "capabilities": {"drop": ["ALL"], "add": list(sc["capabilities"]["add"])}},
        "volumeMounts": mounts,
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": sa,
        "hostPID": True,
        "nodeSelector": v["nodeSelector"],
        "tolerations": v["tolerations"],
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": 10,
    }
    if v.get("priorityClassName"):
        pod_spec["priorityClassName"] = v["priorityClassName"]
    if v.get("runtimeClassName"):
        pod_spec["runtimeClassName"] = v["runtimeClassName"]
    out.append({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": NAME, "namespace": ns, "labels": lab},
        "spec": {
            "selector": {"matchLabels": selector()},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": scraped_template(lab, port, pod_spec),
        },
    })
    if v["metrics"]["service"]["enabled"]:
        out.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": NAME, "namespace": ns, "labels": lab},
                    "spec": {"clusterIP": "None", "selector": selector(),
                             "ports": [{"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}]}})
    if v["metrics"]["serviceMonitor"]["enabled"]:
        out.append({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                    "metadata": {"name": NAME, "namespace": ns, "labels": {**lab, **v["metrics"]["serviceMonitor"]["labels"]}},
                    "spec": {"selector": {"matchLabels": selector()},
                             "endpoints": [{"port": "metrics", "interval": v["metrics"]["serviceMonitor"]["interval"]}]}})
    return out


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, s: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _str)


def render(values: dict | None = None) -> str:
    v = values or load_values()
    header = ("# Rendered by deploy/render.py from deploy/helm/gpuwarden/values.yaml (defaults): do not edit.\n"
              "# Usable with kubectl apply -f or as a kustomize resource.\n")
    return header + yaml.dump_all(objects(v), Dumper=_Dumper, sort_keys=False, explicit_start=True)


def main(argv: list[str]) -> int:
    return write_or_check(argv, OUT, render(), "deploy/render.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
