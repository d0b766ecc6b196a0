"""GPU-K8S-012 from the API server's rejected pods: the kubelet at its default verbosity logs no rejection,
but the pod's status says it (phase Failed, reason UnexpectedAdmissionError, "Pod was rejected: Allocate
failed due to …, which is unexpected": Kubelet.rejectPod, pkg/kubelet/cm/admission/errors.go; its
status.startTime is the rejection, set by the status manager). With a GPU the plugin reports lost, one such
pod naming a GPU in the last 10 minutes confirms the storm; pods rejected for anything else never count.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from gpuwarden import engine
from gpuwarden.facts import NodeFacts, Settings
from gpuwarden.findings import Severity, Status
from gpuwarden.parsers.admission import gpu_rejection, gpu_rejections
from gpuwarden.parsers.wallclock import format_rfc3339
from tests.rules.test_hardware import SECOND_UUID, _later, _two_gpus
from tests.rules.test_lost_gpu import GPA_LOST, NVLINK_LOST, klog
from tests.support.bundles import GPU_UUID, open_dir
from tests.support.gpunode import healthy, plugin_log

CODE = "GPU-K8S-012"
CAPTURED = 1795313561.0  # the healthy example's capture, 2026-11-22T02:12:41Z
UNAVAILABLE = ("requested number of devices unavailable for nvidia.com/gpu. Requested: 1, Available: 0")


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


def check(b: Path, pods: Any) -> list:
    calls = []

    def read() -> Any:
        calls.append(1)
        if isinstance(pods, Exception):
            raise pods
        return pods

    facts = NodeFacts(open_dir(b), Settings(admission_pods=read))
    rep = engine.run(facts, engine.select(engine.all_rules(), (CODE,)), mode="bundle")
    assert len(calls) <= 1
    return [f for f in rep.findings if f.code == CODE]


def plugin_lost(b: Path, uuid: str = GPU_UUID) -> None:
    plugin_log(b, klog(f"Marking device {uuid} as unhealthy: GPU is lost"))


@pytest.mark.rule(CODE, "positive")
def test_k8s012_plugin_lost_gpu_and_one_pod_rejected_at_admission_is_confirmed_with_the_pod_named(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_lost(b)
    assert [f.status for f in check(b, [])] == [Status.AT_RISK]  # no rejection yet: at risk, not fenced
    [f] = check(b, [rejected("trainer-1", GPA_LOST)])
    assert f.status is Status.CONFIRMED and f.severity is Severity.CRITICAL
    assert f.summary.startswith("GPU 0 (0000:00:06.0) of 1 is lost and the kubelet rejected 1 GPU pod(s) at admission "
                                "since 2026-11-22 02:12:36Z (ml/trainer-1)")
    assert f.affected[0].uuid == GPU_UUID
    [p] = f.data["pods"]
    assert (p["namespace"], p["name"], p["uid"], p["time"]) == ("ml", "trainer-1", "uid-trainer-1", CAPTURED - 5)
    assert p["message"] == GPA_LOST
    assert any(e.source == "Pod ml/trainer-1 status (API server: pods of this node)"
               and e.text == f"rejected 2026-11-22 02:12:36Z (status.startTime): UnexpectedAdmissionError: {GPA_LOST}"
               for e in f.evidence)
    assert any("Marking device" in e.text for e in f.evidence)


@pytest.mark.rule(CODE, "positive")
def test_k8s012_replica_mig_and_device_id_rejections_count_on_the_lost_gpu_of_two(tmp_path: Path) -> None:
    b = _two_gpus(tmp_path)
    plugin_lost(b, SECOND_UUID)
    _later(b, 60)  # the plugin started 5 s before the capture: a minute of rejections since
    pods = [rejected("a", NVLINK_LOST, CAPTURED + 30),
            rejected("b", "requested number of devices unavailable for nvidia.com/gpu.shared. Requested: 1, Available: 0",
                     CAPTURED + 40, resources={"nvidia.com/gpu.shared": "1"}),
            rejected("c", "requested number of devices unavailable for nvidia.com/mig-1g.10gb. Requested: 1, Available: 0",
                     CAPTURED + 50, resources={"nvidia.com/mig-1g.10gb": "1"}),
            rejected("d", f"device plugin Allocate rpc failed with err: unknown device {SECOND_UUID}::3", CAPTURED + 55)]
    [f] = check(b, pods)
    assert f.status is Status.CONFIRMED and "GPU 1 (0000:00:07.0) of 2 is lost" in f.summary
    assert f.data["rejected"] == 4 and [p["name"] for p in f.data["pods"]] == ["a", "b", "c", "d"]
    assert f.affected[0].uuid == SECOND_UUID


def test_what_a_rejection_names() -> None:
    r = gpu_rejection(rejected("d", f"unknown device {SECOND_UUID}::3; nvidia.com/gpu.", CAPTURED))
    assert r is not None and r.device_ids == (f"{SECOND_UUID}::3",) and r.names == (f"{SECOND_UUID}::3", "nvidia.com/gpu")
    assert r.time_source == "status.startTime" and r.resources == ("nvidia.com/gpu",) and not r.lost
    r = gpu_rejection(rejected("e", GPA_LOST, None))
    assert r is not None and r.lost and r.time_source == "metadata.creationTimestamp" and r.time == CAPTURED - 1


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


@pytest.mark.rule(CODE, "negative")
def test_k8s012_rejections_for_anything_but_a_gpu_never_count(tmp_path: Path) -> None:
    assert gpu_rejections(NOT_GPU) == []
    b = healthy(tmp_path)
    plugin_lost(b)
    [f] = check(b, NOT_GPU)
    assert f.status is Status.AT_RISK and f.severity is Severity.HIGH


@pytest.mark.rule(CODE, "negative")
def test_k8s012_pods_rejected_long_ago_or_before_the_plugin_started_do_not_count(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_lost(b)
    # the plugin's current instance started at CAPTURED - 5: a rejection before it was its predecessor's
    [f] = check(b, [rejected("old", GPA_LOST, CAPTURED - 601), rejected("older", GPA_LOST, CAPTURED - 86400),
                    rejected("before-restart", GPA_LOST, CAPTURED - 10)])
    assert f.status is Status.AT_RISK


@pytest.mark.rule(CODE, "negative")
def test_k8s012_rejections_without_a_lost_gpu_confirm_nothing_and_a_healthy_node_never_asks(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    assert check(b, RuntimeError("must not be read")) == []  # no GPU lost: the API is not asked
    assert check(b, [rejected("trainer-1", GPA_LOST)]) == []


@pytest.mark.rule(CODE, "negative")
def test_k8s012_api_unreadable_stays_at_risk_and_says_so(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_lost(b)
    [f] = check(b, RuntimeError("HTTP 0 connection refused"))
    assert f.status is Status.AT_RISK
    assert any(e.text.startswith("not read: the API server: RuntimeError: HTTP 0") for e in f.evidence)
    [f] = check(b, {"kind": "Status"})  # garbage answer
    assert f.status is Status.AT_RISK


@pytest.mark.rule(CODE, "clears")
def test_k8s012_from_the_api_clears_when_rejections_stop_and_the_gpu_is_back(tmp_path: Path) -> None:
    b = healthy(tmp_path)
    plugin_lost(b)
    pods = [rejected("trainer-1", GPA_LOST)]
    assert check(b, pods)[0].status is Status.CONFIRMED
    _later(b, 601)  # ten minutes without a new rejection: the GPU is still lost, at risk again (not fenced)
    assert [f.status for f in check(b, pods)] == [Status.AT_RISK]
    plugin_log(b, klog("Starting to serve 'nvidia.com/gpu'"), n=1)  # the GPU is back, the plugin restarted
    assert check(b, pods) == []


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=40),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=5), max_leaves=30))
def test_garbage_pods_never_raise(pod: Any) -> None:
    gpu_rejection(pod)
    gpu_rejections([pod, pod])
    if isinstance(pod, dict):
        gpu_rejection({"metadata": pod, "spec": pod, "status": dict(pod, phase="Failed", reason="UnexpectedAdmissionError")})
