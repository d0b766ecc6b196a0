"""NodeCondition content: types and reasons (kube.conditions), messages, transitions (agent.conditions)."""

from __future__ import annotations

import pytest

from gpuwarden.agent import conditions as C
from gpuwarden.findings import Finding, Severity, Status
from gpuwarden.kube import conditions as K


@pytest.mark.parametrize("code", ["GPU-DEV-001", "GPU-K8S-010", "GPU-NODE-001", "GPU-HW-007", "GPU-DRV-006"])
def test_reasons_are_valid_and_reversible(code):
    r = K.reason_for(code)
    assert K.REASON_RE.match(r)
    assert K.code_from_reason(r) == code


def test_reason_format_examples():
    assert K.reason_for("GPU-DEV-001") == "GpuDev001"
    for t in K.CONDITION_TYPES:
        assert K.REASON_RE.match(K.healthy_reason(t))


def test_family_and_prefix_mapping():
    assert K.condition_type("GPU-DEV-001", "device-access") == "GPUDeviceAccess"
    assert K.condition_type("GPU-DRV-006", "driver") == "GPUDriver"
    assert K.condition_type("GPU-K8S-001", "") == "GPUDevicePlugin"
    assert K.condition_type("GPU-NODE-001", "") == "GPUUnchargedMemory"
    assert K.condition_type("GPU-HW-003", "some-new-family") == "GPUHardware"
    assert set(K.FAMILY_TO_TYPE.values()) <= set(K.CONDITION_TYPES)


def test_message_is_one_line_with_the_fix():
    f = Finding("GPU-DEV-001", Status.CONFIRMED, Severity.HIGH, "t", "broken\nbadly", remedy="1. Do this.\n2. Then that.")
    reason, msg = C.fault_message([f])
    assert reason == "GpuDev001"
    assert "\n" not in msg and msg == "GPU-DEV-001: broken badly Fix: Do this."


def test_transition_time_is_kept_unless_status_flips():
    cur = [{"type": "GPUDriver", "status": "False", "reason": "NoGPUDriverProblem", "message": "m",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-01T00:00:00Z"},
           {"type": "Ready", "status": "True"}]
    same = C.Desired("GPUDriver", False, "NoGPUDriverProblem", "m")
    t0 = 1767225600.0  # 2026-01-01T00:00:00Z
    assert C.merge_conditions(cur, [same], t0 + 10, heartbeat_s=300) == []  # nothing to send
    [hb] = C.merge_conditions(cur, [same], t0 + 400, heartbeat_s=300)  # heartbeat due
    assert hb["lastTransitionTime"] == "2026-01-01T00:00:00Z" and hb["lastHeartbeatTime"] != hb["lastTransitionTime"]
    [flip] = C.merge_conditions(cur, [C.Desired("GPUDriver", True, "GpuDrv006", "x")], t0 + 20)
    assert flip["status"] == "True" and flip["lastTransitionTime"] == "2026-01-01T00:00:20Z"
    assert all(e["type"] != "Ready" for e in C.merge_conditions(cur, [same], t0 + 999))
