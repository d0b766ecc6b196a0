"""A node that fails every pod (controller/admission.py), on pods as the controller caches them."""

from __future__ import annotations

import dataclasses

from gpuwarden.controller.admission import find
from gpuwarden.controller.config import ControllerConfig
from gpuwarden.controller.model import ADMISSION, GPU_ADMISSION, GPU_START, classify_failure, trim_pod
from gpuwarden.controller.model import START as START_KIND
from gpuwarden.parsers.wallclock import format_rfc3339

NOW = 1_800_000_000.0
CFG = dataclasses.replace(ControllerConfig(), namespace="gw")


def pod(i: int, node: str, status: dict, age_s: float = 60.0, owner: str = "trainer-1") -> dict:
    return trim_pod({"metadata": {"name": f"p{i}", "namespace": "ml", "uid": f"u{i}",
                                  "creationTimestamp": format_rfc3339(NOW - age_s),
                                  "ownerReferences": [{"kind": "ReplicaSet", "name": owner, "controller": True}]},
                     "spec": {"nodeName": node, "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                     "status": status})


def node(name: str, conds: list | None = None) -> dict:
    return {"metadata": {"name": name}, "status": {"conditions": conds or []}}


REFUSED = {"phase": "Failed", "reason": "UnexpectedAdmissionError",
           "message": "Allocate failed due to can't allocate unhealthy devices nvidia.com/gpu, which is unexpected"}
START = {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {"reason": "StartError",
                                                                            "message": "nvidia-container-cli: initialization error"}}}]}


def test_refused_and_dead_at_start_count_and_name_the_agents_cause():
    pods = [pod(i, "a", REFUSED if i % 2 else START) for i in range(12)] + [pod(99, "b", {"phase": "Running"})]
    sick = node("a", [{"type": "GPUHardware", "status": "True", "reason": "GpuHw002", "message": "Xid 79"}])
    (f,) = find(pods, [sick, node("b")], NOW, CFG)
    assert (f.node, f.failed, f.sent) == ("a", 12, 12)
    assert f.workloads == ["replicaset/ml/trainer-1"] and "GPUHardware=GpuHw002 (Xid 79)" in f.cause
    assert f.example.startswith(("UnexpectedAdmissionError", "StartError"))


def test_healthy_nodes_and_old_or_few_failures_are_not_named():
    few = [pod(i, "a", REFUSED) for i in range(9)]
    assert find(few, [node("a")], NOW, CFG) == []
    old = [pod(i, "a", REFUSED, age_s=3600) for i in range(30)]
    assert find(old, [node("a")], NOW, CFG) == []
    mostly_fine = [pod(i, "a", REFUSED) for i in range(10)] + [pod(100 + i, "a", {"phase": "Running"}) for i in range(10)]
    assert find(mostly_fine, [node("a")], NOW, CFG) == []  # 50% < admission_fraction
    other_pool = [pod(i, "z", REFUSED) for i in range(20)]
    assert find(other_pool, [node("a")], NOW, CFG) == []
    (f,) = find([pod(i, "a", REFUSED) for i in range(10)], [node("a")], NOW, CFG)
    assert f.cause == "no gpuwarden agent reports on this node"


def test_the_rate_is_over_the_real_time_the_failures_took_not_a_minute_at_least():
    """Issue 29: 11 failures in ~7 s were reported as 11/min (the span floored at 60 s), so the pods a
    taint spares came out ~8x low. n failures are n - 1 gaps over the time between the first and last."""
    fast = [pod(i, "a", REFUSED, age_s=60.0 - 0.7 * i) for i in range(11)]  # one every 0.7 s
    (f,) = find(fast, [node("a")], NOW, CFG)
    assert 80 <= f.rate_per_min <= 90, f.rate_per_min  # creation times are whole seconds: 10 gaps in 7 s
    slow = [pod(i, "a", REFUSED, age_s=500.0 - 30 * i) for i in range(12)]  # one every 30 s
    (f,) = find(slow, [node("a")], NOW, CFG)
    assert f.rate_per_min == 2.0
    same_second = [pod(i, "a", REFUSED, age_s=10.0) for i in range(10)]  # within the 1 s resolution
    (f,) = find(same_second, [node("a")], NOW, CFG)
    assert f.rate_per_min == 9 * 60.0


def start(message: str, reason: str = "StartError") -> dict:
    return {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {"reason": reason, "message": message}}}]}


RUNC = "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: "
EXEC = start(RUNC + 'unable to start container process: exec: "/opt/train.sh": no such file or directory: unknown')
HOOK = start(RUNC + "unable to start container process: error during container init: error running hook #0: error "
             "running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: "
             "initialization error: nvml error: driver not loaded: unknown")
FAULT = [{"type": "GPUDevicePlugin", "status": "True", "reason": "GpuHw002", "message": "Xid 79"}]
CLEAR = [{"type": "GPUDevicePlugin", "status": "False", "reason": "GpuOk", "message": ""}]


def test_the_kubelet_and_runtime_words_decide_the_kind():
    assert classify_failure({"status": REFUSED})[0] == GPU_ADMISSION
    assert classify_failure({"status": {"reason": "OutOfnvidia.com/gpu"}})[0] == GPU_ADMISSION
    assert classify_failure({"status": {"reason": "OutOfcpu"}})[0] == ADMISSION
    assert classify_failure({"status": {"reason": "TopologyAffinityError", "message": "Resources cannot be allocated "
                                        "with Topology locality (nvidia.com/gpu)"}})[0] == ADMISSION
    cpu = "Allocate failed due to not enough cpus available to satisfy request: requested=8, available=2, which is unexpected"
    assert classify_failure({"status": {"reason": "UnexpectedAdmissionError", "message": cpu}})[0] == ADMISSION
    kind, text = classify_failure({"status": HOOK})
    assert kind == GPU_START and "nvidia-container-cli: initialization error" in text and len(text) <= 200
    assert classify_failure({"status": EXEC})[0] == START_KIND
    # a command named after the hook is the tenant's words, quoted by the runtime: not the node's
    forged = start(RUNC + 'unable to start container process: exec: "nvidia-container-cli: initialization error": '
                   'executable file not found in $PATH: unknown')
    assert classify_failure({"status": forged})[0] == START_KIND
    cdi = start("failed to create containerd task: CDI device injection failed: unresolvable CDI devices "
                "nvidia.com/gpu=GPU-1f2e", "CreateContainerError")
    assert classify_failure({"status": cdi})[0] == GPU_START
    for healthy in ({"phase": "Running"}, {"containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]},
                    {"containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff"}}}]},
                    {"containerStatuses": [{"state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]},
                    {"containerStatuses": [{"state": {"terminated": {"reason": "Error", "exitCode": 1}}}]}):
        assert classify_failure({"status": healthy}) == ("", "")


def test_workload_failures_do_not_fence_a_healthy_node_concentrated_or_spread():
    """30 pods of one Job whose command does not start, on one healthy node or over three."""
    healthy = [node(n, CLEAR) for n in "abc"]
    assert find([pod(i, "a", EXEC) for i in range(30)], healthy, NOW, CFG) == []
    assert find([pod(i, "abc"[i % 3], EXEC) for i in range(30)], healthy, NOW, CFG) == []
    assert find([pod(i, "a", {"reason": "OutOfcpu"}) for i in range(30)], healthy, NOW, CFG) == []
    # the GPU hook's message, but the same workload dies at start on other nodes too: the image's
    spread = [pod(i, "abc"[i % 3], HOOK) for i in range(36)]
    assert find(spread, healthy, NOW, CFG) == []


def test_the_gpu_stack_or_the_agents_fault_fences():
    healthy = [node(n, CLEAR) for n in "abc"]
    (f,) = find([pod(i, "a", REFUSED) for i in range(12)], healthy, NOW, CFG)
    assert f.node == "a" and not f.fault
    # two nodes with a broken plugin each refuse the same workload: both are the nodes'
    both = find([pod(i, "ab"[i % 2], REFUSED) for i in range(24)], healthy, NOW, CFG)
    assert [f.node for f in both] == ["a", "b"]
    # the GPU hook fails on one node only while the workload runs elsewhere
    pods = [pod(i, "a", HOOK) for i in range(12)] + [pod(100 + i, "b", {"phase": "Running"}) for i in range(5)]
    (f,) = find(pods, healthy, NOW, CFG)
    assert f.node == "a" and "nvidia-container-cli" in f.example
    # any start failure counts where the agent reports a GPU fault
    (f,) = find([pod(i, "a", EXEC) for i in range(12)], [node("a", FAULT)] + healthy[1:], NOW, CFG)
    assert f.node == "a" and f.fault and "GPUDevicePlugin=GpuHw002" in f.cause
    # mixed: the workload's failures do not make up the node's count
    mixed = [pod(i, "a", REFUSED) for i in range(6)] + [pod(100 + i, "a", EXEC, owner="other") for i in range(20)]
    assert find(mixed, healthy, NOW, CFG) == []
