"""Issue 32 item 2 against the real test API server: the kubelet at its default verbosity logs no rejection,
the plugin alone reports the GPU lost (NVML does not), and the agent reads its node's rejected pods from the
API server (pods field-selected by `spec.nodeName`, only while a GPU is lost or for the remediation plan:
one list a check, shared). One
pod rejected at admission for a GPU confirms GPU-K8S-012 with the pod named; the node is fenced by the guarded
taint (dry-run prints it exactly), and the taint goes once the rejections stop and the GPU is back. Pods
rejected for another resource, for a reason that names no GPU, or long ago, never fence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuwarden.kube.client import Kube
from gpuwarden.parsers.wallclock import format_rfc3339
from tests.rules.test_hardware import _later
from tests.rules.test_lost_gpu import GPA_LOST, klog
from tests.support.agent_kube import cleanup_nodes, conditions_of, make_node, new_agent, our_events, request_counts
from tests.support.bundles import GPU_UUID, open_dir
from tests.support.gpunode import healthy, plugin_log

pytestmark = pytest.mark.apiserver

CODE = "GPU-K8S-012"
#: the healthy example's capture (2026-11-22T02:12:41Z): the agent's clock on that bundle; its plugin started 5 s before
CAPTURED = 1795313561.0
TAINT = {"key": "gpuwarden.io/unhealthy", "value": "device-plugin", "effect": "NoSchedule"}


@pytest.fixture
def kube(k8s):
    kb = Kube(k8s.api)
    yield kb
    cleanup_nodes(kb)


def rejected_pod(kube: Any, namespace: str, name: str, node: str, message: str, t: float = CAPTURED - 3,
                 resources: dict | None = None, reason: str = "UnexpectedAdmissionError") -> dict:
    """A pod bound to `node` that the kubelet rejected at admission, as Kubelet.rejectPod leaves it: phase
    Failed, the reason, "Pod was rejected: " + the message, startTime (the status manager's first write)."""
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.example/x:1", "resources": {
                "limits": resources if resources is not None else {"nvidia.com/gpu": "1"}}}]}}
    kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    status = {"status": {"phase": "Failed", "reason": reason, "message": "Pod was rejected: " + message,
                         "qosClass": "BestEffort", "startTime": format_rfc3339(t)}}
    return kube.request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", status,
                        content_type="application/merge-patch+json")


def plugin_lost_node(tmp_path: Path) -> Path:
    """The healthy node whose device plugin marked its GPU unhealthy ("GPU is lost"); NVML, the driver's log and
    the kubelet's log (default verbosity) say nothing."""
    b = healthy(tmp_path)
    plugin_log(b, klog(f"Marking device {GPU_UUID} as unhealthy: GPU is lost"))
    return b


def pod_lists(server_url: str) -> int:
    return request_counts(server_url).get(("LIST", "pods", ""), 0)


@pytest.mark.rule(CODE, "positive")
def test_dry_run_shows_the_exact_taint_for_one_rejected_pod_and_names_it(kube, k8s, tmp_path: Path):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    rejected_pod(kube, k8s.namespace, "trainer-1", node, GPA_LOST)
    rejected_pod(kube, k8s.namespace, "elsewhere", k8s.name("other-node"), GPA_LOST)  # another node's: never read
    agent, out = new_agent(kube, node, open_dir(plugin_lost_node(tmp_path)), k8s.namespace, remediate="dry-run")
    before = pod_lists(k8s.server.url)
    agent.check()
    r = agent.check()  # debounce_raise=2
    assert pod_lists(k8s.server.url) - before == 2  # one field-selected list a check, the rule's and the plan's
    [f] = [f for f in r.findings if f.code == CODE]
    assert f.status.value == "confirmed" and [p["name"] for p in f.data["pods"]] == ["trainer-1"]
    assert [(o.action.kind, o.result) for o in r.outcomes] == [("taint-node", "dry-run")]
    text = out.getvalue()
    uid = kube.get_node(node)["metadata"]["uid"]
    assert (f"[dry-run]   1. WOULD DO: taint-node node {node} (uid {uid}) gpuwarden.io/unhealthy=device-plugin:NoSchedule"
            f" — {CODE}: critical device-plugin fault: stop new pods landing here") in text.splitlines()
    assert kube.get_node(node)["spec"].get("taints") in (None, [])  # dry-run: nothing written
    c = conditions_of(kube, node)["GPUDevicePlugin"]
    assert (c["status"], c["reason"]) == ("True", "GpuK8s012")
    assert f"{k8s.namespace}/trainer-1" in c["message"] and "elsewhere" not in c["message"]


@pytest.mark.rule(CODE, "clears")
def test_the_first_rejected_pod_fences_the_node_and_the_taint_goes_when_rejections_stop_and_the_gpu_is_back(
        kube, k8s, tmp_path: Path):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    b = plugin_lost_node(tmp_path)
    agent, _ = new_agent(kube, node, open_dir(b), k8s.namespace, remediate="on")
    assert [f.status.value for f in agent.check().findings if f.code == CODE] == ["at-risk"]  # no pod rejected yet
    rejected_pod(kube, k8s.namespace, "trainer-1", node, GPA_LOST)
    # the code was already bad (at risk) once: the first check that sees the rejection raises it and fences
    r = agent.check()
    assert [(o.action.kind, o.result) for o in r.outcomes] == [("taint-node", "done")]
    assert agent.check().outcomes == []
    assert kube.get_node(node)["spec"]["taints"] == [TAINT]

    _later(b, 601)  # ten minutes on: no new rejection, but the GPU is still lost: at risk, the taint stays
    agent.root = open_dir(b)
    rs = [agent.check() for _ in range(3)]
    assert [[f.status.value for f in r.findings if f.code == CODE] for r in rs] == [["at-risk"]] * 3
    assert kube.get_node(node)["spec"]["taints"] == [TAINT]
    plugin_log(b, klog("Starting to serve 'nvidia.com/gpu'"), n=1)  # the GPU is back, the plugin restarted
    agent.root = open_dir(b)
    rs = [agent.check() for _ in range(3)]  # debounce_clear=3
    assert [[(o.action.kind, o.result) for o in r.outcomes] for r in rs] == [[], [], [("untaint-node", "done")]]
    assert kube.get_node(node)["spec"].get("taints") in (None, [])
    assert conditions_of(kube, node)["GPUDevicePlugin"]["status"] == "False"
    assert [e["reason"] for e in our_events(kube, node) if e.get("action")] == ["TaintedNode", "UntaintedNode"]


@pytest.mark.rule(CODE, "negative")
def test_rejections_for_other_resources_or_reasons_or_long_ago_never_fence(kube, k8s, tmp_path: Path):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    ns = k8s.namespace
    rejected_pod(kube, ns, "cpu", node, "Node didn't have enough resource: cpu, requested: 8000, used: 2000, capacity: 8000",
                 reason="OutOfcpu", resources={"cpu": "8"})
    rejected_pod(kube, ns, "memory", node, "Node didn't have enough resource: memory, requested: 1, used: 0, capacity: 0",
                 reason="OutOfmemory", resources={"memory": "1Gi"})
    rejected_pod(kube, ns, "fpga", node, "Allocate failed due to requested number of devices unavailable for "
                 "example.com/fpga. Requested: 1, Available: 0, which is unexpected",
                 resources={"example.com/fpga": "1", "nvidia.com/gpu": "1"})
    rejected_pod(kube, ns, "hang", node, "Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: "
                 "rpc error: code = DeadlineExceeded desc = context deadline exceeded, which is unexpected")
    rejected_pod(kube, ns, "outof-gpu", node, "Node didn't have enough resource: nvidia.com/gpu, requested: 1, used: 1, "
                 "capacity: 1", reason="OutOfnvidia.com/gpu")
    rejected_pod(kube, ns, "long-ago", node, GPA_LOST, t=CAPTURED - 3600)
    agent, out = new_agent(kube, node, open_dir(plugin_lost_node(tmp_path)), k8s.namespace, remediate="on")
    rs = [agent.check() for _ in range(3)]
    assert [[f.status.value for f in r.findings if f.code == CODE] for r in rs] == [["at-risk"]] * 3
    assert all(not [o for o in r.outcomes if o.action.kind == "taint-node"] for r in rs)
    assert kube.get_node(node)["spec"].get("taints") in (None, [])


def test_the_pods_are_read_only_while_a_gpu_is_lost_one_field_selected_list_a_check(kube, k8s, tmp_path: Path):
    """Detection only (remediate off, no DRA: no plan reads pods): a healthy node never lists pods; a node with a
    lost GPU lists its own pods once a check (fieldSelector spec.nodeName), whatever the cluster holds."""
    node = k8s.name("gpu-node")
    make_node(kube, node)
    for i in range(5):  # other nodes' rejected pods: the field selector leaves them to the server
        rejected_pod(kube, k8s.namespace, f"other-{i}", k8s.name("other-node"), GPA_LOST)
    quiet, _ = new_agent(kube, node, open_dir(healthy(tmp_path / "healthy")), k8s.namespace)
    before = pod_lists(k8s.server.url)
    for _ in range(3):
        quiet.check()
    assert pod_lists(k8s.server.url) - before == 0
    lost, _ = new_agent(kube, node, open_dir(plugin_lost_node(tmp_path / "lost")), k8s.namespace)
    before = pod_lists(k8s.server.url)
    rs = [lost.check() for _ in range(3)]
    assert pod_lists(k8s.server.url) - before == 3
    assert [[f.status.value for f in r.findings if f.code == CODE] for r in rs] == [["at-risk"]] * 3  # others' pods
