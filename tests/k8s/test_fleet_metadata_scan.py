"""The fleet view's scan for quarantined workloads reads metadata only (issue 19: cost that grows with
the work): the API server answers PartialObjectMetadata, and only the annotated workload is read whole."""

from __future__ import annotations

import pytest

from gpuwarden.controller import fleet
from gpuwarden.controller.quarantine import ANNOTATION

pytestmark = pytest.mark.apiserver


def _deployment(name: str, annotations: dict | None = None) -> dict:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"replicas": 0 if annotations else 2, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "main", "image": "registry.example/x:1",
                                                           "env": [{"name": "PAD", "value": "x" * 4000}]}]}}}}


def test_workloads_are_scanned_by_metadata_and_the_quarantined_one_read_whole(kube) -> None:
    for i in range(3):
        kube.request("POST", "/apis/apps/v1/namespaces/ml/deployments", _deployment(f"plain-{i}"))
    kube.request("POST", "/apis/apps/v1/namespaces/ml/deployments",
                 _deployment("held", {ANNOTATION: '{"by":"gpuwarden","replicas":2}'}))
    try:
        scanned = kube.list_all("apps/v1", "deployments", metadata_only=True)
        mine = [w for w in scanned if w["metadata"].get("namespace") == "ml"]
        assert len(mine) == 4
        assert all(w.get("kind") == "PartialObjectMetadata" and "spec" not in w for w in mine)

        before = kube.requests
        _, _, workloads, _, _, _ = fleet.gather(kube, "gpuwarden", "gpuwarden", "gpuwarden-breaker",
                                                "gpuwarden-controller")
        held = [w for w in workloads if w["metadata"]["name"] == "held"]
        assert len(held) == 1 and held[0]["spec"]["replicas"] == 0 and held[0]["kind"] == "Deployment"
        assert not any(w["metadata"]["name"].startswith("plain-") for w in workloads)
        assert kube.requests - before < 20  # a list per kind, one read of the annotated one, the rest
    finally:
        for name in ("plain-0", "plain-1", "plain-2", "held"):
            kube.request("DELETE", f"/apis/apps/v1/namespaces/ml/deployments/{name}")
