"""parsers.admission: which pods the kubelet rejected at admission for a GPU, from their API objects.

The pods are written as the kubelet leaves them (Kubelet.rejectPod: phase Failed, the admit handler's reason,
"Pod was rejected: " + its message; startTime from the status manager's first write), with the device
manager's and the kubelet's predicate's own wording (pkg/kubelet/cm/admission/errors.go: "Allocate failed due
to %v, which is unexpected"; devicemanager: "requested number of devices unavailable for %s. Requested: %d,
Available: %d"; lifecycle/predicate.go: "Node didn't have enough resource: %s, requested: %d, used: %d,
capacity: %d", reason OutOf<resource>).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings, strategies as st

from gpuwarden.parsers.admission import gpu_rejection, gpu_rejections
from gpuwarden.parsers.wallclock import format_rfc3339
from tests.rules.test_hardware import SECOND_UUID
from tests.rules.test_lost_gpu import GPA_LOST

CAPTURED = 1795313561.0  # the healthy example's capture, 2026-11-22T02:12:41Z
#: devicemanager.devicesToAllocate when the plugin marked the GPU unhealthy and the scheduler's view lagged
UNAVAILABLE = "requested number of devices unavailable for nvidia.com/gpu. Requested: 1, Available: 0"


def rejected(name: str, msg: str, t: float | None = CAPTURED - 5, ns: str = "ml", reason: str = "UnexpectedAdmissionError",
             resources: dict | None = None, phase: str = "Failed") -> dict[str, Any]:
    """A pod as the API server lists it after the kubelet rejected it (Kubelet.rejectPod)."""
    status: dict[str, Any] = {"phase": phase, "reason": reason, "message": "Pod was rejected: " + msg, "qosClass": "BestEffort"}
    if t is not None:
        status["startTime"] = format_rfc3339(t)
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "creationTimestamp": format_rfc3339((t or CAPTURED) - 1)},
            "spec": {"nodeName": "gpu-node-a", "containers": [{"name": "c", "resources": {
                "limits": resources if resources is not None else {"nvidia.com/gpu": "1"}}}]},
            "status": status}


def test_what_a_rejection_names() -> None:
    r = gpu_rejection(rejected("d", f"unknown device {SECOND_UUID}::3; nvidia.com/gpu.", CAPTURED))
    assert r is not None and r.device_ids == (f"{SECOND_UUID}::3",) and r.names == (f"{SECOND_UUID}::3", "nvidia.com/gpu")
    assert r.time_source == "status.startTime" and r.resources == ("nvidia.com/gpu",) and not r.lost
    r = gpu_rejection(rejected("e", GPA_LOST, None))
    assert r is not None and r.lost and r.time_source == "metadata.creationTimestamp" and r.time == CAPTURED - 1
    r = gpu_rejection(rejected("u", f"Allocate failed due to {UNAVAILABLE}, which is unexpected"))
    assert r is not None and r.names == ("nvidia.com/gpu",) and r.message.startswith("Allocate failed due to requested")


NOT_GPU = [
    # another resource: CPU, memory, another extended resource (the kubelet's own words)
    rejected("cpu", "Node didn't have enough resource: cpu, requested: 8000, used: 2000, capacity: 8000", reason="OutOfcpu"),
    rejected("mem", "Node didn't have enough resource: memory, requested: 1, used: 0, capacity: 0", reason="OutOfmemory"),
    rejected("cpumgr", "Allocate failed due to not enough cpus available to satisfy request: requested=8, available=4, "
                       "which is unexpected", resources={"cpu": "8", "nvidia.com/gpu": "1"}),
    rejected("fpga", "Allocate failed due to requested number of devices unavailable for example.com/fpga. Requested: 1, "
                     "Available: 0, which is unexpected", resources={"example.com/fpga": "1", "nvidia.com/gpu": "1"}),
    rejected("rdma", "Allocate failed due to requested number of devices unavailable for rdma/hca. Requested: 1, Available: "
                     "0, which is unexpected", resources={"rdma/hca": "1"}),
    # the node's capacity (OutOf<GPU>): the scheduler's view lagged, allocation did not fail
    rejected("outof", "Node didn't have enough resource: nvidia.com/gpu, requested: 1, used: 1, capacity: 1",
             reason="OutOfnvidia.com/gpu"),
    # a GPU pod, rejected for a reason that names no GPU
    rejected("hang", "Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: rpc error: "
                     "code = DeadlineExceeded desc = context deadline exceeded, which is unexpected"),
    rejected("perm", GPA_LOST.replace("GPU is lost", "Insufficient Permissions")),
    rejected("affinity", "Predicate NodeAffinity failed", reason="NodeAffinity"),
    rejected("topo", "Resources cannot be allocated with Topology locality", reason="TopologyAffinityError"),
    # not rejected: a GPU pod that ran and failed, one still pending, one whose status names the GPU but is not Failed
    rejected("ran", "GPU is lost", reason="Error"),
    rejected("pending", GPA_LOST, phase="Pending"),
    # a pod that asks for no NVIDIA resource
    rejected("nogpu", GPA_LOST, resources={"cpu": "1"}),
]



def test_no_refusal_for_another_resource_or_reason_is_a_gpu_rejection() -> None:
    assert gpu_rejections(NOT_GPU) == []


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=40),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=5), max_leaves=30))
def test_garbage_pods_never_raise(pod: Any) -> None:
    gpu_rejection(pod)
    gpu_rejections([pod, pod])
    if isinstance(pod, dict):
        gpu_rejection({"metadata": pod, "spec": pod, "status": dict(pod, phase="Failed", reason="UnexpectedAdmissionError")})
