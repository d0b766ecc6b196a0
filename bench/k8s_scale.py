#!/usr/bin/env python3
"""gpuwarden against a large cluster: the test API server filled with N nodes, P pods, E Events.

    .venv/bin/python bench/k8s_scale.py --nodes 500 --pods 2000 --events 25000 [--compare OTHER/src] > OUT.json

Starts the test API server (tools/testapiserver + etcd, docs/testing-apiserver.md), fills it with
realistic objects (a Node ~4 KB with the kubelet's status and images; a Pod ~5 KB: labels, a
ReplicaSet owner, two containers with env, mounts and probes, a third of them requesting a GPU,
bound round-robin; gpuwarden Events about the Nodes and the pods, labelled as the agent labels
them), then measures, each in a fresh child process (requests from the
server's own `apiserver_request_total`; peak RSS: the child's VmHWM):

- `controller`: the controller's first full sync and reconcile (nodes, pods, both Event lists);
- `agent-start`: an agent's start-up with remediation dry-run (conditions declared, cooldowns
  rebuilt from its own Events) on one node;
- `kubectl-node`: `kubectl gpuwarden node X` (gather + build);
- `taint-pool` / `untaint-pool`: the cascade's pool-wide taint and its release, executed.

`--compare OTHER/src` runs the same children on another checkout's gpuwarden, interleaved (the
peer; docs/performance.md reports ratios against it). Filling 60,000 pods takes minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))
NAMESPACES = 40
T0 = "2026-11-24T08:00:00Z"
GPU_EVERY = 3  # a pod in GPU_EVERY requests a GPU (--gpu-every 1: every pod, the controller's worst case)
ONE_NODE = ""  # --one-node-events: every Event is about this node (the agent's and the node view's worst case)


# -- objects ----------------------------------------------------------------------------------------
def node_obj(i: int) -> dict:
    name = f"gpu-node-{i:05d}"
    cond = lambda t, s, r: {"type": t, "status": s, "reason": r, "message": f"kubelet: {r}",  # noqa: E731
                            "lastHeartbeatTime": T0, "lastTransitionTime": T0}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/zone": f"zone-{i % 3}",
        "topology.kubernetes.io/region": "region-1", "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/cuda.driver.major": "570",
        "pool": f"pool-{i % 10}"}, "annotations": {
        "node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": {"podCIDR": f"10.{i // 250}.{i % 250}.0/24", "providerID": f"aws:///zone/i-{i:017x}"},
        "status": {"capacity": {"cpu": "192", "memory": "2097152Mi", "nvidia.com/gpu": "8", "pods": "110",
                                "ephemeral-storage": "3750Gi"},
                   "allocatable": {"cpu": "191", "memory": "2090000Mi", "nvidia.com/gpu": "8", "pods": "110",
                                   "ephemeral-storage": "3700Gi"},
                   "conditions": [cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                                  cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                                  cond("PIDPressure", "False", "KubeletHasSufficientPID"),
                                  cond("Ready", "True", "KubeletReady")] +
                                 [cond(t, "False", f"No{t}Problem") for t in
                                  ("GPUDeviceAccess", "GPUDriver", "GPUDevicePlugin", "GPUUnchargedMemory", "GPUHardware")],
                   "addresses": [{"type": "InternalIP", "address": f"10.200.{i // 250}.{i % 250}"},
                                 {"type": "Hostname", "address": name}],
                   "nodeInfo": {"kubeletVersion": "v1.33.4", "containerRuntimeVersion": "containerd://2.1.4",
                                "kernelVersion": "6.8.0-1021-aws", "osImage": "Ubuntu 24.04.2 LTS",
                                "operatingSystem": "linux", "architecture": "amd64", "machineID": f"{i:032x}",
                                "systemUUID": f"{i:08x}-0000-4000-8000-000000000000", "bootID": f"{i:032x}",
                                "kubeProxyVersion": ""},
                   "images": [{"names": [f"registry.example.com/ml/image-{k}@sha256:{k:064x}",
                                         f"registry.example.com/ml/image-{k}:v1.{k}"], "sizeBytes": 1_000_000_000 + k}
                              for k in range(8)]}}


def pod_obj(i: int, nodes: int) -> tuple[str, dict]:
    ns = f"team-{i % NAMESPACES:02d}"
    app = f"trainer-{i // 20:04d}"
    gpu = i % GPU_EVERY == 0
    env = [{"name": f"SETTING_{k}", "value": f"value-{k}-{'x' * 40}"} for k in range(18)]
    c = {"name": "main", "image": f"registry.example.com/ml/{app}:v3.2.{i % 50}", "command": ["python", "-m", "train"],
         "args": ["--config", "/etc/train/config.yaml", "--epochs", "40", "--checkpoint-dir", "/ckpt"],
         "env": env, "ports": [{"containerPort": 8080, "name": "metrics", "protocol": "TCP"}],
         "resources": {"requests": {"cpu": "8", "memory": "64Gi", **({"nvidia.com/gpu": "1"} if gpu else {})},
                       "limits": {"memory": "64Gi", **({"nvidia.com/gpu": "1"} if gpu else {})}},
         "volumeMounts": [{"name": "config", "mountPath": "/etc/train"}, {"name": "ckpt", "mountPath": "/ckpt"},
                          {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                           "readOnly": True}],
         "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
         "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 5},
         "terminationMessagePath": "/dev/termination-log", "imagePullPolicy": "IfNotPresent"}
    side = {"name": "log-shipper", "image": "registry.example.com/infra/fluent-bit:3.1",
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            "volumeMounts": [{"name": "varlog", "mountPath": "/var/log"}]}
    return ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{app}-{i:06x}-{i % 97:05d}", "namespace": ns,
        "labels": {"app": app, "pod-template-hash": f"{i // 20:010x}", "team": ns, "tier": "training",
                   "app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "ml-platform"},
        "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8080",
                        "kubectl.kubernetes.io/restartedAt": T0, "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{app}-{i // 20:010x}",
                             "uid": f"{i // 20:08x}-0000-4000-8000-000000000000", "controller": True,
                             "blockOwnerDeletion": True}]},
        "spec": {"nodeName": f"gpu-node-{i % nodes:05d}", "containers": [c, side], "restartPolicy": "Always",
                 "serviceAccountName": "trainer", "schedulerName": "default-scheduler", "priority": 0,
                 "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                 {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                  "effect": "NoExecute", "tolerationSeconds": 300}],
                 "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                     {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]}}},
                 "volumes": [{"name": "config", "configMap": {"name": f"{app}-config"}},
                             {"name": "ckpt", "persistentVolumeClaim": {"claimName": f"{app}-ckpt"}},
                             {"name": "varlog", "hostPath": {"path": "/var/log"}},
                             {"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                                 {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                                 {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                                 {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                                     "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}]}}


def event_obj(i: int, nodes: int, pods: int) -> tuple[str, dict]:
    """gpuwarden's Events: every other about a Node (namespace default), the rest about a pod (as an
    agent before issue 29 wrote them); with ONE_NODE all about that Node, every other naming a pod of
    it as `related` (as the agent writes them now)."""
    if ONE_NODE:
        pns, p = pod_obj(i % max(pods, 1), nodes)
        rel = {"related": {"kind": "Pod", "name": p["metadata"]["name"], "namespace": pns}} if i % 2 else {}
        ns, ev = _event_obj(i * 2, nodes, pods)  # an even i: about a Node
        io = {"kind": "Node", "name": ONE_NODE, "apiVersion": "v1"}
        ev["metadata"].update(name=f"{ONE_NODE}.{i:016x}", labels={"gpuwarden.io/node": ONE_NODE})
        ev.update(involvedObject=io, source={"component": "gpuwarden", "host": ONE_NODE}, reportingInstance=ONE_NODE, **rel)
        return ns, ev
    return _event_obj(i, nodes, pods)


def _event_obj(i: int, nodes: int, pods: int) -> tuple[str, dict]:
    node = f"gpu-node-{i % nodes:05d}"
    about_node = i % 2 == 0
    if about_node:
        ns, io = "default", {"kind": "Node", "name": node, "apiVersion": "v1"}
    else:
        pns, p = pod_obj(i % max(pods, 1), nodes)
        node = p["spec"]["nodeName"]
        ns, io = pns, {"kind": "Pod", "name": p["metadata"]["name"], "namespace": pns, "apiVersion": "v1"}
    reason = ("GpuDrv003", "GpuDrv003Cleared", "GpuK8s001", "EvictedPod")[i % 4]
    return ns, {"apiVersion": "v1", "kind": "Event", "metadata": {
        "name": f"{io['name']}.{i:016x}", "namespace": ns, "labels": {"gpuwarden.io/node": node}},
        "involvedObject": io, "type": "Warning" if i % 4 != 1 else "Normal", "reason": reason,
        "message": f"GPU-DRV-003: Xid 79 on GPU 0000:{i % 256:02x}:00.0 (fallen off the bus). Fix: drain the node "
                   f"and reset or replace the GPU. {'evidence ' * 20}",
        "source": {"component": "gpuwarden", "host": node}, "reportingComponent": "gpuwarden",
        "reportingInstance": node, "firstTimestamp": T0, "lastTimestamp": T0, "count": 1 + i % 3}


# -- filling ---------------------------------------------------------------------------------------
class Poster:
    """One keep-alive HTTP connection per thread (the fill is the bench's slowest part)."""

    def __init__(self, url: str) -> None:
        self.u = urlparse(url)
        self.local = threading.local()

    def post(self, path: str, obj: dict) -> None:
        body = json.dumps(obj).encode()
        for attempt in range(5):
            conn = getattr(self.local, "conn", None) or http.client.HTTPConnection(self.u.hostname, self.u.port,
                                                                                 timeout=60)
            self.local.conn = conn
            try:
                conn.request("POST", path, body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                if r.status in (200, 201, 409):
                    return
                if r.status < 500:
                    raise RuntimeError(f"POST {path}: HTTP {r.status}")
            except (OSError, http.client.HTTPException):
                self.local.conn = None
            time.sleep(0.2 * (attempt + 1))
        raise RuntimeError(f"POST {path} kept failing")


def fill(url: str, nodes: int, pods: int, events: int, workers: int) -> dict:
    p = Poster(url)
    t = {}
    for ns in ["default"] + [f"team-{k:02d}" for k in range(NAMESPACES)]:
        p.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    with ThreadPoolExecutor(workers) as ex:
        t0 = time.monotonic()
        list(ex.map(lambda i: p.post("/api/v1/nodes", node_obj(i)), range(nodes)))
        t["nodes_s"] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        list(ex.map(lambda i: (lambda ns, o: p.post(f"/api/v1/namespaces/{ns}/pods", o))(*pod_obj(i, nodes)),
                    range(pods)))
        t["pods_s"] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        list(ex.map(lambda i: (lambda ns, o: p.post(f"/api/v1/namespaces/{ns}/events", o))(*event_obj(i, nodes, pods)),
                    range(events)))
        t["events_s"] = round(time.monotonic() - t0, 1)
    t["pod_bytes"] = len(json.dumps(pod_obj(1, nodes)[1]))
    # as served: with the managedFields server-side apply tracking adds on create (as kube-apiserver does)
    conn = http.client.HTTPConnection(p.u.hostname, p.u.port, timeout=60)
    conn.request("GET", "/api/v1/pods?limit=100")
    t["pod_bytes_served"] = len(conn.getresponse().read()) // 100
    t["node_bytes"] = len(json.dumps(node_obj(1)))
    t["event_bytes"] = len(json.dumps(event_obj(1, nodes, pods)[1]))
    return t


# -- the measured children -------------------------------------------------------------------------
CHILD = r'''
import json, sys, time, io
kubeconfig, what, node = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.perf_counter()
out = {}
class Quiet:
    def info(self, *a, **k): pass
    warn = error = info
if what == "controller":
    from gpuwarden.controller.config import ControllerConfig
    from gpuwarden.kube.client import Kube
    from gpuwarden.controller.loop import Controller
    cfg = ControllerConfig(kubeconfig=kubeconfig, leader_elect=False, watch=False, listen="", namespace="gpuwarden").resolved()
    # a deadline long enough for the peer's single whole-cluster list (1.1 GB at 60,000 pods: its default
    # 10 s deadline fails it); the paginated code's calls each take ~1 s
    c = Controller(cfg, Kube.from_config(kubeconfig, timeout_s=900), log=Quiet())
    c.step()
    out["cached"] = {i.name: len(i.items) for i in c.informers}
elif what == "agent-start":
    import dataclasses
    from gpuwarden.agent.config import AgentConfig
    from gpuwarden.agent.loop import Agent
    names = {f.name for f in dataclasses.fields(AgentConfig)}
    kw = dict(example="healthy", node_name=node, kubeconfig=kubeconfig, remediate="dry-run", listen="", namespace="gpuwarden")
    a = Agent(AgentConfig(**{k: v for k, v in kw.items() if k in names}), out=io.StringIO(), log=Quiet())
    a.start()
elif what == "kubectl-node":
    from gpuwarden.kube.client import Kube
    from gpuwarden.kubectl import nodeview
    kube = Kube.from_config(kubeconfig)
    n, evs = nodeview.gather(kube, node)
    view = nodeview.build(n, evs, time.time())
    out["events"] = len(evs)  # those the view kept
elif what in ("taint-pool", "untaint-pool"):
    from gpuwarden.controller import actions
    from gpuwarden.kube.client import Kube
    from gpuwarden.controller.model import WorkloadRef
    kube = Kube.from_config(kubeconfig)
    ref = WorkloadRef("Deployment", "team-00", "bench")
    if what == "taint-pool":
        o = actions.taint_pool(kube, ref, "gpuwarden.io/quarantine", "", False)
    else:
        o = actions.untaint_pool(kube, ref, "gpuwarden.io/quarantine", False)
    out["result"], out["nodes"], out["detail_chars"] = o.result, len(o.nodes), len(o.detail)
out["seconds"] = round(time.perf_counter() - t0, 2)
# the peak RSS of this process since its exec (wait4's ru_maxrss would carry the forking parent's)
out["peak_rss_mib"] = round(int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:"))) / 1024, 1)
print(json.dumps(out))
'''


def counts(url: str) -> dict:
    from tests.support.agent_kube import request_counts

    return request_counts(url)


def child(src: str, kubeconfig: str, url: str, what: str, node: str) -> dict:
    env = {**os.environ, "PYTHONPATH": src}
    before = counts(url)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, kubeconfig, what, node], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = b""
    assert proc.stdout is not None
    out = proc.stdout.read()
    err = proc.stderr.read() if proc.stderr else b""
    proc.wait()
    after = counts(url)
    diff = {" ".join(x for x in k if x): v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}
    diff.pop("GET  ", None)
    try:
        res = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        res = {"error": (err or out).decode(errors="replace")[-800:]}
    res.setdefault("peak_rss_mib", 0.0)
    res["requests"] = dict(sorted(diff.items()))
    res["requests_total"] = sum(diff.values())
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--events", type=int, default=25000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--compare", default="", help="another checkout's src/ (the peer, measured in the same run)")
    ap.add_argument("--only", default="controller,agent-start,kubectl-node,taint-pool,untaint-pool")
    ap.add_argument("--gpu-every", type=int, default=3, help="one pod in N requests a GPU (1: every pod)")
    ap.add_argument("--one-node-events", action="store_true", help="every Event about the measured node")
    a = ap.parse_args()
    global GPU_EVERY, ONE_NODE
    GPU_EVERY = max(1, a.gpu_every)
    ONE_NODE = f"gpu-node-{a.nodes // 2:05d}" if a.one_node_events else ""
    from tests.support.apiserver import start_apiserver

    srcs = {"this": str(REPO / "src")}
    if a.compare:
        srcs["peer"] = a.compare
    res: dict = {"nodes": a.nodes, "pods": a.pods, "events": a.events, "gpu_every": GPU_EVERY,
                 "one_node_events": bool(ONE_NODE), "cores": os.cpu_count(),
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with start_apiserver(timeout=120) as s:
        res["fill"] = fill(s.url, a.nodes, a.pods, a.events, a.workers)
        print(f"filled: {res['fill']}", file=sys.stderr)
        node = f"gpu-node-{a.nodes // 2:05d}"
        only = a.only.split(",")
        groups = [[w] for w in only if not w.endswith("taint-pool")] + [[w for w in only if w.endswith("taint-pool")]]
        for group in filter(None, groups):
            for label, src in srcs.items():  # interleaved: this, peer, per measurement (a taint with its release)
                for what in group:
                    r = child(src, s.kubeconfig_path, s.url, what, node)
                    res.setdefault(what, {})[label] = r
                    print(f"{what:<13} {label:<5} {r.get('seconds', '?'):>7}s  {r['peak_rss_mib']:>7} MiB  "
                          f"{r['requests_total']:>6} requests  {r.get('error', '')[:200]}", file=sys.stderr)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
