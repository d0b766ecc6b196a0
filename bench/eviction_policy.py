#!/usr/bin/env python3
"""What the opt-in eviction confinement (nodeConfinement.evictions) costs the API server.

    .venv/bin/python bench/eviction_policy.py --nodes 100 --pods 10000 > OUT.json
    .venv/bin/python bench/eviction_policy.py --agent-events 300 > OUT.json   # the default policy on Events

The policy takes every pod of the request's namespace as its params, so the ValidatingAdmissionPolicy
plugin keeps an informer on all pods of the cluster, and evaluates its check once per pod of the
namespace on each eviction by an agent. Two test API servers (tools/testapiserver: kube-apiserver's own
plugin) get the chart's RBAC and policies for remediation `on`, one without and one with the eviction
policy (the peer is the first), and the same realistic pods (bench/k8s_scale.py's, ~5 KB each, in 40
namespaces); then each reports the server's resident memory (VmRSS, after a GC settles) and the time of
evictions by the agent of one node, of its own pods.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from bench.k8s_scale import NAMESPACES, node_obj, pod_obj  # noqa: E402
from tests.support.apiserver import start_apiserver  # noqa: E402
from tests.support.rbac import chart_authz  # noqa: E402


class Client:
    """One keep-alive connection per thread, with a bearer token."""

    def __init__(self, url: str, token: str) -> None:
        self.u, self.token, self.local = urlparse(url), token, threading.local()

    def call(self, method: str, path: str, obj: dict | None = None) -> int:
        conn = getattr(self.local, "conn", None) or http.client.HTTPConnection(self.u.hostname, self.u.port, timeout=60)
        self.local.conn = conn
        conn.request(method, path, json.dumps(obj).encode() if obj is not None else None,
                     {"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"})
        r = conn.getresponse()
        r.read()
        return r.status


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return round(int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS:"))) / 1024, 1)


def run(evictions: bool, nodes: int, pods: int, n_evict: int) -> dict:
    node = "gpu-node-00000"
    authz, ids = chart_authz("on", {"execute": False}, [node], values={"nodeConfinement": {"evictions": evictions}})
    with start_apiserver(authz=authz) as s:
        pid = s._procs[-1].pid
        admin_token = json.loads(Path(s.kubeconfig_path).read_text())["users"][0]["user"]["token"]
        admin, agent = Client(s.url, admin_token), Client(s.url, ids.agent_token(node))
        for ns in [f"team-{k:02d}" for k in range(NAMESPACES)]:
            admin.call("POST", "/api/v1/namespaces", {"kind": "Namespace", "metadata": {"name": ns}})
        t0 = time.monotonic()
        with ThreadPoolExecutor(4) as ex:
            list(ex.map(lambda i: admin.call("POST", "/api/v1/nodes", node_obj(i)), range(nodes)))
            list(ex.map(lambda i: (lambda ns, o: admin.call("POST", f"/api/v1/namespaces/{ns}/pods", o))(
                *pod_obj(i, nodes)), range(pods)))
        fill_s = time.monotonic() - t0
        time.sleep(3)  # the plugin's informer catches up; the Go GC settles
        rss = rss_mib(pid)
        # the agent of gpu-node-00000 evicts pods of its own node (pod i is on node i % nodes)
        times, statuses = [], []
        for i in range(0, nodes * n_evict, nodes):
            ns, o = pod_obj(i, nodes)
            name = o["metadata"]["name"]
            t = time.perf_counter()
            statuses.append(agent.call("POST", f"/api/v1/namespaces/{ns}/pods/{name}/eviction",
                                       {"apiVersion": "policy/v1", "kind": "Eviction",
                                        "metadata": {"name": name, "namespace": ns}}))
            times.append(time.perf_counter() - t)
        return {"eviction_policy": evictions, "pods": pods, "pods_per_namespace": pods // NAMESPACES,
                "fill_s": round(fill_s, 1), "server_rss_mib": rss, "evictions": len(times),
                "eviction_statuses": sorted(set(statuses)),
                "eviction_ms_median": round(statistics.median(times) * 1000, 1),
                "eviction_ms_max": round(max(times) * 1000, 1)}


def run_events(confined: bool, n: int) -> dict:
    """The default node-confinement policy's cost on the agent's Event writes (no params): n creates
    and n aggregating patches by the agent of one node, about its Node, with and without the policy."""
    node = "gpu-node-00000"
    authz, ids = chart_authz("off", {"execute": False}, [node], values={"nodeConfinement": {"create": confined}})
    with start_apiserver(authz=authz) as s:
        admin_token = json.loads(Path(s.kubeconfig_path).read_text())["users"][0]["user"]["token"]
        Client(s.url, admin_token).call("POST", "/api/v1/nodes", node_obj(0))
        agent = Client(s.url, ids.agent_token(node))
        time.sleep(2)  # the plugin has read the policy
        creates, patches, statuses = [], [], set()
        for i in range(n):
            body = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": f"{node}.{i:08x}",
                    "labels": {"gpuwarden.io/node": node}},
                    "involvedObject": {"kind": "Node", "name": node, "apiVersion": "v1"},
                    "related": {"kind": "Pod", "name": f"p{i}", "namespace": "ml"}, "type": "Warning",
                    "reason": "GpuDrv003", "message": "GPU-DRV-003: Xid 79", "count": 1,
                    "source": {"component": "gpuwarden", "host": node}, "reportingComponent": "gpuwarden",
                    "reportingInstance": node}
            t = time.perf_counter()
            statuses.add(agent.call("POST", "/api/v1/namespaces/default/events", body))
            creates.append(time.perf_counter() - t)
        for i in range(n):
            conn = getattr(agent.local, "conn")
            t = time.perf_counter()
            conn.request("PATCH", f"/api/v1/namespaces/default/events/{node}.{i:08x}", json.dumps({"count": 2}).encode(),
                         {"Content-Type": "application/merge-patch+json", "Authorization": f"Bearer {agent.token}"})
            r = conn.getresponse()
            r.read()
            statuses.add(r.status)
            patches.append(time.perf_counter() - t)
        return {"node_confinement": confined, "events": n, "statuses": sorted(statuses),
                "create_ms_median": round(statistics.median(creates) * 1000, 2),
                "patch_ms_median": round(statistics.median(patches) * 1000, 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--evictions", type=int, default=20)
    ap.add_argument("--agent-events", type=int, default=0,
                    help="instead: the default policy's cost on N Event creates and patches by an agent")
    a = ap.parse_args()
    if a.agent_events:
        runs = [run_events(c, a.agent_events) for c in (False, True, False, True)]  # interleaved, twice
        print(json.dumps({"runs": runs, "create_ratio": round(
            statistics.median(r["create_ms_median"] for r in runs if r["node_confinement"])
            / statistics.median(r["create_ms_median"] for r in runs if not r["node_confinement"]), 2),
            "patch_ratio": round(
            statistics.median(r["patch_ms_median"] for r in runs if r["node_confinement"])
            / statistics.median(r["patch_ms_median"] for r in runs if not r["node_confinement"]), 2)}, indent=2))
        return 0
    peer = run(False, a.nodes, a.pods, a.evictions)
    new = run(True, a.nodes, a.pods, a.evictions)
    print(json.dumps({"without": peer, "with": new,
                      "rss_ratio": round(new["server_rss_mib"] / peer["server_rss_mib"], 2),
                      "rss_delta_mib": round(new["server_rss_mib"] - peer["server_rss_mib"], 1),
                      "eviction_ratio": round(new["eviction_ms_median"] / peer["eviction_ms_median"], 2)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
