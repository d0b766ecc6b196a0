"""Remediation against the real test API server, on synthetic live nodes whose pod UIDs are the server's.

The server has no controllers: the tests recreate the device-plugin pod as its DaemonSet would,
and recreate GPU pods as their ReplicaSet would.
"""

from __future__ import annotations

import pytest

from gpuwarden.kube.client import Kube
from gpuwarden.root import HostRoot
from tests.support.agent_kube import (cleanup_nodes, conditions_of, delete_all_pods, ensure_namespace, make_node, make_pod, new_agent,
                                      our_events, plugin_pod, pods_named)
from tests.support.agent_nodes import POD_UID, rename_uids, synthetic_node
from tests.support.bundles import copy_example, open_dir, write
from tests.support.gpunode import nvml_snapshot, set_probes

pytestmark = pytest.mark.apiserver


@pytest.fixture
def kube(k8s):
    kb = Kube(k8s.api)
    ensure_namespace(kb, "ml")
    delete_all_pods(kb, "ml")
    yield kb
    delete_all_pods(kb, "ml")
    cleanup_nodes(kb)


def cluster(kube, k8s, node_dir, gpu_annotations=None):
    """A Node, its GPU pod ml/trainer-0 (uvm missing), a healthy GPU pod, the device plugin; the node's tree."""
    node = k8s.name("gpu-node")
    make_node(kube, node)
    gpu = make_pod(kube, "ml", "trainer-0", node, annotations=gpu_annotations)
    make_pod(kube, "ml", "other-0", node)
    make_pod(kube, "ml", "trainer-0-elsewhere", k8s.name("other-node"))
    plugin = plugin_pod(kube, k8s.namespace, "nvidia-device-plugin-aaaaa", node)
    root = synthetic_node(node_dir / "root", "uvm-missing", {POD_UID: gpu["metadata"]["uid"]})
    return node, gpu, plugin, root


def outcomes(result):
    return [(o.action.kind, o.action.target.name, o.result) for o in result.outcomes]


def test_dry_run_prints_the_plan_and_changes_nothing(kube, k8s, node_dir):
    node, gpu, plugin, root = cluster(kube, k8s, node_dir)
    agent, out = new_agent(kube, node, HostRoot(str(root)), k8s.namespace, remediate="dry-run")
    before = {n: p["metadata"]["resourceVersion"] for n, p in pods_named(kube, "ml").items()}
    for _ in range(3):
        r = agent.check()
    assert outcomes(r) == [("restart-device-plugin", "nvidia-device-plugin-aaaaa", "dry-run")]
    text = out.getvalue()
    assert "[dry-run] remediation plan for node" in text
    assert f"WOULD DO: restart-device-plugin pod {k8s.namespace}/nvidia-device-plugin-aaaaa" in text
    assert "later: delete-pod pod ml/trainer-0 — GPU-DEV-001: after the device plugin restarts and is Ready" in text
    assert "breaker: closed" in text
    assert text.count("[dry-run] remediation plan") == 1  # printed when it changes, not every check
    after = {n: p["metadata"]["resourceVersion"] for n, p in pods_named(kube, "ml").items()}
    assert after == before
    assert "nvidia-device-plugin-aaaaa" in pods_named(kube, k8s.namespace)
    assert [e for e in our_events(kube, node) if e.get("action")] == []  # no action, no action Event
    assert agent.metrics.registry.get_sample_value(
        "gpuwarden_remediation_actions_total",
        {"action": "restart-device-plugin", "result": "dry-run", "dry_run": "true"}) == 2.0


def test_restart_plugin_then_delete_exactly_the_affected_pod(kube, k8s, node_dir):
    node, gpu, plugin, root = cluster(kube, k8s, node_dir)
    agent, _ = new_agent(kube, node, HostRoot(str(root)), k8s.namespace, remediate="on")
    assert agent.check().outcomes == []  # 1 observation < debounce
    r = agent.check()
    assert outcomes(r) == [("restart-device-plugin", "nvidia-device-plugin-aaaaa", "done")]
    assert "nvidia-device-plugin-aaaaa" not in pods_named(kube, k8s.namespace)
    assert set(pods_named(kube, "ml")) == {"trainer-0", "other-0", "trainer-0-elsewhere"}  # deletes wait
    r = agent.check()
    assert outcomes(r) == [] and [d.target.name for d in r.plan.deferred] == ["trainer-0"]
    # the DaemonSet recreates the plugin pod; once it is Ready the GPU pod it served is recreated
    plugin_pod(kube, k8s.namespace, "nvidia-device-plugin-bbbbb", node)
    r = agent.check()
    assert outcomes(r) == [("delete-pod", "trainer-0", "done")]
    assert set(pods_named(kube, "ml")) == {"other-0", "trainer-0-elsewhere"}
    assert "nvidia-device-plugin-bbbbb" in pods_named(kube, k8s.namespace)

    evs = {(e["related"]["name"], e["reason"], e.get("action")): e for e in our_events(kube, node)
           if e.get("action")}
    assert {(e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in evs.values()} == {("Node", node)}
    assert set(evs) == {("nvidia-device-plugin-aaaaa", "RestartedDevicePlugin", "restart-device-plugin"),
                        ("trainer-0", "DeletedPod", "delete-pod")}
    ev = evs[("trainer-0", "DeletedPod", "delete-pod")]
    assert ev["related"]["namespace"] == "ml" and ev["related"]["uid"] == gpu["metadata"]["uid"]
    assert ev["message"].startswith("GPU-DEV-001: deleted pod ml/trainer-0") and "Finding: " in ev["message"]
    m = agent.metrics.registry
    assert m.get_sample_value("gpuwarden_remediation_actions_total",
                              {"action": "delete-pod", "result": "done", "dry_run": "false"}) == 1.0

    # the ReplicaSet recreates trainer-0 (same name, new uid) and the node shows it broken again:
    # the cooldown forbids deleting ml/trainer-0 twice
    new = make_pod(kube, "ml", "trainer-0", node)
    rename_uids(root, {gpu["metadata"]["uid"]: new["metadata"]["uid"]})
    r = agent.check()
    assert outcomes(r) == [("delete-pod", "trainer-0", "cooldown")]
    assert "trainer-0" in pods_named(kube, "ml")

    # a restarted agent rebuilds its cooldowns from its own action Events
    agent2, _ = new_agent(kube, node, HostRoot(str(root)), k8s.namespace, remediate="on")
    agent2.check()
    r = agent2.check()
    assert outcomes(r) == [("delete-pod", "trainer-0", "cooldown")]
    assert "trainer-0" in pods_named(kube, "ml")


def test_breaker_configmap_is_honoured_fresh_each_check(kube, k8s, node_dir):
    node, gpu, plugin, root = cluster(kube, k8s, node_dir)
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpuwarden-breaker", "namespace": k8s.namespace},
          "data": {"open": "true", "reason": "incident 42: hands off"}}
    kube.request("POST", f"/api/v1/namespaces/{k8s.namespace}/configmaps", cm)
    agent, _ = new_agent(kube, node, HostRoot(str(root)), k8s.namespace, remediate="on")
    agent.check()
    r = agent.check()
    assert outcomes(r) == [("restart-device-plugin", "nvidia-device-plugin-aaaaa", "breaker-open")]
    assert "incident 42" in r.outcomes[0].detail
    assert "nvidia-device-plugin-aaaaa" in pods_named(kube, k8s.namespace)
    kube.request("PATCH", f"/api/v1/namespaces/{k8s.namespace}/configmaps/gpuwarden-breaker", {"data": {"open": "false"}},
                 content_type="application/merge-patch+json")
    r = agent.check()
    assert outcomes(r) == [("restart-device-plugin", "nvidia-device-plugin-aaaaa", "done")]


def test_opted_out_gpu_pod_is_never_deleted(kube, k8s, node_dir):
    node, gpu, plugin, root = cluster(kube, k8s, node_dir, gpu_annotations={"gpuwarden.io/no-remediation": "true"})
    agent, _ = new_agent(kube, node, HostRoot(str(root)), k8s.namespace, remediate="on")
    agent.check()
    agent.check()
    plugin_pod(kube, k8s.namespace, "nvidia-device-plugin-bbbbb", node)
    r = agent.check()
    assert outcomes(r) == []
    assert [s.why for s in r.plan.skipped] == ['opted out (gpuwarden.io/no-remediation: "true")']
    assert "trainer-0" in pods_named(kube, "ml")


def _nvml_hang_node(tmp_path):
    """Incident 5 as a capture: the kubelet stalled on GetPreferredAllocation (the example's log) and the
    NVML probe timed out: GPU-DRV-006 confirmed by the kubelet's own word (one timeout alone is at-risk)."""
    b = copy_example("mig-nvml-hang", tmp_path)
    write(b, "/.gpuwarden/probes.json", '{"nvml": {"status": "timeout", "elapsed_s": 5.0, '
                                        '"detail": "snapshot did not return within 5s (child killed)"}}')
    return open_dir(b)


@pytest.mark.parametrize("action", ["taint", "cordon"])
def test_critical_driver_fault_taints_or_cordons_the_node(kube, k8s, tmp_path, action):
    node = k8s.name("gpu-node")
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    make_node(kube, node, taints=[gpu_taint])
    agent, _ = new_agent(kube, node, _nvml_hang_node(tmp_path), k8s.namespace, remediate="on",
                         node_fault_action=action)
    agent.check()
    r = agent.check()
    assert outcomes(r) == [(f"{action}-node", node, "done")]
    n = kube.get_node(node)
    if action == "taint":
        assert n["spec"]["taints"] == [gpu_taint, {"key": "gpuwarden.io/unhealthy", "value": "driver", "effect": "NoSchedule"}]
        assert not n["spec"].get("unschedulable")
    else:
        assert n["spec"]["unschedulable"] is True and n["spec"]["taints"] == [gpu_taint]
    c = conditions_of(kube, node)["GPUDriver"]
    assert (c["status"], c["reason"]) == ("True", "GpuDrv006")
    assert outcomes(agent.check()) == []  # done already: nothing more to do
    [ev] = [e for e in our_events(kube, node) if e.get("action")]
    assert ev["involvedObject"] == {"kind": "Node", "name": node, "apiVersion": "v1", "uid": n["metadata"]["uid"]}
    assert ev["reason"] == ("TaintedNode" if action == "taint" else "CordonedNode") and ev["count"] == 1


def test_node_opt_out_annotation(kube, k8s, tmp_path):
    node = k8s.name("gpu-node")
    make_node(kube, node, annotations={"gpuwarden.io/no-remediation": "true"})
    agent, _ = new_agent(kube, node, _nvml_hang_node(tmp_path), k8s.namespace, remediate="on")
    agent.check()
    r = agent.check()
    assert outcomes(r) == [] and "node opted out" in r.plan.skipped[0].why
    assert not kube.get_node(node)["spec"].get("taints")


RENDER_UID = "5e0c3a7e-2b1d-4c9a-8e7f-6d5c4b3a2918"  # ml pod of the driver-memory-cascade example


def test_memory_guard_evicts_the_attributed_pod_and_only_it(kube, k8s, node_dir):
    """Incident 4's numbers: uncharged driver memory, thrash; the guard deletes the attributed pod once."""
    node = k8s.name("gpu-node")
    make_node(kube, node)
    ensure_namespace(kube, "render")
    delete_all_pods(kube, "render")
    render = make_pod(kube, "render", "egl-render-0", node)
    make_pod(kube, "render", "bystander-0", node)
    root = synthetic_node(node_dir / "root", "driver-memory-cascade", {RENDER_UID: render["metadata"]["uid"]})

    dry, out = new_agent(kube, node, HostRoot(str(root)), k8s.namespace, remediate="dry-run")
    for _ in range(2):
        r = dry.check()
    assert outcomes(r) == [("evict-pod-for-memory", "egl-render-0", "dry-run")]
    assert "WOULD DO: evict-pod-for-memory pod render/egl-render-0" in out.getvalue()
    assert set(pods_named(kube, "render")) == {"egl-render-0", "bystander-0"}

    # the dry-run agent already raised GPUUnchargedMemory on the Node: a new agent finds the fault
    # standing and acts on its first check (no second debounce)
    agent, _ = new_agent(kube, node, HostRoot(str(root)), k8s.namespace, remediate="on")
    r = agent.check()
    assert outcomes(r) == [("evict-pod-for-memory", "egl-render-0", "done")]
    assert set(pods_named(kube, "render")) == {"bystander-0"}
    evs = [e for e in our_events(kube, node) if e.get("action") == "evict-pod-for-memory"]
    assert len(evs) == 1 and evs[0]["message"].startswith("GPU-NODE-001")
    # what the cascade controller needs if the pod is gone before it looks: node, owner and creation time
    ann = evs[0]["metadata"]["annotations"]
    ref = render["metadata"]["ownerReferences"][0]
    assert (ann["gpuwarden.io/node"], ann["gpuwarden.io/owner-kind"], ann["gpuwarden.io/owner-name"]) == \
        (node, ref["kind"], ref["name"])
    assert ann["gpuwarden.io/pod-created"] == render["metadata"]["creationTimestamp"]
    assert f"(owner {ref['kind']}/{ref['name']})" in evs[0]["message"]
    # the ReplicaSet brings it back on the same sick node: never twice within the cooldown
    again = make_pod(kube, "render", "egl-render-0", node)
    rename_uids(root, {render["metadata"]["uid"]: again["metadata"]["uid"]})
    r = agent.check()
    assert outcomes(r) == [("evict-pod-for-memory", "egl-render-0", "cooldown")]
    delete_all_pods(kube, "render")


def test_the_taint_is_lifted_once_its_fault_clears_and_only_ours(kube, k8s, tmp_path):
    """Issue 32: a verdict never latches a node. The agent's own taint goes when the critical fault
    that set it has cleared (after debounce); another component's taint on the same node stays."""
    node = k8s.name("gpu-node")
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    make_node(kube, node, taints=[gpu_taint])
    agent, _ = new_agent(kube, node, _nvml_hang_node(tmp_path / "hang"), k8s.namespace, remediate="on")
    agent.check()
    assert outcomes(agent.check()) == [("taint-node", node, "done")]
    ok = copy_example("healthy", tmp_path / "ok")
    set_probes(ok, nvml_snapshot())  # NVML answers again (a fault that is not evaluated never clears)
    agent.root = open_dir(ok)
    seen = [outcomes(agent.check()) for _ in range(3)]  # debounce_clear=3: cleared on the third
    assert seen[:2] == [[], []] and seen[2] == [("untaint-node", node, "done")], seen
    assert kube.get_node(node)["spec"]["taints"] == [gpu_taint]
    assert conditions_of(kube, node)["GPUDriver"]["status"] == "False"
    reasons = [e["reason"] for e in our_events(kube, node) if e.get("action")]
    assert reasons == ["TaintedNode", "UntaintedNode"]
    assert outcomes(agent.check()) == []  # nothing left to lift: no further write


def test_the_taint_stays_while_the_fault_is_raised(kube, k8s, tmp_path):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    agent, _ = new_agent(kube, node, _nvml_hang_node(tmp_path), k8s.namespace, remediate="on")
    for _ in range(4):
        agent.check()
    assert [t["key"] for t in kube.get_node(node)["spec"]["taints"]] == ["gpuwarden.io/unhealthy"]
    assert [e["reason"] for e in our_events(kube, node) if e.get("action")] == ["TaintedNode"]
