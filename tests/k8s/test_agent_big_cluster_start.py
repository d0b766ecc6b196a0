"""An agent starting on a node of a big cluster (issue 45 item 3), against the real test API server
with real etcd, filled with many pods on other nodes (bench/k8s_scale.py's realistic objects).

On the 60,000-pod cluster an agent took 18.9 s to start and logged a 10 s `remediation-failed`
timeout: its list of its own node's pods was field-selected and paged, but read from etcd, where the
server decodes every pod of the cluster to find the node's few (3.5-8 s at 10,000 pods here). Every
list on the agent's start-up path and in its first check is now field- or label-selected, paged, and
served from the API server's watch cache (`resourceVersion=0`, as the kubelet lists its pods).

Pods: GPUWARDEN_BIG_NODE_PODS (default 8,000: filling them takes ~45 s on the shared 2-core machine);
the issue's 60,000 is a run with it set.
"""

from __future__ import annotations

import io
import os
import time

import pytest

from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.loop import Agent
from gpuwarden.kube.client import Kube
from gpuwarden.kube.log import Log
from tests.support.apiserver import ApiServerUnavailable, start_apiserver

pytestmark = pytest.mark.apiserver

PODS = int(os.environ.get("GPUWARDEN_BIG_NODE_PODS", "8000"))
NODES = 200
EVENTS = 2000
#: start-up and the first check, seconds (the list from etcd alone took 3.5-8 s at 10,000 pods), and any one request
BOUND_S = 3.0
REQUEST_BOUND_S = 1.0
COLLECTIONS = ("pods", "events", "nodes", "configmaps", "resourceslices", "devicetaintrules")


class Recorded(Kube):
    """The agent's own client, noting each request it sends: method, path, query, seconds."""

    def __init__(self, api, **kw) -> None:
        super().__init__(api, **kw)
        self.sent: list[tuple[str, str, dict, float]] = []

    def request_text(self, method, path, body=None, query=None, content_type=None, timeout=None,
                     accept="application/json"):
        t0 = time.monotonic()
        try:
            return super().request_text(method, path, body, query, content_type, timeout, accept)
        finally:
            self.sent.append((method, path.split("?")[0], dict(query or []), time.monotonic() - t0))


def test_an_agent_starts_in_seconds_on_a_node_of_a_big_cluster_and_logs_no_error():
    from bench import k8s_scale

    try:
        s = start_apiserver(timeout=60.0)
    except ApiServerUnavailable as exc:
        if os.environ.get("GPUWARDEN_REQUIRE_APISERVER") == "1":
            pytest.fail(f"REAL API SERVER UNAVAILABLE: {exc}", pytrace=False)
        pytest.skip(f"REAL API SERVER UNAVAILABLE: {exc}")
    try:
        filled = k8s_scale.fill(s.url, NODES, PODS, EVENTS, 8)
        node = f"gpu-node-{NODES // 2:05d}"
        kube = Recorded(s.api_client())
        stream = io.StringIO()
        cfg = AgentConfig(example="healthy", node_name=node, remediate="on", listen="", namespace="gpuwarden")
        t0 = time.monotonic()
        agent = Agent(cfg, kube=kube, out=io.StringIO(), log=Log("text", stream, node=node))
        agent.start()
        r = agent.check()
        took = time.monotonic() - t0
    finally:
        s.stop()

    log = stream.getvalue()
    errors = [ln for ln in log.splitlines() if " level=error " in f" {ln} "]
    lists = [(p, q, round(d, 3)) for m, p, q, d in kube.sent if m == "GET" and p.rsplit("/", 1)[-1] in COLLECTIONS]
    slowest = max((d for *_, d in kube.sent), default=0.0)
    print(f"{PODS:,} pods on {NODES} nodes (filled in {filled['pods_s']}s), {EVENTS:,} Events: the agent on {node} "
          f"started and checked in {took:.2f}s, {len(kube.sent)} requests, the slowest {slowest:.2f}s; lists: {lists}")
    assert errors == [] and r.errors == [], errors or r.errors
    pods = [q for p, q, _ in lists if p == "/api/v1/pods"]
    assert pods, "the first check did not read its node's pods"  # what the timeout was
    for p, q, _ in lists:  # selected and paged, every one
        assert q.get("fieldSelector", "") + q.get("labelSelector", "") and q.get("limit") == "500", (p, q)
    # the node's pods (bounded by its max-pods) from the watch cache; its Events paged from etcd (a node may
    # have 25,000: the cache may answer them in one page)
    assert all(q["fieldSelector"] == f"spec.nodeName={node}" and q.get("resourceVersion") == "0" for q in pods)
    assert all(q.get("labelSelector") == f"gpuwarden.io/node={node}" and "resourceVersion" not in q
               for p, q, _ in lists if p.endswith("/events"))
    # no request costs what the cluster holds (the pod list from etcd: 2.3 s at 8,000 pods on main), and the whole
    # start is seconds
    assert slowest < REQUEST_BOUND_S, f"a request took {slowest:.2f}s; lists: {lists}"
    assert took < BOUND_S, f"start-up and first check took {took:.2f}s (bound {BOUND_S:g}s); lists: {lists}"


def test_a_cached_list_asks_the_cache_once_and_a_plain_one_pages_from_etcd(k8s):
    """A cached list asks resourceVersion=0 on its first page only (a continued page carries its token
    alone: the API server refuses both at once); this server's cache answers it in one page whatever the
    limit. A plain list (the controller's informers, the agent's Events) pages from etcd."""
    from gpuwarden.kube.client import Kube as Plain
    from tests.support.agent_kube import make_pod

    kube = Recorded(k8s.api)
    node = k8s.name("paged")
    for i in range(5):
        make_pod(Plain(k8s.api), k8s.namespace, f"p-{i}", node)
    got = list(kube.iter_items(f"/api/v1/namespaces/{k8s.namespace}/pods", field_selector=f"spec.nodeName={node}",
                               limit=2, cached=True))
    assert sorted(p["metadata"]["name"] for p in got) == [f"p-{i}" for i in range(5)]
    queries = [q for m, _, q, _ in kube.sent if m == "GET"]
    assert queries[0].get("resourceVersion") == "0" and "continue" not in queries[0]
    assert all("continue" in q and "resourceVersion" not in q for q in queries[1:]), queries
    kube.sent.clear()
    got = list(kube.iter_items(f"/api/v1/namespaces/{k8s.namespace}/pods", field_selector=f"spec.nodeName={node}",
                               limit=2))
    queries = [q for m, _, q, _ in kube.sent if m == "GET"]
    assert len(got) == 5 and len(queries) == 3 and not any("resourceVersion" in q for q in queries), queries
