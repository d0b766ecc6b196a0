"""The unsure policy against the real test API server (issue 43, item 2): fence-and-evict taints the node with its own
key and evicts exactly the candidate pods, once, with the Events the cascade controller follows."""

from __future__ import annotations

import pytest

from gpuwarden.agent.unsure import FENCE_KEY, act
from gpuwarden.examples import open_example
from gpuwarden.findings import Finding, Severity, Status
from gpuwarden.kube.client import Kube
from tests.support.agent_kube import cleanup_nodes, delete_all_pods, ensure_namespace, make_node, make_pod, new_agent, \
    our_events, pods_named

pytestmark = pytest.mark.apiserver
GiB = 1 << 30


@pytest.fixture
def kube(k8s):
    kb = Kube(k8s.api)
    ensure_namespace(kb, "viz")
    delete_all_pods(kb, "viz")
    yield kb
    delete_all_pods(kb, "viz")
    cleanup_nodes(kb)


def unsure_finding(pods: list[dict], graphics: dict[str, bool]) -> Finding:
    cands = [{"ref": f"viz/{p['metadata']['name']}", "kind": "pod", "namespace": "viz", "name": p["metadata"]["name"],
              "uid": p["metadata"]["uid"], "graphics": graphics[p["metadata"]["name"]], "cgroup": ""} for p in pods]
    return Finding("GPU-NODE-001", Status.AT_RISK, Severity.HIGH, "t", "Candidates, not separated",
                   data={"unsure": {"candidates": cands, "seconds_to_min_watermark": 90.0,
                                    "recent_rate_bytes_per_s": 20 * GiB / 60, "growth_bytes": 6 * GiB,
                                    "headroom_bytes": 10 * GiB}})


@pytest.mark.parametrize("policy", ["fence-and-evict", "stop-graphics-candidates"])
def test_the_policy_through_the_api(kube, k8s, policy):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    a = make_pod(kube, "viz", "render-0", node)
    b = make_pod(kube, "viz", "steady-0", node)
    c = make_pod(kube, "viz", "filler-0", node)
    agent, _ = new_agent(kube, node, open_example("healthy"), k8s.namespace, remediate="on",
                         memory_unsure_policy=policy)
    f = unsure_finding([a, b, c], {"render-0": True, "steady-0": True, "filler-0": False})
    got = act(agent, [f])
    left = set(pods_named(kube, "viz"))
    taints = (kube.get_node(node).get("spec") or {}).get("taints") or []
    if policy == "fence-and-evict":
        assert [(o.action.kind, o.result) for o in got][0] == ("taint-node", "done")
        assert [t["key"] for t in taints] == [FENCE_KEY] and left == set()
    else:
        assert taints == [] and left == {"filler-0"}  # the compute pod stays
    evs = [e for e in our_events(kube, node) if e.get("action") == "evict-pod-for-memory"]
    assert sorted(e["metadata"]["annotations"]["gpuwarden.io/owner-name"] for e in evs) == sorted(
        p["metadata"]["ownerReferences"][0]["name"] for p in ([a, b, c] if policy == "fence-and-evict" else [a, b]))
    again = act(agent, [f])  # the next check: nothing twice
    assert {o.result for o in again} == {"cooldown"}
