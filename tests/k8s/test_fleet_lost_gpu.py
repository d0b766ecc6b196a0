"""The fleet view says "node X: GPU 1 of 2 lost" and counts usable GPUs against allocatable, from what a real
agent published on the real test API server (its GPUDevicePlugin condition, message `GPU-K8S-012 [GPU 1
(0000:00:07.0) GPU-…]: …`), and stops saying it once the agent cleared the condition."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuwarden.controller import fleet
from tests.rules.test_hardware import SECOND_UUID, _later, _two_gpus
from tests.rules.test_lost_gpu import GPA_LOST, KUBELET_LOG, kubelet_event, klog
from tests.support.agent_kube import make_node, new_agent
from tests.support.bundles import open_dir, write
from tests.support.gpunode import plugin_log

pytestmark = pytest.mark.apiserver


def _view(kube) -> dict:
    nodes, events, workloads, breaker, lease, warnings = fleet.gather(kube, "gpuwarden", "gpuwarden",
                                                                      "gpuwarden-breaker", "gpuwarden-controller")
    return fleet.build(nodes, events, workloads, breaker, lease, time.time(), warnings=warnings)


@pytest.mark.rule("GPU-K8S-012", "clears")
def test_fleet_names_the_lost_gpu_and_counts_usable_against_allocatable(kube, k8s, tmp_path: Path) -> None:
    node = k8s.name("gpu-node")
    make_node(kube, node)
    kube.request("PATCH", f"/api/v1/nodes/{node}/status",
                 {"status": {"capacity": {"nvidia.com/gpu": "2"}, "allocatable": {"nvidia.com/gpu": "2"}}},
                 content_type="application/merge-patch+json")
    b = _two_gpus(tmp_path)
    plugin_log(b, klog(f"Marking device {SECOND_UUID} as unhealthy: GPU is lost"))
    write(b, KUBELET_LOG, kubelet_event(GPA_LOST))
    agent, _ = new_agent(kube, node, open_dir(b), k8s.namespace)
    agent.check()
    agent.check()  # debounce_raise=2: raised
    [row] = [r for r in _view(kube)["nodes"] if r["name"] == node]
    gc = row["gpuCount"]
    assert (gc["capacity"], gc["allocatable"], gc["usable"], gc["overcounted"]) == (2, 2, 1, True)
    assert gc["lost"] == [{"index": 1, "busId": "0000:00:07.0", "uuid": SECOND_UUID, "codes": ["GPU-K8S-012"]}]
    text = fleet.render_text(_view(kube), time.time())
    assert f"node {node}: GPU 1 of 2 lost (0000:00:07.0 {SECOND_UUID}; GPU-K8S-012)" in text
    assert "usable 1, allocatable nvidia.com/gpu 2: the scheduler still counts the lost GPU(s)" in text
    row_line = next(ln for ln in text.splitlines() if ln.startswith(node))
    assert " 1/2 " in row_line

    # the GPU is back: the plugin restarted clean, no failure for ten minutes; three clean checks clear it
    plugin_log(b, klog("Starting to serve 'nvidia.com/gpu'"), n=1)
    _later(b, 601)
    agent.root = open_dir(b)  # the node read again, ten minutes later
    for _ in range(3):
        agent.check()
    [row] = [r for r in _view(kube)["nodes"] if r["name"] == node]
    assert row["conditions"]["GPUDevicePlugin"]["status"] == "False"
    assert row["gpuCount"]["lost"] == [] and row["gpuCount"]["usable"] == 2
    assert "LOST GPUS" not in fleet.render_text(_view(kube), time.time())
