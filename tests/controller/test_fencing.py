"""The fence storm (controller/fencing.py): every fence the agents put up counts, per code; pure.

The fleet run against the test API server, real agents and the real controller under the chart's
identities, is tests/k8s/test_fleet_sim.py (`--fault xid`).
"""

from __future__ import annotations

import dataclasses

import pytest

from gpuwarden.controller import fencing
from gpuwarden.controller.config import ControllerConfig
from tests.controller.objects import T0, node, node_event

CFG = dataclasses.replace(ControllerConfig(), storm_nodes=3, storm_fraction=0.3, storm_window_s=600, event_hold_s=600)
NODES = [f"gpu-{i:02d}" for i in range(10)]

FENCES = {  # what the agents' executor writes (remediation/executor.py): action, reason, "CODE: ..." message
    "node-hw": ("taint-node", "TaintedNode", "GPU-HW-002: node/{n} tainted gpuwarden.io/unhealthy=hardware:NoSchedule"),
    "node-drv": ("taint-node", "TaintedNode", "GPU-DRV-001: node/{n} tainted gpuwarden.io/unhealthy=driver:NoSchedule"),
    "lost-gpu": ("taint-node", "TaintedNode", "GPU-K8S-012: node/{n} tainted gpuwarden.io/unhealthy=device-plugin:NoSchedule"),
    "device": ("taint-device", "TaintedDevice", "GPU-HW-002: DeviceTaintRule gpuwarden-{n}-gpu-1 created"),
    "cordon": ("cordon-node", "CordonedNode", "GPU-HW-002: node/{n} cordoned"),
}


def fence(n: str, kind: str, at: float) -> dict:
    action, reason, msg = FENCES[kind]
    ev = node_event(n, reason, at, etype="Normal", message=msg.format(n=n))
    ev["action"] = action
    return ev


def shows(n: str, code: str, at: float = T0 - 60) -> dict:
    t = "GPUHardware" if code.startswith("GPU-HW") else "GPUDriver" if code.startswith("GPU-DRV") else "GPUDevicePlugin"
    reason = "Gpu" + code.split("-")[1].capitalize() + code.split("-")[2]
    return node(n, conds={t: ("True", at, reason, f"{code}: ...")})


def detect(nodes, events, in_storm=()):
    return fencing.detect(nodes, events, T0, CFG, set(NODES), in_storm)


@pytest.mark.parametrize("kind", sorted(FENCES))
def test_every_kind_of_fence_counts_towards_the_storm_of_its_code(kind):
    code = FENCES[kind][2].split(":")[0]
    nodes = [shows(n, code) for n in NODES[:3]] + [node(n) for n in NODES[3:]]
    d = detect(nodes, [fence(n, kind, T0 - 30 + i) for i, n in enumerate(NODES[:3])])
    [s] = d.started
    assert s.code == code and [f.node for f in s.fences] == NODES[:3] and s.showing == 3
    assert s.summary().startswith(f"fence storm: 3 of 10 GPU nodes fenced for {code} within 600s")


def test_under_the_thresholds_or_split_over_codes_or_outside_the_window_is_no_storm():
    nodes = [node(n) for n in NODES]
    assert detect(nodes, [fence(n, "node-hw", T0 - 10) for n in NODES[:2]]).started == []  # 2 < storm_nodes 3
    two_codes = [fence(n, "node-hw", T0 - 10) for n in NODES[:2]] + [fence(n, "node-drv", T0 - 10) for n in NODES[2:4]]
    assert detect(nodes, two_codes).started == []  # four fences, but two causes
    old = [fence(n, "node-hw", T0 - 700) for n in NODES[:5]]
    assert detect(nodes, old).started == []
    failed = []
    for n in NODES[:5]:  # a failed taint is a Warning RemediationFailed with the action: no fence went up
        ev = node_event(n, "RemediationFailed", T0 - 10, message="GPU-HW-002: taint-node failed on node/x: 409")
        ev["action"] = "taint-node"
        failed.append(ev)
    assert detect(nodes, failed).started == []
    # one node fenced twice (node and device) is one node
    assert detect(nodes, [fence(NODES[0], "node-hw", T0 - 9), fence(NODES[0], "device", T0 - 8),
                          fence(NODES[1], "device", T0 - 7)]).started == []
    # a fraction of a large pool: 3 nodes are not 30 % of 20
    cfg20 = dataclasses.replace(CFG)
    many = {f"gpu-{i:02d}" for i in range(20)}
    got = fencing.detect([node(n) for n in many], [fence(n, "node-hw", T0 - 5) for n in NODES[:3]], T0, cfg20, many, ())
    assert got.started == []


def test_the_storm_goes_on_while_enough_nodes_show_the_code_and_passes_when_they_clear():
    code = "GPU-HW-002"
    fenced = [fence(n, "node-hw", T0 - 400) for n in NODES[:3]]
    # the breaker halted four more: their conditions show the code, no fence of theirs
    nodes = [shows(n, code) for n in NODES[:7]] + [node(n) for n in NODES[7:]]
    d = detect(nodes, fenced, in_storm=[code])
    assert d.started == [] and d.ongoing == {code: 7} and d.passed == {}
    # the rollout is reverted: conditions clear on all but two; the fences within the window do not hold it
    nodes = [shows(n, code) for n in NODES[:2]] + [node(n) for n in NODES[2:]]
    d = detect(nodes, fenced, in_storm=[code])
    assert d.passed == {code: 2} and d.ongoing == {}
    # a Warning Event of the code not yet followed by its ...Cleared one still shows it
    warned = [node_event(n, "GpuHw002", T0 - 100) for n in NODES[:4]]
    cleared = [node_event(n, "GpuHw002Cleared", T0 - 50, etype="Normal") for n in NODES[:2]]
    d = detect([node(n) for n in NODES], fenced + warned, in_storm=[code])
    assert d.ongoing == {code: 4}
    d = detect([node(n) for n in NODES], fenced + warned + cleared, in_storm=[code])
    assert d.passed == {code: 2}


def test_the_breaker_note_of_a_fence_storm_is_recognised_by_its_prefix():
    s = fencing.FenceStorm("GPU-HW-002", [fencing.Fence("gpu-00", "GPU-HW-002", T0, "taint-node")], 10, 600)
    assert s.summary().startswith(fencing.REASON_PREFIX)
    assert s.to_json()["nodes"][0]["action"] == "taint-node"


class OneConfigMap:
    def __init__(self, data):
        self.cm = {"metadata": {"name": "gpuwarden-breaker", "namespace": "gw", "resourceVersion": "5"}, "data": data}
        self.patches = []

    def get_configmap(self, ns, name):
        return self.cm

    def patch_configmap(self, ns, name, patch):
        self.patches.append(patch)
        self.cm["data"].update(patch["data"])
        return self.cm


@pytest.mark.parametrize("reason, closes", [
    ("gpuwarden controller: fence storm: 7 of 20 GPU nodes fenced for GPU-HW-002 within 600s: ...", True),
    ("gpuwarden controller: 466 of 1500 GPU nodes started failing within 600s: ...", False),  # a node storm's
    ("ops: freeze during the upgrade", False),  # an operator's
])
def test_only_a_breaker_a_fence_storm_opened_is_closed_when_it_passes(reason, closes):
    from gpuwarden.controller import actions

    kube = OneConfigMap({"open": "true", "reason": reason})
    o = actions.close_fence_storm_breaker(kube, "gw", "gpuwarden-breaker", T0, "gpuwarden-controller/t", False)
    assert (o.result == "done") is closes, o
    assert kube.cm["data"]["open"] == ("false" if closes else "true")
    if not closes:
        assert "gpuwarden release breaker" in o.detail and kube.patches == []


def test_a_passed_storms_own_fences_do_not_start_it_again_new_ones_do():
    code = "GPU-HW-002"
    fenced = [fence(n, "node-hw", T0 - 100) for n in NODES[:5]]
    nodes = [node(n) for n in NODES]
    assert detect(nodes, fenced).started  # before: a storm
    d = fencing.detect(nodes, fenced, T0, CFG, set(NODES), (), {code: T0 - 20})
    assert d.started == []  # it passed 20 s ago: those fences are history
    again = [fence(n, "node-hw", T0 - 10) for n in NODES[5:8]]
    [s] = fencing.detect(nodes, fenced + again, T0, CFG, set(NODES), (), {code: T0 - 20}).started
    assert [f.node for f in s.fences] == NODES[5:8]


def test_the_storms_in_progress_and_passed_ride_on_the_lease():
    from gpuwarden.controller.detect import FleetHistory

    h = FleetHistory()
    h.fence_storms, h.fence_passed = {"GPU-HW-002": T0 - 30}, {"GPU-DRV-001": T0 - 60}
    back = FleetHistory.from_json(h.to_json())
    assert (back.fence_storms, back.fence_passed) == (h.fence_storms, h.fence_passed)
    new = FleetHistory()
    new.merge(back)
    assert (new.fence_storms, new.fence_passed) == (h.fence_storms, h.fence_passed)


def test_an_at_risk_warning_is_no_node_failure_a_confirmed_one_is():
    """The agent marks its Warning Event with the findings' status: one NVML timeout (GPU-DRV-006 at-risk,
    gpuwarden's own deadline) must not count as a failing node towards storms and cascades."""
    from gpuwarden.controller.model import node_signals

    def warned(status):
        ev = node_event("gpu-00", "GpuDrv006", T0 - 30, message="GPU-DRV-006: NVML did not answer within 5.0s once")
        if status:
            ev["metadata"]["annotations"] = {"gpuwarden.io/status": status}
        return ev

    sig = lambda ev: node_signals(node("gpu-00"), [ev], T0, ["GPUDriver"], ["GPU-DRV"], 600)  # noqa: E731
    assert sig(warned("at-risk")) == []
    assert [s.what for s in sig(warned("confirmed"))] == ["event GPU-DRV-006"]
    assert [s.what for s in sig(warned(None))] == ["event GPU-DRV-006"]  # an older agent's Event: as before
