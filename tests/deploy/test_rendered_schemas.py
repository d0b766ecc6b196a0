"""Every manifest we ship or create, validated against the Kubernetes OpenAPI schemas (offline).

The chart is rendered by Helm's own engine (deploy/render.py) with its defaults and with the
values that switch objects and fields on (every remediation mode, the controller acting and
tainting, or off); the plain manifests are read as committed; the one-shot check pod is the one
`kubectl gpuwarden check` creates. The ServiceMonitor is a prometheus-operator CRD: the
Kubernetes schemas have none, so it is checked for its shape only.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from gpuwarden.kubectl.checkpod import pod_manifest
from tests.support.k8s_schema import VERSIONS, validate

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gw_render", REPO / "deploy" / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)

VALUES = {
    "defaults": {},
    "remediate dry-run": {"agent": {"remediate": "dry-run"}},
    "remediate on": {"agent": {"remediate": "on"}},
    "memory local kill": {"agent": {"remediate": "on", "memory_local_kill": True}},
    "controller acting, tainting": {"controller": {"execute": True, "actions": ["workload", "taint"],
                                                   "args": ["--window=20m"]}},
    "controller off": {"controller": {"enabled": False}},
    "kubectl plugin users bound": {"kubectl": {"viewers": [{"name": "gpu-oncall"}], "checkers": [
        {"kind": "User", "name": "alice@example.com"}, {"kind": "ServiceAccount", "name": "ci", "namespace": "ci"}]}},
    "evictions confined": {"agent": {"remediate": "on"}, "nodeConfinement": {"evictions": True}},
    "service monitor": {"metrics": {"serviceMonitor": {"enabled": True}}},
    "monitoring": {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                               "grafanaDashboard": {"enabled": True}}},
}
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}


def _id(o: dict) -> str:
    return f"{o['kind']}/{o['metadata']['name']}"


def shipped() -> list[dict]:
    return [d for f in sorted((REPO / "deploy/manifests").glob("*.yaml")) if f.name != "kustomization.yaml"
            for d in yaml.safe_load_all(f.read_text()) if d]


@pytest.mark.parametrize("case", sorted(VALUES))
def test_the_chart_renders_valid_objects(case: str) -> None:
    objs = render.objects(VALUES[case])
    assert objs
    for o in objs:
        if (o["apiVersion"], o["kind"]) in CRDS:  # shapes only (tests/deploy/test_alerts.py: promtool)
            assert (o["spec"]["groups"] if o["kind"] == "PrometheusRule"
                    else o["spec"]["endpoints"] and o["spec"]["selector"]["matchLabels"]), _id(o)
            continue
        validate(o)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(VALUES))
def test_the_chart_rendered_for_each_supported_version_is_valid_there(case: str, version: str) -> None:
    """`helm template --kube-version V`: every object valid in V itself, the oldest and the newest supported."""
    objs = render.objects(VALUES[case], kube_version=version)
    assert any(o["kind"] == "DaemonSet" for o in objs)
    for o in objs:
        if (o["apiVersion"], o["kind"]) not in CRDS:
            validate(o, (version,), exact=True)


def test_values_switch_objects_on_and_off() -> None:
    kinds = lambda case: sorted(_id(o) for o in render.objects(VALUES[case]))  # noqa: E731
    assert "ServiceMonitor/gpuwarden" in kinds("service monitor") and "ServiceMonitor/gpuwarden" not in kinds("defaults")
    assert not [k for k in kinds("controller off") if "controller" in k]


def test_host_writes_are_mounted_only_where_the_agent_writes() -> None:
    """Read-only host except the agent's memory samples, and the cgroup tree only for the local last resort."""
    def writable(case: str) -> set[str]:
        ds = next(o for o in render.objects(VALUES[case]) if o["kind"] == "DaemonSet")
        [c] = ds["spec"]["template"]["spec"]["containers"]
        return {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
    assert writable("defaults") == writable("remediate on") == {"/host/run/gpuwarden"}
    assert writable("memory local kill") == {"/host/run/gpuwarden", "/host/sys/fs/cgroup"}


@pytest.mark.parametrize("obj", shipped(), ids=_id)
def test_the_plain_manifests_are_valid(obj: dict) -> None:
    validate(obj)


def test_the_check_pod_is_valid() -> None:
    validate(pod_manifest("gpu-node-1", "gpuwarden", timeout_s=120))


@pytest.mark.parametrize("version", [None, *VERSIONS])
def test_helm_lint_is_clean(version) -> None:
    import helm_python as helm

    out = helm.lint(str(render.CHART), kube_version=version) if version else render.lint()
    assert out["errors"] == [], out
    # INFO-level advice only (e.g. "icon is recommended"): nothing at WARNING (2) or ERROR (3, 4)
    assert all(m["severity"] <= 1 for m in out["messages"]), out["messages"]
