"""The agent's NodeConditions and Events against the real test API server (etcd + k8s.io/apiserver)."""

from __future__ import annotations

import pytest

from gpuwarden.examples import names as example_names, open_example
from gpuwarden.kube.client import SMP
from gpuwarden.kube.conditions import CONDITION_TYPES
from gpuwarden.root import Missing
from tests.support.agent_kube import (KUBELET_READY, NPD_KERNEL, conditions_of,
                                      make_node, new_agent, our_events)

pytestmark = pytest.mark.apiserver


def _blind(root):
    """The same root, but nothing can be listed: every rule becomes not-evaluated."""
    root.listdir = lambda p: Missing(p, "denied")
    return root


def test_conditions_merge_with_kubelet_and_npd_and_clear_after_m(kube, k8s):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    agent, _ = new_agent(kube, node, open_example("uvm-missing"), k8s.namespace)
    conds = conditions_of(kube, node)
    for t in CONDITION_TYPES:  # declared healthy at start
        assert conds[t]["status"] == "False" and conds[t]["reason"] == f"No{t}Problem"
    declared = conds["GPUDeviceAccess"]["lastTransitionTime"]

    agent.check()
    assert conditions_of(kube, node)["GPUDeviceAccess"]["status"] == "False"  # 1 < debounce_raise
    # the kubelet posts its status between our checks (its own strategic-merge patch)
    kube.patch_node_status(node, {"status": {"conditions": [dict(KUBELET_READY, lastHeartbeatTime="2026-01-01T00:01:00Z")]}}, SMP)
    r = agent.check()
    assert r.transitions == {"GPU-DEV-001": "raised"}
    conds = conditions_of(kube, node)
    gda = conds["GPUDeviceAccess"]
    assert (gda["status"], gda["reason"]) == ("True", "GpuDev001")
    assert gda["message"].startswith("GPU-DEV-001: 1 GPU container(s) are denied /dev/nvidia-uvm")
    assert "Fix: " in gda["message"] and "\n" not in gda["message"]
    raised_at = gda["lastTransitionTime"]
    assert raised_at >= declared
    # the kubelet's and NPD's conditions survive, untouched
    assert conds["Ready"]["lastHeartbeatTime"] == "2026-01-01T00:01:00Z" and conds["Ready"]["reason"] == "KubeletReady"
    assert conds["MemoryPressure"]["status"] == "False"
    assert conds["KernelDeadlock"] == NPD_KERNEL
    for t in [t for t in CONDITION_TYPES if t != "GPUDeviceAccess"]:
        assert conds[t]["status"] == "False"

    agent.check()
    assert conditions_of(kube, node)["GPUDeviceAccess"]["lastTransitionTime"] == raised_at  # stable while True

    # lost observability never clears a fault
    agent.root = _blind(open_example("healthy"))
    for _ in range(4):
        r = agent.check()
        assert r.observed["GPU-DEV-001"] == "unknown"
    assert conditions_of(kube, node)["GPUDeviceAccess"]["status"] == "True"

    # M clean observations clear it
    agent.root = open_example("healthy")
    agent.check()
    agent.check()
    assert conditions_of(kube, node)["GPUDeviceAccess"]["status"] == "True"
    r = agent.check()
    assert r.transitions == {"GPU-DEV-001": "cleared"}
    conds = conditions_of(kube, node)
    assert conds["GPUDeviceAccess"]["status"] == "False" and conds["GPUDeviceAccess"]["reason"] == "NoGPUDeviceAccessProblem"
    assert conds["Ready"]["lastHeartbeatTime"] == "2026-01-01T00:01:00Z" and conds["KernelDeadlock"] == NPD_KERNEL
    assert len([c for c in kube.get_node(node)["status"]["conditions"] if c["type"] == "GPUDeviceAccess"]) == 1


def test_events_once_per_debounce_and_aggregated(kube, k8s):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    agent, _ = new_agent(kube, node, open_example("uvm-missing"), k8s.namespace, debounce_clear=1)
    for _ in range(5):
        agent.check()
    evs = our_events(kube, node)
    assert {e["involvedObject"]["kind"] for e in evs} == {"Node"}  # the only object an agent reports about
    node_evs = [e for e in evs if "related" not in e]
    pod_evs = [e for e in evs if (e.get("related") or {}).get("kind") == "Pod"]
    assert [(e["type"], e["reason"], e["count"]) for e in node_evs] == [("Warning", "GpuDev001", 1)]
    e = node_evs[0]
    assert e["metadata"]["namespace"] == "default" and e["involvedObject"]["name"] == node
    assert e["reportingComponent"] == "gpuwarden" and e["source"]["component"] == "gpuwarden"
    assert [(p["related"]["namespace"], p["related"]["name"], p["reason"]) for p in pod_evs] == \
           [("ml", "trainer-0", "GpuDev001")]
    assert pod_evs[0]["involvedObject"]["name"] == node and "on pod ml/trainer-0" in pod_evs[0]["message"]
    # cleared, then raised again: a Normal event, and the Warning's count goes to 2
    agent.root = open_example("healthy")
    agent.check()
    agent.root = open_example("uvm-missing")
    agent.check()
    agent.check()
    evs = our_events(kube, node, "default")
    assert sorted((e["type"], e["reason"], e["count"], "related" in e) for e in evs) == [
        ("Normal", "GpuDev001Cleared", 1, False), ("Warning", "GpuDev001", 2, False), ("Warning", "GpuDev001", 2, True)]


def test_a_restarted_agent_keeps_a_raised_condition(kube, k8s):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    a1, _ = new_agent(kube, node, open_example("uvm-missing"), k8s.namespace)
    a1.check()
    a1.check()
    assert conditions_of(kube, node)["GPUDeviceAccess"]["status"] == "True"
    a2, _ = new_agent(kube, node, _blind(open_example("healthy")), k8s.namespace)
    for _ in range(3):
        a2.check()
    assert conditions_of(kube, node)["GPUDeviceAccess"]["status"] == "True"  # carried over, not observed since
    a2.root = open_example("healthy")
    for _ in range(3):
        a2.check()
    assert conditions_of(kube, node)["GPUDeviceAccess"]["status"] == "False"


@pytest.mark.parametrize("example", example_names())
def test_one_check_on_every_example(kube, k8s, example):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    agent, _ = new_agent(kube, node, open_example(example), k8s.namespace, debounce_raise=1)
    r = agent.check()
    assert not r.errors and agent.ready
    conds = conditions_of(kube, node)
    assert set(CONDITION_TYPES) <= set(conds) and conds["Ready"]["status"] == "True"
    from gpuwarden.kube.conditions import condition_type

    access = [f for f in r.findings if f.status.value == "confirmed"
              and condition_type(f.code, f.family) == "GPUDeviceAccess"]  # GPU-DEV-*, and GPU-DRA-010 on a DRA node
    assert (conds["GPUDeviceAccess"]["status"] == "True") == bool(access)


def test_hung_device_plugin_on_a_synthetic_node(kube, k8s):
    """A live (materialised) node whose device plugin never answers: GPUDevicePlugin, GpuK8s001."""
    import shutil

    from gpuwarden.root import HostRoot
    from tests.support.agent_nodes import DEVICE_PLUGIN_DIR, can_mknod, short_tmpdir, sock, synthetic_node
    from tests.support.fake_kubelet import Apart, FakeDevicePlugin

    if not can_mknod():
        pytest.skip("SYNTHETIC NODE UNAVAILABLE: materialising an example needs mknod (run as root)")
    d = short_tmpdir()
    try:
        root = synthetic_node(d / "root", "healthy")
        node = k8s.name("gpu-node")
        make_node(kube, node)
        with Apart(FakeDevicePlugin, sock(root, f"{DEVICE_PLUGIN_DIR}/nvidia-gpu.sock"), ["GPU-0"], hang_on={"GetDevicePluginOptions"}):
            agent, _ = new_agent(kube, node, HostRoot(str(root)), k8s.namespace, grpc=True, grpc_timeout_s=0.3)
            agent.check()
            agent.check()
        c = conditions_of(kube, node)["GPUDevicePlugin"]
        assert (c["status"], c["reason"]) == ("True", "GpuK8s001")
        assert "did not answer GetDevicePluginOptions within 0.3s" in c["message"]
        assert conditions_of(kube, node)["Ready"]["status"] == "True"
    finally:
        shutil.rmtree(d, ignore_errors=True)
