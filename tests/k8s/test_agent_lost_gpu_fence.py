"""Issue 32 against the real test API server: the agent fences its own node at the first allocations a
lost GPU fails (GPU-K8S-012, before the storm), names the GPU in its condition (here the node's only GPU: GPU 0 of 1), and lifts the taint once
the GPU is back (the plugin restarted clean, no failure for 10 minutes) after debounce_clear checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.kube.client import Kube
from tests.rules.test_hardware import _later
from tests.rules.test_lost_gpu import GPA_LOST, KUBELET_LOG, klog, kubelet_event
from tests.support.agent_kube import cleanup_nodes, conditions_of, make_node, new_agent, our_events
from tests.support.bundles import GPU_UUID, open_dir, write
from tests.support.gpunode import healthy, plugin_log

pytestmark = pytest.mark.apiserver


@pytest.fixture
def kube(k8s):
    kb = Kube(k8s.api)
    yield kb
    cleanup_nodes(kb)


@pytest.mark.rule("GPU-K8S-012", "clears")
def test_lost_gpu_storm_taints_the_node_names_the_gpu_and_the_taint_goes_when_the_gpu_is_back(kube, k8s, tmp_path: Path):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    b = healthy(tmp_path)
    plugin_log(b, klog(f"Marking device {GPU_UUID} as unhealthy: GPU is lost"))
    write(b, KUBELET_LOG, kubelet_event(GPA_LOST))  # the first pod the lost GPU made the kubelet reject
    agent, _ = new_agent(kube, node, open_dir(b), k8s.namespace, remediate="on")
    agent.check()
    r = agent.check()  # debounce_raise=2
    assert [(o.action.kind, o.result) for o in r.outcomes] == [("taint-node", "done")]
    assert kube.get_node(node)["spec"]["taints"] == [{"key": "gpuwarden.io/unhealthy", "value": "device-plugin",
                                                      "effect": "NoSchedule"}]
    c = conditions_of(kube, node)["GPUDevicePlugin"]
    assert (c["status"], c["reason"]) == ("True", "GpuK8s012")
    # the GPU, then the pod holding it (rules/held_devices.py), then the verdict
    assert c["message"].startswith(f"GPU-K8S-012 [GPU 0 (0000:00:06.0) {GPU_UUID}]: GPU 0 (0000:00:06.0) of 1 "
                                   "(held by pod(s) ml/trainer-0) is lost")

    plugin_log(b, klog("Starting to serve 'nvidia.com/gpu'"), n=1)  # the GPU is back, the plugin restarted
    _later(b, 601)
    agent.root = open_dir(b)  # the node read again, ten minutes later
    rs = [agent.check() for _ in range(3)]
    seen = [[(o.action.kind, o.result) for o in r.outcomes] for r in rs]
    assert seen == [[], [], [("untaint-node", "done")]], seen
    assert kube.get_node(node)["spec"].get("taints") in (None, [])
    assert conditions_of(kube, node)["GPUDevicePlugin"]["status"] == "False"
    assert [e["reason"] for e in our_events(kube, node) if e.get("action")] == ["TaintedNode", "UntaintedNode"]
