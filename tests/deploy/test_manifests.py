"""deploy/: the plain manifests are the chart rendered by Helm, strictly valid Kubernetes objects."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from gpuwarden.agent import config as agent_config
from tests.support.k8s_schema import SchemaError, validate

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpuwarden"
MANIFESTS = REPO / "deploy" / "manifests" / "gpuwarden.yaml"


def _render():
    spec = importlib.util.spec_from_file_location("gw_render", REPO / "deploy" / "render.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def objects():
    return [d for d in yaml.safe_load_all(MANIFESTS.read_text()) if d]


def test_manifests_are_rendered_from_the_current_values():
    assert MANIFESTS.read_text() == _render().manifests()[MANIFESTS], "run: .venv/bin/python deploy/render.py"


@pytest.mark.parametrize("obj", objects(), ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_every_object_is_strictly_valid(obj):
    validate(obj)


def test_the_validator_is_strict():
    ds = next(o for o in objects() if o["kind"] == "DaemonSet")
    import copy

    bad = copy.deepcopy(ds)
    bad["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []  # typo of volumeMounts
    with pytest.raises(SchemaError, match="volumeMount"):
        validate(bad)
    bad = copy.deepcopy(ds)
    bad["spec"]["template"]["spec"]["hostPID"] = "yes"
    with pytest.raises(SchemaError, match="hostPID"):
        validate(bad)
    bad = copy.deepcopy(ds)
    del bad["spec"]["selector"]
    with pytest.raises(SchemaError, match="selector"):
        validate(bad)
    with pytest.raises(SchemaError, match="NoSuchKind"):
        validate({"apiVersion": "v1", "kind": "NoSuchKind", "metadata": {"name": "x"}})


def test_the_daemonset_is_what_the_agent_needs():
    by_kind = {o["kind"]: o for o in objects()}
    pod = by_kind["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert "nvidia.com/gpu.present" in str(pod["affinity"]["nodeAffinity"])
    assert {"operator": "Exists"} in pod["tolerations"]
    [c] = pod["containers"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for path in ("/host", "/host/sys", "/host/dev", "/host/var/lib/kubelet", "/host/var/lib/kubelet/device-plugins",
                 "/host/var/lib/kubelet/pod-resources"):
        assert mounts[path]["readOnly"] is True
    assert c["securityContext"]["privileged"] is False and c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["resources"]["requests"] and c["resources"]["limits"]
    env = {e["name"] for e in c["env"]}
    assert {"NODE_NAME", "POD_NAMESPACE"} <= env
    # the shipped agent.yaml is a valid agent configuration
    cfg = agent_config.from_mapping(yaml.safe_load(by_kind["ConfigMap"]["data"]["agent.yaml"]))
    cfg.validate()
    assert cfg.root == "/host" and cfg.remediate == "off"
    # what wakes the agent and the incident-4 last resort are the chart's to set, at the documented defaults
    assert cfg.wake and cfg.wake_nvml and cfg.wake_pods and cfg.confirm_delay_s == 0.2
    assert cfg.fast_memory_interval_s == 0.5 and cfg.memory_unsure_policy == "alert"
    assert f"{c['ports'][0]['containerPort']}" == cfg.listen.rsplit(":", 1)[1]


def _rules(obj):
    return {(tuple(r["resources"]), tuple(r["verbs"])) for r in obj["rules"]}


def cluster_rules(mode: str) -> set:
    """The agent's ClusterRole as `helm template --set agent.remediate=MODE` renders it."""
    objs = _render().objects({"agent": {"remediate": mode}})
    return _rules(next(o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "gpuwarden"))


def test_rbac_is_least_privilege_per_mode():
    """What each mode grants; tests/k8s/test_rbac_chart.py proves each grant is used, under enforcement."""
    off = cluster_rules("off")
    # pods list and watch in every mode: while a GPU is lost, this node's pods the kubelet rejected at admission
    # (GPU-K8S-012), listed by the check and watched by the pods wake source
    assert off == {(("nodes",), ("get",)), (("nodes/status",), ("patch",)), (("events",), ("create", "patch")),
                   (("pods",), ("list", "watch"))}
    dry = cluster_rules("dry-run")
    assert {(("pods",), ("list", "watch")), (("events",), ("create", "patch", "list"))} <= dry
    on = cluster_rules("on")
    assert {(("pods",), ("list", "watch", "delete")), (("pods/eviction",), ("create",)), (("nodes",), ("get", "patch"))} <= on
    assert not [o for o in _render().objects({"agent": {"remediate": "off"}}) if o["kind"] == "Role"
                and o["metadata"]["name"] == "gpuwarden"]  # no breaker to read when nothing acts
    role = next(o for o in _render().objects({"agent": {"remediate": "on"}}) if o["kind"] == "Role"
                and o["metadata"]["name"] == "gpuwarden")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                              "resourceNames": ["gpuwarden-breaker"]}]


AGENT_TEMPLATES = ("_helpers.tpl", "serviceaccount.yaml", "rbac.yaml", "configmap.yaml", "daemonset.yaml",
                   "service.yaml", "servicemonitor.yaml", "NOTES.txt")


def test_chart_lints_clean_and_its_values_exist():
    """Every .Values reference exists (Helm renders a missing one as empty, silently); helm lint is clean."""
    text = "\n".join((CHART / "templates" / n).read_text() for n in AGENT_TEMPLATES)
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for ref in set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", text)):
        node = values
        for part in ref.split("."):
            assert isinstance(node, dict) and part in node, f".Values.{ref} is not in values.yaml"
            node = node[part]
    assert _render().lint()["errors"] == []
    assert (CHART / "Chart.yaml").exists() and yaml.safe_load((CHART / "Chart.yaml").read_text())["apiVersion"] == "v2"


def test_render_script_outside_the_test_environment_says_what_to_install(tmp_path) -> None:
    """`deploy/render.py --check` with a Python that lacks the Helm SDK: a message and exit 2, no traceback."""
    import subprocess
    import sys

    fake = tmp_path / "helm_python"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'helm_python'\", name='helm_python')\n")
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(repo / "deploy" / "render.py"), "--check"], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)}, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "helm_python is not installed" in r.stderr and ".venv/bin/pip install -e '.[test]'" in r.stderr
    ok = subprocess.run([sys.executable, str(repo / "deploy" / "render.py"), "--check"], capture_output=True, text=True,
                        timeout=300)
    assert ok.returncode == 0, ok.stderr  # the command docs/install.md gives, in the test environment
