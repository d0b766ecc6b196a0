"""deploy/manifests/gpuwarden.yaml created against the real test API server (strict field validation).

The test server serves Namespaces, ConfigMaps and DaemonSets (not RBAC, ServiceAccounts or
Services): those objects are created with `fieldValidation=Strict`, so any field the Go types do
not know fails the request, and read back unchanged. The other kinds are checked against the
client's models only (tests/deploy/test_manifests.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpuwarden.kube.client import Kube
from gpuwarden.kube.errors import KubeError

pytestmark = pytest.mark.apiserver

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "manifests" / "gpuwarden.yaml"
SERVED = {("v1", "Namespace"): "/api/v1/namespaces", ("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps",
          ("apps/v1", "DaemonSet"): "/apis/apps/v1/namespaces/{ns}/daemonsets"}


def _strip(d):
    return {k: v for k, v in d.items() if k not in ("status",)}


def test_manifests_create_strictly_and_round_trip(k8s):
    kube = Kube(k8s.api)
    docs = [d for d in yaml.safe_load_all(MANIFESTS.read_text()) if d]
    ns = k8s.name("gpuwarden")
    created = []
    for d in docs:
        key = (d["apiVersion"], d["kind"])
        if key not in SERVED:
            continue
        d = dict(d, metadata=dict(d["metadata"]))
        if d["kind"] == "Namespace":
            d["metadata"]["name"] = ns
        else:
            d["metadata"]["namespace"] = ns
        path = SERVED[key].format(ns=ns)
        got = kube.request("POST", path, d, query=[("fieldValidation", "Strict")])
        created.append(d["kind"])
        if d["kind"] == "DaemonSet":
            spec = got["spec"]["template"]["spec"]
            want = d["spec"]["template"]["spec"]
            for k, v in want.items():
                assert spec[k] == v or k == "containers", k
            c, w = spec["containers"][0], want["containers"][0]
            for k, v in w.items():
                assert c[k] == v, k
        if d["kind"] == "ConfigMap":
            assert got["data"] == d["data"]
    assert created == ["Namespace", "ConfigMap", "DaemonSet"]

    # and the server really rejects an unknown field
    bad = next(d for d in docs if d["kind"] == "ConfigMap")
    bad = dict(bad, metadata=dict(bad["metadata"], namespace=ns, name="bad"), datas={"x": "y"})
    with pytest.raises(KubeError) as e:
        kube.request("POST", f"/api/v1/namespaces/{ns}/configmaps", bad, query=[("fieldValidation", "Strict")])
    assert e.value.status == 400 and "datas" in str(e.value)
