"""What the agent costs the control plane in its steady state, counted by the real test API server
(its `apiserver_request_total`): on a quiet node, one condition heartbeat per 5 minutes and
nothing else (node-problem-detector's convention); on a faulty node, the fault once, then the same."""

from __future__ import annotations

import pytest

from gpuwarden.examples import open_example
from gpuwarden.kube.client import Kube
from gpuwarden.kube.conditions import CONDITION_TYPES
from tests.support.agent_kube import agent_hour, cleanup_nodes, conditions_of, ensure_namespace, make_node, our_events

pytestmark = pytest.mark.apiserver

WRITES = ("POST", "PUT", "PATCH", "DELETE", "APPLY")


@pytest.fixture
def kube(k8s):
    kb = Kube(k8s.api)
    ensure_namespace(kb, "ml")  # where the faulty example's pod events go
    yield kb
    cleanup_nodes(kb)


def _by_verb(counts: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for (verb, _, _), n in counts.items():
        out[verb] = out.get(verb, 0) + n
    return out


def test_quiet_node_writes_only_the_heartbeat(kube, k8s):
    node = k8s.name("gpu-quiet")
    make_node(kube, node)
    counts, agent = agent_hour(kube, k8s.server.url, node, open_example("healthy"), k8s.namespace)
    assert agent.checks == 60 and agent.debounce.raised_keys() == []
    writes = {k: n for k, n in counts.items() if k[0] in WRITES}
    # one strategic-merge PATCH of nodes/status per 5 minutes: 11 or 12 in an hour (the first
    # heartbeat is due 5 minutes after start-up declared the conditions), every condition in it
    assert set(writes) == {("PATCH", "nodes", "status")}, counts
    assert 11 <= writes[("PATCH", "nodes", "status")] <= 12, counts
    # and the read the merge needs, only then: not one GET a check
    assert _by_verb(counts).get("GET", 0) <= 13, counts
    conds = conditions_of(kube, node)
    beats = {conds[t]["lastHeartbeatTime"] for t in CONDITION_TYPES}
    assert len(beats) == 1 and all(conds[t]["status"] == "False" for t in CONDITION_TYPES)
    assert our_events(kube, node, k8s.namespace) == []


def test_faulty_node_writes_the_fault_once_then_only_the_heartbeat(kube, k8s):
    node = k8s.name("gpu-faulty")
    make_node(kube, node)
    counts, agent = agent_hour(kube, k8s.server.url, node, open_example("uvm-missing"), k8s.namespace,
                               debounce_raise=2)
    assert "GPU-DEV-001" in agent.debounce.raised_keys()
    assert conditions_of(kube, node)["GPUDeviceAccess"]["status"] == "True"
    writes = {k: n for k, n in counts.items() if k[0] in WRITES}
    # the raise: one condition patch and its Events (node + pod); then the heartbeat as on a quiet node
    assert writes.get(("PATCH", "nodes", "status"), 0) <= 13, counts
    assert 1 <= writes.get(("POST", "events", ""), 0) <= 3, counts
    assert sum(writes.values()) <= 16, counts
