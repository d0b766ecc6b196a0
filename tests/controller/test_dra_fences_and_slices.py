"""The controller's DRA judgements (controller/dra.py), pure: which DeviceTaintRules are gpuwarden's,
which outlived their node or agent, which ResourceSlices advertise a dead node's devices, and a node's
advertised devices against its usable GPUs. Positive, negative, clearing, and Hypothesis garbage that
never raises. Against the real test API server: tests/k8s/test_controller_dra.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.controller import dra
from gpuwarden.kube import dra as kdra
from gpuwarden.parsers.wallclock import format_rfc3339

NOW = 1_800_000_000.0
DRIVER = "gpu.nvidia.com"
UUIDS = ("GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000")


def rule(node="n1", device="gpu-1", created=NOW - 7200):
    r = kdra.taint_rule(kdra.DeviceRef(DRIVER, node, device), node)
    r["metadata"].update(uid=f"uid-{node}-{device}", creationTimestamp=format_rfc3339(created))
    return r


def node(name="n1", heartbeat=NOW - 60, ready="True", since=NOW - 86400):
    conds = [{"type": "Ready", "status": ready, "reason": "KubeletReady", "lastTransitionTime": format_rfc3339(since)}]
    if heartbeat is not None:
        conds.append({"type": "GPUDeviceAccess", "status": "False", "lastHeartbeatTime": format_rfc3339(heartbeat)})
    return {"metadata": {"name": name}, "status": {"conditions": conds}}


def slice_(node="n1", devices=2, taints=None):
    return {"metadata": {"name": f"{node}-slice"},
            "spec": {"nodeName": node, "driver": DRIVER, "pool": {"name": node, "generation": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": UUIDS[i]},
                                                                     "pcieBusID": {"string": f"0000:{0x3b + i:02x}:00.0"}},
                                  **({"taints": taints} if taints and i == 1 else {})} for i in range(devices)]}}


def test_ours_only_by_labels_name_and_annotation():
    assert dra.owned_node(rule()) == "n1"
    r = rule()
    r["metadata"]["name"] = "repair-gpu-1"  # our labels, another name: an operator's copy
    assert dra.owned_node(r) is None
    r = rule()
    del r["metadata"]["annotations"][kdra.DEVICE_ANNOTATION]
    assert dra.owned_node(r) is None
    r = rule()
    r["metadata"]["labels"][kdra.MANAGED_LABEL] = "someone-else"
    assert dra.owned_node(r) is None
    r = rule()
    del r["spec"]["deviceSelector"]["device"]  # a pool-wide rule is never one of ours
    assert dra.owned_node(r) is None


def test_orphans_gone_node_silent_agent_and_not_young_rules():
    nodes = {"n1": node("n1"), "n2": node("n2", heartbeat=NOW - 1801), "n3": node("n3", heartbeat=None)}
    rules = [rule("n1"), rule("n2"), rule("n3"), rule("gone"), rule("n2", "gpu-0", created=NOW - 100)]
    got = {(o.node, o.gone) for o in dra.orphan_fences(rules, nodes, NOW, 1800)}
    assert got == {("n2", False), ("n3", False), ("gone", True)}  # n1 reports; n2's young rule waits
    # clears: the agent reports again
    nodes["n2"] = node("n2", heartbeat=NOW)
    assert ("n2", False) not in {(o.node, o.gone) for o in dra.orphan_fences(rules, nodes, NOW, 1800)}


def test_stale_slices_of_a_notready_or_gone_node_only():
    sl = dra.by_node([slice_("n1"), slice_("n2"), slice_("n3"), slice_("gone"), slice_("empty", devices=0)], DRIVER)
    nodes = {"n1": node("n1"), "n2": node("n2", ready="Unknown", since=NOW - 601),
             "n3": node("n3", ready="False", since=NOW - 10), "empty": node("empty", ready="False", since=0)}
    got = {(s.node, s.gone) for s in dra.stale_slices(sl, nodes, NOW, 600)}
    assert got == {("n2", False), ("gone", True)}
    nodes["n2"] = node("n2")
    assert {s.node for s in dra.stale_slices(sl, nodes, NOW, 600)} == {"gone"}


def test_device_count_lost_gpu_offered_until_fenced():
    ns = dra.by_node([slice_("n1")], DRIVER)["n1"]
    lost = [{"uuid": "", "busId": "00000000:3C:00.0"}]  # NVML's spelling of gpu-1's bus id
    c = dra.device_count(ns, lost)
    assert (c.advertised, c.fenced, c.lost, c.usable, c.offered_lost) == (2, 0, 1, 1, [f"{DRIVER}/n1/gpu-1"])
    assert dra.device_count(ns, lost, [rule("n1", "gpu-1")]).to_json()["overcounted"] is False
    tainted = dra.by_node([slice_("n1", taints=[{"key": "gpu.nvidia.com/xid", "effect": "NoSchedule"}])], DRIVER)["n1"]
    assert dra.device_count(tainted, lost).offered_lost == []
    none_effect = dra.by_node([slice_("n1", taints=[{"key": "k", "effect": "None"}])], DRIVER)["n1"]
    assert dra.device_count(none_effect, lost).offered_lost == [f"{DRIVER}/n1/gpu-1"]
    assert dra.device_count(ns, []).to_json() == {"advertised": 2, "fenced": 0, "lost": 0, "usable": 2,
                                                  "offeredLost": [], "overcounted": False}


_garbage = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                        lambda c: st.lists(c, max_size=3) | st.dictionaries(
                            st.sampled_from(["metadata", "spec", "name", "labels", "annotations", "deviceSelector",
                                             "nodeName", "devices", "pool", "status", "conditions", "taint",
                                             kdra.NODE_LABEL, kdra.MANAGED_LABEL, "creationTimestamp"]), c, max_size=4),
                        max_leaves=12)


def test_garbage_node_conditions_never_raise():
    bad = {"n1": {"status": {"conditions": [1, None, {"type": "Ready", "status": "False", "lastTransitionTime": 5}]}}}
    assert [o.node for o in dra.orphan_fences([rule()], bad, NOW, 600)] == ["n1"]  # no agent report read
    assert dra.stale_slices(dra.by_node([slice_()], DRIVER), bad, NOW, 600) == []  # no time: not judged


@settings(max_examples=200, deadline=None)
@given(st.lists(_garbage, max_size=4), st.lists(_garbage, max_size=4))
def test_garbage_objects_never_raise(objs, nodes):
    node_map = {str(i): n for i, n in enumerate(nodes) if isinstance(n, dict)}
    assert dra.orphan_fences(objs, node_map, NOW, 600) == []  # none of them is ours
    sl = dra.by_node(objs, DRIVER)
    dra.stale_slices(sl, node_map, NOW, 600)
    for ns in sl.values():
        dra.device_count(ns, [{"uuid": "x"}], objs)
