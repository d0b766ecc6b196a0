"""The API-side DRA verdicts (agent/dra.py), pure: GPU-K8S-020 (slices of a gone plugin),
GPU-K8S-021 (empty slices past the start-up grace), GPU-K8S-022 (a driver taint outliving its
cause). Each with a positive, a negative, and a clearing case; what cannot be read is "unknown".
The same verdicts against the real test API server: tests/k8s/test_dra_api.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.agent.dra import NodeSide, judge, node_side
from gpuwarden.root import HostRoot
from gpuwarden.findings import Evidence, Status
from gpuwarden.kube.dra import DeviceRef, device_health, parse_slices, pci_key
from gpuwarden.parsers.wallclock import format_rfc3339

NOW = 1_800_000_000.0
UUIDS = ("GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000")


def slice_(node="n1", devices=2, generation=1, created=NOW - 3600, taints=None):
    devs = [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": UUIDS[i]},
                                                  "pcieBusID": {"string": f"00000000:{0x3b + i:02X}:00.0"}},
             **({"taints": taints[i]} if taints and taints.get(i) else {})} for i in range(devices)]
    return {"metadata": {"name": f"{node}-gpu.nvidia.com-x", "creationTimestamp": format_rfc3339(created)},
            "spec": {"nodeName": node, "driver": "gpu.nvidia.com", "pool": {"name": node, "generation": generation,
                                                                             "resourceSliceCount": 1},
                     "devices": devs}}


def side(plugin="present", gpus=2, xids=None):
    return NodeSide("gpu.nvidia.com", plugin, [Evidence("/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock", plugin)],
                    {u: "driver" for u in UUIDS[:gpus]}, xids if xids is not None else {})


def verdict(slices, node_side, health=(), stuck=(), now=NOW):
    out = judge(parse_slices("n1", "gpu.nvidia.com", slices), node_side, list(health), list(stuck), now)
    return {f.code: f for f in out.findings}, out.observed


# -- GPU-K8S-020 ----------------------------------------------------------------------------------
@pytest.mark.rule("GPU-K8S-020", "positive")
def test_slices_of_a_gone_plugin_are_confirmed_with_the_stuck_pods():
    pod = {"metadata": {"name": "train-0", "namespace": "ml", "uid": "u1"}}
    ev = {"metadata": {"name": "train-0.1"}, "reason": "FailedPrepareDynamicResources",
          "message": "Failed to prepare dynamic resources: plugin gpu.nvidia.com not found", "count": 4}
    fs, obs = verdict([slice_()], side("absent"), stuck=[(pod, [ev])])
    f = fs["GPU-K8S-020"]
    assert f.status == Status.CONFIRMED and obs["GPU-K8S-020"] == "bad"
    assert ("pod", "train-0", "ml") in {(a.kind, a.name, a.namespace) for a in f.affected}
    assert "2 device(s)" in f.summary and "FailedPrepareDynamicResources" in str(f.evidence)


@pytest.mark.rule("GPU-K8S-020", "negative")
def test_slices_with_a_live_plugin_are_fine_and_unknown_sockets_are_not():
    fs, obs = verdict([slice_()], side("present"))
    assert "GPU-K8S-020" not in fs and obs["GPU-K8S-020"] == "good"
    fs, obs = verdict([slice_()], side("unknown"))
    assert "GPU-K8S-020" not in fs and obs["GPU-K8S-020"] == "unknown"


@pytest.mark.rule("GPU-K8S-020", "clears")
def test_gone_plugin_clears_once_its_slices_are_gone():
    assert verdict([], side("absent"))[1]["GPU-K8S-020"] == "good"


# -- GPU-K8S-021 ----------------------------------------------------------------------------------
@pytest.mark.rule("GPU-K8S-021", "positive")
def test_empty_slices_past_the_grace_are_confirmed():
    fs, obs = verdict([slice_(devices=0)], side())
    assert fs["GPU-K8S-021"].status == Status.CONFIRMED and "2 GPU(s)" in fs["GPU-K8S-021"].summary


@pytest.mark.rule("GPU-K8S-021", "negative")
def test_empty_slices_while_starting_or_on_a_node_without_gpus_are_not():
    assert verdict([slice_(devices=0, created=NOW - 30)], side())[1]["GPU-K8S-021"] == "unknown"
    assert verdict([slice_(devices=0)], side(gpus=0))[1]["GPU-K8S-021"] == "good"
    unread = NodeSide("gpu.nvidia.com", "present", [], None, None)
    assert verdict([slice_(devices=0)], unread)[1]["GPU-K8S-021"] == "unknown"


@pytest.mark.rule("GPU-K8S-021", "clears")
def test_empty_slices_clear_once_republished():
    # an older generation's empty slice no longer counts once the pool's newer generation has devices
    fs, obs = verdict([slice_(devices=0, generation=1), slice_(devices=2, generation=2)], side())
    assert "GPU-K8S-021" not in fs and obs["GPU-K8S-021"] == "good"


# -- GPU-K8S-022 ----------------------------------------------------------------------------------
XID_TAINT = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule", "timeAdded": format_rfc3339(NOW - 3600)}


@pytest.mark.rule("GPU-K8S-022", "positive")
def test_a_driver_taint_on_a_present_quiet_gpu_outlives_its_cause():
    fs, obs = verdict([slice_(taints={0: [XID_TAINT]})], side(xids={UUIDS[0]: [NOW - 7200]}))
    f = fs["GPU-K8S-022"]
    assert f.status == Status.AT_RISK and [a.name for a in f.affected] == [UUIDS[0]]


@pytest.mark.rule("GPU-K8S-022", "negative")
def test_a_taint_whose_cause_persists_is_not_stale():
    # an Xid since the taint, a GPU the node does not show, a young taint, an Unhealthy device: all keep it
    assert "GPU-K8S-022" not in verdict([slice_(taints={0: [XID_TAINT]})], side(xids={UUIDS[0]: [NOW - 60]}))[0]
    gone = NodeSide("gpu.nvidia.com", "present", [], {UUIDS[1]: "driver"}, {})
    assert "GPU-K8S-022" not in verdict([slice_(taints={0: [XID_TAINT]})], gone)[0]
    young = dict(XID_TAINT, timeAdded=format_rfc3339(NOW - 60))
    assert "GPU-K8S-022" not in verdict([slice_(taints={0: [young]})], side())[0]
    pod = {"metadata": {"name": "p", "namespace": "ml", "uid": "u"},
           "status": {"containerStatuses": [{"name": "c", "allocatedResourcesStatus": [
               {"name": "claim:gpu/req", "resources": [{"resourceID": "gpu.nvidia.com/n1/gpu-0", "health": "Unhealthy"}]}]}]}}
    assert "GPU-K8S-022" not in verdict([slice_(taints={0: [XID_TAINT]})], side(), health=device_health([pod]))[0]
    # the driver's informational taint (effect None) fences nothing
    assert "GPU-K8S-022" not in verdict([slice_(taints={0: [dict(XID_TAINT, effect="None")]})], side())[0]


@pytest.mark.rule("GPU-K8S-022", "clears")
def test_a_stale_taint_clears_when_the_plugin_restarts_and_drops_it():
    assert verdict([slice_()], side())[1]["GPU-K8S-022"] == "good"
    no_log = NodeSide("gpu.nvidia.com", "present", [], {u: "driver" for u in UUIDS}, None)
    assert verdict([slice_(taints={0: [XID_TAINT]})], no_log)[1]["GPU-K8S-022"] == "unknown"


def test_the_plugin_is_gone_only_where_the_kubelets_registry_is_and_its_sockets_are_not(tmp_path):
    class NoFacts:
        def maybe(self, name):
            return None

    root = HostRoot(str(tmp_path))
    assert node_side(root, NoFacts(), "gpu.nvidia.com").plugin == "unknown"  # another kubelet root dir?
    (tmp_path / "var/lib/kubelet/plugins_registry").mkdir(parents=True)
    got = node_side(root, NoFacts(), "gpu.nvidia.com")
    assert got.plugin == "absent" and got.gpus is None and got.xid_times is None
    (tmp_path / "var/lib/kubelet/plugins/gpu.nvidia.com").mkdir(parents=True)
    (tmp_path / "var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock").touch()
    assert node_side(root, NoFacts(), "gpu.nvidia.com").plugin == "present"


# -- parsing --------------------------------------------------------------------------------------
def test_health_and_references_parse_and_garbage_is_skipped():
    assert DeviceRef.parse("gpu.nvidia.com/pool/with/slash/gpu-1") == DeviceRef("gpu.nvidia.com", "pool/with/slash", "gpu-1")
    assert DeviceRef.parse("nvidia.com/gpu") is None and DeviceRef.parse("") is None
    assert pci_key("00000000:3B:00.0") == pci_key("PCI:0000:3b:00") == "0000:3b:00" and pci_key("x") == ""
    sl = parse_slices("n1", "gpu.nvidia.com", [slice_(), None, {"spec": "x"}, {"spec": {"devices": [1, {"name": ""}]}}])
    assert [d.ref.device for d in sl.devices] == ["gpu-0", "gpu-1"] and sl.devices[0].pci == "0000:3b:00"


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(
                        ["spec", "devices", "name", "pool", "generation", "taints", "key", "timeAdded", "effect",
                         "metadata", "status", "containerStatuses", "allocatedResourcesStatus", "resources",
                         "resourceID", "health", "attributes", "uuid", "string"]), c, max_size=4), max_leaves=25))
def test_garbage_objects_never_raise_and_never_confirm(obj):
    sl = parse_slices("n1", "gpu.nvidia.com", [obj] if not isinstance(obj, list) else obj)
    health = device_health([obj] if isinstance(obj, dict) else [])
    out = judge(sl, side(), health, [], NOW)
    assert all(f.code != "GPU-K8S-020" for f in out.findings)  # the plugin is present
