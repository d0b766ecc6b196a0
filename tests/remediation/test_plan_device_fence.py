"""Fence one GPU, not the node (pure): a critical fault that names one GPU of several on a DRA node
plans a DeviceTaintRule on exactly that device instead of the node taint; a rule of ours whose
device no raised finding names any more is removed. The same against the real test API server,
under the chart's identity: tests/k8s/test_dra_api.py."""

from __future__ import annotations

import io

from gpuwarden.findings import Affected, Finding, Severity, Status
from gpuwarden.kube.dra import parse_slices, taint_rule
from gpuwarden.remediation.executor import Executor
from gpuwarden.remediation.plan import ClusterState, Options, build

NODE = {"metadata": {"name": "n1", "uid": "node-uid"}, "spec": {}}
UUIDS = ("GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000")


def slices(n=2):
    return parse_slices("n1", "gpu.nvidia.com", [{
        "metadata": {"name": "n1-gpu"},
        "spec": {"nodeName": "n1", "driver": "gpu.nvidia.com", "pool": {"name": "n1", "generation": 1},
                 "devices": [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": UUIDS[i]},
                                                                  "pcieBusID": {"string": f"00000000:{0x3b + i:02X}:00.0"}}}
                             for i in range(n)]}}])


def state(n=2, rules=(), version="v1beta2"):
    return ClusterState(NODE, [], [], slices(n) if n is not None else None, list(rules), version)


def hw(*gpus, status=Status.CONFIRMED, severity=Severity.CRITICAL):
    return Finding("GPU-HW-001", status, severity, "t", "fallen off the bus", family="hardware",
                   affected=[Affected("gpu", g) for g in gpus])


def kinds(plan):
    return [(a.kind, a.target.name) for a in plan.actions]


def test_one_bad_gpu_of_two_is_fenced_by_a_device_taint_rule_not_a_node_taint():
    plan = build([hw(UUIDS[1])], state(), Options())
    assert kinds(plan) == [("taint-device", "gpu.nvidia.com/n1/gpu-1")]
    rule = plan.actions[0].detail["rule"]
    assert rule["apiVersion"] == "resource.k8s.io/v1beta2"
    assert rule["spec"] == {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-1"},
                            "taint": {"key": "gpuwarden.io/unhealthy", "value": "hardware", "effect": "NoSchedule"}}
    assert rule["metadata"]["labels"]["gpuwarden.io/node"] == "n1"
    # named by its PCI address (the kernel's spelling) it is the same device
    assert kinds(build([hw("0000:3c:00")], state(), Options())) == [("taint-device", "gpu.nvidia.com/n1/gpu-1")]


def test_noexecute_only_when_the_operator_asks():
    plan = build([hw(UUIDS[0])], state(), Options(device_taint_effect="NoExecute"))
    assert plan.actions[0].detail["rule"]["spec"]["taint"]["effect"] == "NoExecute"


def test_the_node_is_tainted_as_before_when_the_device_cannot_be_named_exactly():
    node_taint = [("taint-node", "n1")]
    assert kinds(build([hw(UUIDS[0], UUIDS[1])], state(), Options())) == node_taint  # every GPU of the node
    assert kinds(build([hw(UUIDS[0])], state(n=1), Options())) == node_taint  # the only GPU
    assert kinds(build([hw("GPU-unknown")], state(), Options())) == node_taint  # not in the slices
    assert kinds(build([hw()], state(), Options())) == node_taint  # names no GPU
    assert kinds(build([hw(UUIDS[0])], state(n=None), Options())) == node_taint  # not a DRA node (or not read)
    assert kinds(build([hw(UUIDS[0])], state(version=""), Options())) == node_taint  # no DeviceTaintRule served
    both = state()
    both.plugin_pods = [{"metadata": {"name": "nvidia-device-plugin-x", "namespace": "kube-system"}}]
    assert kinds(build([hw(UUIDS[0])], both, Options())) == node_taint  # the device plugin allocates here too
    # not critical, not confirmed: nothing at all
    assert kinds(build([hw(UUIDS[0], severity=Severity.HIGH)], state(), Options())) == []
    assert kinds(build([hw(UUIDS[0], status=Status.AT_RISK)], state(), Options())) == []


def test_guards_hold_for_the_device_fence():
    assert build([hw(UUIDS[0])], state(), Options(node_fault_action="none")).skipped[0].kind == "taint-device"
    opted_out = {"metadata": {"name": "n1", "annotations": {"gpuwarden.io/no-remediation": "true"}}, "spec": {}}
    plan = build([hw(UUIDS[0])], ClusterState(opted_out, [], [], slices(), [], "v1beta2"), Options())
    assert plan.actions == [] and plan.skipped[0].kind == "taint-device"


def existing(i=1):
    r = taint_rule(slices().devices[i].ref, "n1", finding="GPU-HW-001")
    r["metadata"]["uid"] = "rule-uid"
    return r


def test_a_fenced_device_is_not_fenced_twice_and_stays_fenced_while_its_fault_is_raised():
    assert kinds(build([hw(UUIDS[1])], state(rules=[existing()]), Options())) == []
    # not seen in this check, still raised (debouncing its clear): the fence stays
    assert kinds(build([], state(rules=[existing()]), Options(), holding=[hw(UUIDS[1])])) == []


def test_the_fence_is_removed_when_no_raised_finding_names_the_gpu():
    plan = build([], state(rules=[existing()]), Options())
    assert kinds(plan) == [("untaint-device", "gpu.nvidia.com/n1/gpu-1")]
    assert plan.actions[0].target.uid == "rule-uid" and plan.actions[0].code == "GPU-HW-001"
    # another GPU's fault does not keep this one fenced
    assert ("untaint-device", "gpu.nvidia.com/n1/gpu-1") in kinds(build([hw(UUIDS[0])], state(rules=[existing()]), Options()))


class _Cfg:
    node_name, namespace, breaker_configmap = "n1", "gpuwarden", "gpuwarden-breaker"
    cooldown_s, rate_burst, rate_per_hour = 900.0, 3, 6.0


class _NoBreaker:
    def get_configmap(self, ns, name):
        return None


def test_dry_run_prints_the_exact_object_and_writes_nothing():
    out = io.StringIO()
    plan = build([hw(UUIDS[1])], state(), Options())
    outcomes = Executor(_NoBreaker(), _Cfg(), out=out).execute(plan, "dry-run")
    assert [o.result for o in outcomes] == ["dry-run"]
    text = out.getvalue()
    assert "WOULD DO: taint-device device gpu.nvidia.com/n1/gpu-1" in text
    assert '"deviceSelector": {"device": "gpu-1", "driver": "gpu.nvidia.com", "pool": "n1"}' in text
