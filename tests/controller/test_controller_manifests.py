"""deploy/: the controller's manifest is current, strictly valid, and its RBAC covers every API call."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from gpuwarden.controller.config import parse_args
from tests.support.k8s_schema import validate

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "deploy" / "manifests" / "controller.yaml"
TEMPLATES = REPO / "deploy" / "helm" / "gpuwarden" / "templates"


def _render():
    spec = importlib.util.spec_from_file_location("gw_render", REPO / "deploy" / "render.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def objects(text: str | None = None):
    return [d for d in yaml.safe_load_all(text if text is not None else MANIFEST.read_text()) if d]


#: (API group, resource, verb, where) of every call the controller makes — read from the code:
#: informers (list+watch nodes, pods, events), owner GETs, the Event recorder, the Lease, the breaker.
DRY_RUN = [("", "nodes", "list", "cluster"), ("", "nodes", "watch", "cluster"), ("", "pods", "list", "cluster"),
           ("", "pods", "watch", "cluster"), ("", "events", "list", "cluster"), ("", "events", "watch", "cluster"),
           ("", "events", "create", "cluster"),
           ("apps", "replicasets", "get", "cluster"), ("apps", "deployments", "get", "cluster"),
           ("apps", "statefulsets", "get", "cluster"), ("batch", "jobs", "get", "cluster"),
           ("batch", "cronjobs", "get", "cluster"),
           ("coordination.k8s.io", "leases", "get", "ns"), ("coordination.k8s.io", "leases", "create", "ns"),
           ("coordination.k8s.io", "leases", "update", "ns"), ("", "configmaps", "get", "ns")]
EXECUTE = DRY_RUN + [("apps", "deployments", "patch", "cluster"), ("apps", "statefulsets", "patch", "cluster"),
                     ("apps", "replicasets", "patch", "cluster"), ("batch", "jobs", "patch", "cluster"),
                     ("batch", "cronjobs", "patch", "cluster"), ("", "configmaps", "create", "ns"),
                     ("", "configmaps", "patch", "ns")]
TAINT = EXECUTE + [("", "nodes", "patch", "cluster")]


def allowed(objs, group, resource, verb, where) -> bool:
    kinds = ("ClusterRole",) if where == "cluster" else ("ClusterRole", "Role")
    for o in objs:
        if o["kind"] in kinds:
            for r in o["rules"]:
                if group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]:
                    return True
    return False


def test_manifest_is_rendered_from_the_current_values():
    assert MANIFEST.read_text() == _render().manifests()[MANIFEST], "run: .venv/bin/python deploy/render.py"


@pytest.mark.parametrize("obj", objects(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_every_object_is_strictly_valid(obj):
    validate(obj)


@pytest.mark.parametrize("settings,calls,forbidden", [
    ({}, DRY_RUN, [("apps", "deployments", "patch", "cluster"), ("", "nodes", "patch", "cluster"),
                   ("", "configmaps", "patch", "ns")]),
    ({"execute": True, "actions": ["workload"]}, EXECUTE, [("", "nodes", "patch", "cluster")]),
    ({"execute": True}, TAINT, []),  # the default actions, workload and node: a failing node is tainted
    ({"execute": True, "actions": ["workload", "taint"]}, TAINT, []),
])
def test_rbac_covers_every_call_and_no_more(settings, calls, forbidden):
    objs = [o for o in _render().objects({"controller": settings}) if _render().component(o) == "controller"]
    for call in calls:
        assert allowed(objs, *call), call
    for call in forbidden:
        assert not allowed(objs, *call), call
    # never: deleting or evicting pods, secrets, anything cluster-wide beyond the above; no list of
    # workloads, no Event patch, no node get (tests/k8s/test_rbac_chart.py: each grant is used)
    assert not allowed(objs, "", "pods", "delete", "cluster") and not allowed(objs, "", "secrets", "get", "ns")
    for call in [("apps", "deployments", "list", "cluster"), ("", "events", "patch", "cluster"),
                 ("", "nodes", "get", "cluster")]:
        assert not allowed(objs, *call), call


def test_the_deployment_runs_the_controller_as_configured():
    by_kind = {o["kind"]: o for o in objects()}
    dep = by_kind["Deployment"]
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == by_kind["ServiceAccount"]["metadata"]["name"]
    [c] = pod["containers"]
    assert c["args"][0] == "controller"
    cfg = parse_args(c["args"][1:])
    assert cfg.execute is False and cfg.actions == ["workload", "node"] and cfg.leader_elect
    assert cfg.listen.endswith(f":{c['ports'][0]['containerPort']}")
    assert {e["name"] for e in c["env"]} == {"POD_NAME", "POD_NAMESPACE"}
    assert c["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    # the agent's DaemonSet selector must not select the controller's pods (nor the reverse)
    agent = next(o for o in objects((REPO / "deploy" / "manifests" / "gpuwarden.yaml").read_text())
                 if o["kind"] == "DaemonSet")
    agent_sel = agent["spec"]["selector"]["matchLabels"]
    ctl_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert not all(ctl_labels.get(k) == v for k, v in agent_sel.items())
    execute = _render().objects({"controller": {"execute": True, "args": ["--window=20m"]}})
    args = next(o for o in execute if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert parse_args(args[1:]).execute and parse_args(args[1:]).window_s == 1200


def test_the_chart_renders_what_its_values_say():
    """Rendered by Helm itself: the values the templates read exist, and the switches work."""
    rbac = (TEMPLATES / "controller-rbac.yaml").read_text()
    deploy = (TEMPLATES / "controller-deployment.yaml").read_text()
    # the chart values they read exist (`controller:` itself is optional: every key has a default)
    values = yaml.safe_load((TEMPLATES.parent / "values.yaml").read_text())
    for ref in set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", rbac + deploy + (TEMPLATES / "_controller.tpl").read_text())):
        if ref == "controller":
            continue
        node = values
        for part in ref.split("."):
            assert isinstance(node, dict) and part in node, f".Values.{ref} is not in values.yaml"
            node = node[part]
    render = _render()
    assert not [o for o in render.objects({"controller": {"enabled": False}}) if render.component(o) == "controller"]
    dep = next(o for o in render.objects({"controller": {"replicas": 3, "port": 9999}}) if o["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] == 9999
