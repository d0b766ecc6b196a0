"""A node that fails every pod (controller/admission.py), on pods as the controller caches them."""

from __future__ import annotations

import dataclasses

from gpuwarden.controller.admission import find
from gpuwarden.controller.config import ControllerConfig
from gpuwarden.controller.model import trim_pod
from gpuwarden.parsers.wallclock import format_rfc3339

NOW = 1_800_000_000.0
CFG = dataclasses.replace(ControllerConfig(), namespace="gw")


def pod(i: int, node: str, status: dict, age_s: float = 60.0) -> dict:
    return trim_pod({"metadata": {"name": f"p{i}", "namespace": "ml", "uid": f"u{i}",
                                  "creationTimestamp": format_rfc3339(NOW - age_s),
                                  "ownerReferences": [{"kind": "ReplicaSet", "name": "trainer-1", "controller": True}]},
                     "spec": {"nodeName": node, "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                     "status": status})


def node(name: str, conds: list | None = None) -> dict:
    return {"metadata": {"name": name}, "status": {"conditions": conds or []}}


REFUSED = {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": "Allocate failed"}
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
