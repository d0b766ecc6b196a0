"""The agent fences its node for a lost GPU that fails every allocation (GPU-K8S-012), and lifts it after."""

from __future__ import annotations

import pytest

from gpuwarden.findings import Affected, Finding, Severity, Status
from gpuwarden.remediation.plan import Options, build
from tests.remediation.test_plan import state

LOST = Affected("gpu", "GPU-0a1b", detail="GPU 1, 0000:00:07.0", index=1, uuid="GPU-0a1b", bus_id="0000:00:07.0")


def k8s012(status: Status = Status.CONFIRMED, sev: Severity = Severity.CRITICAL) -> Finding:
    return Finding("GPU-K8S-012", status, sev, "t", "GPU 1 (0000:00:07.0) of 2 is lost …", family="device-plugin",
                   affected=[LOST])


@pytest.mark.rule("GPU-K8S-012", "positive")
def test_confirmed_lost_gpu_storm_taints_the_node_before_more_pods_land():
    [a] = build([k8s012()], state(), Options()).actions
    assert a.kind == "taint-node" and a.detail["taint"]["effect"] == "NoSchedule"
    assert a.detail["taint"]["key"] == "gpuwarden.io/unhealthy" and a.code == "GPU-K8S-012"


@pytest.mark.rule("GPU-K8S-012", "negative")
def test_at_risk_lost_gpu_does_not_fence():
    assert build([k8s012(Status.AT_RISK, Severity.HIGH)], state(), Options()).actions == []


@pytest.mark.rule("GPU-K8S-012", "clears")
def test_the_taint_is_lifted_once_the_finding_cleared():
    [a] = build([k8s012()], state(), Options()).actions
    tainted = {"metadata": {"name": "n1"}, "spec": {"taints": [a.detail["taint"]]}}
    assert build([k8s012()], state(node=tainted), Options()).actions == []  # still raised: nothing more
    [lift] = build([], state(node=tainted), Options()).actions
    assert lift.kind == "untaint-node" and lift.detail["taint"] == a.detail["taint"]


@pytest.mark.rule("GPU-K8S-012", "clears")
def test_the_taint_holds_while_the_gpu_is_still_lost_after_the_rejections_aged_out():
    """At risk again (no rejection in 10 minutes, the GPU still lost and advertised): the taint stays, as lifting it
    would let the next GPU pod land and be rejected; it goes once the finding is gone (the GPU is back)."""
    [a] = build([k8s012()], state(), Options()).actions
    tainted = {"metadata": {"name": "n1"}, "spec": {"taints": [a.detail["taint"]]}}
    assert build([k8s012(Status.AT_RISK, Severity.HIGH)], state(node=tainted), Options()).actions == []
    [lift] = build([], state(node=tainted), Options()).actions
    assert lift.kind == "untaint-node"


@pytest.mark.rule("GPU-K8S-012", "positive")
def test_on_a_dra_node_the_lost_gpu_alone_is_fenced_by_a_device_taint_and_held_while_at_risk():
    """Where the DRA driver alone hands out GPUs, the lost GPU's device gets the DeviceTaintRule (not the node);
    where a device-plugin pod runs, the node is tainted (a device taint would not stop the plugin)."""
    from tests.remediation.test_plan_device_fence import UUIDS, existing, kinds, state as dra_state

    f = Finding("GPU-K8S-012", Status.CONFIRMED, Severity.CRITICAL, "t", "GPU 1 of 2 is lost …", family="device-plugin",
                affected=[Affected("gpu", UUIDS[1])])
    assert kinds(build([f], dra_state(), Options())) == [("taint-device", "gpu.nvidia.com/n1/gpu-1")]
    with_plugin = dra_state()
    with_plugin.plugin_pods = [{"metadata": {"name": "nvidia-device-plugin-x", "namespace": "kube-system"}}]
    assert kinds(build([f], with_plugin, Options())) == [("taint-node", "n1")]
    at_risk = Finding("GPU-K8S-012", Status.AT_RISK, Severity.HIGH, "t", "GPU 1 of 2 is lost …", family="device-plugin",
                      affected=[Affected("gpu", UUIDS[1])])
    assert build([at_risk], dra_state(rules=[existing(1)]), Options()).actions == []  # held
    assert kinds(build([], dra_state(rules=[existing(1)]), Options())) == [("untaint-device", "gpu.nvidia.com/n1/gpu-1")]
