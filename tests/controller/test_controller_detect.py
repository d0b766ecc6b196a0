"""Cascade and storm detection as a pure function of observed state and time (no API server)."""

from __future__ import annotations

import dataclasses

import pytest

from gpuwarden.controller.config import ControllerConfig
from gpuwarden.controller.detect import FleetHistory, detect
from gpuwarden.controller.model import WorkloadRef, node_signals, resolve_workload
from tests.controller.objects import T0, node, node_event, pod, replicaset


def cfg(**kw) -> ControllerConfig:
    return dataclasses.replace(ControllerConfig(namespace="gpuwarden", identity="t", agent_namespace="gpuwarden"), **kw)


RS = {("ReplicaSet", "ml", "trainer-5d8f"): replicaset("trainer-5d8f", "trainer")}
TRAINER = WorkloadRef("Deployment", "ml", "trainer")


class World:
    """Plays the cluster: nodes, pods and events at a time; observes and detects like the controller."""

    def __init__(self, c: ControllerConfig | None = None, names=("gpu-a", "gpu-b", "gpu-c")) -> None:
        self.cfg = c or cfg()
        self.nodes = {n: node(n) for n in names}
        self.pods: dict[str, dict] = {}
        self.events: list[dict] = []
        self.h = FleetHistory()
        self.owners = dict(RS)

    def fail(self, name: str, at: float, **kw) -> None:
        self.nodes[name] = node(name, ready="Unknown", ready_at=at, **kw)

    def look(self, now: float):
        self.h.observe(self.nodes.values(), self.pods.values(), self.events, now, self.cfg)
        self.h.resolve({k: self.owners.get(k) for k in self.h.unresolved()})
        return detect(self.h, now, self.cfg)


def incident(w: World, t: float = T0, gap: float = 400.0, gpus: int = 1) -> list:
    """Incident 4: the trainer's pod kills gpu-a, is moved to gpu-b, kills it, ... Returns each step's detection."""
    out = []
    w.pods["p1"] = pod("trainer-5d8f-aaaaa", "gpu-a", t - 3600, gpus=gpus)
    out.append(w.look(t))  # healthy
    w.fail("gpu-a", t + 60)
    out.append(w.look(t + 70))  # the first failure
    # the node lifecycle controller evicts after 5 minutes; the ReplicaSet's replacement lands on gpu-b
    del w.pods["p1"]
    w.pods["p2"] = pod("trainer-5d8f-bbbbb", "gpu-b", t + 360, gpus=gpus)
    out.append(w.look(t + 365))
    w.fail("gpu-b", t + 60 + gap)
    out.append(w.look(t + 70 + gap))  # the second failure: the signal
    return out


def test_first_failure_is_not_a_signal_the_second_is():
    w = World()
    healthy, first, moved, second = incident(w)
    assert not healthy.cascades and not first.cascades and not moved.cascades
    assert len(second.cascades) == 1
    c = second.cascades[0]
    assert c.workload == TRAINER
    assert c.nodes == ["gpu-a", "gpu-b"]
    assert [ln.pod for ln in c.links] == ["ml/trainer-5d8f-aaaaa", "ml/trainer-5d8f-bbbbb"]
    assert c.links[1].hopped is True and c.links[0].hopped is None
    assert c.links[0].signals == ["Ready=Unknown (NodeStatusUnknown)"]
    text = c.summary()
    assert "gpu-a failed" in text and "gpu-b failed" in text and "after gpu-a failed" in text
    assert c.to_json()["chain"][1]["pod"] == "ml/trainer-5d8f-bbbbb"


def test_reported_once_then_again_when_the_chain_grows():
    w = World()
    second = incident(w)[-1]
    w.h.mark_reported(second.cascades[0])
    assert not w.look(T0 + 500).cascades
    del w.pods["p2"]
    w.pods["p3"] = pod("trainer-5d8f-ccccc", "gpu-c", T0 + 800)
    assert not w.look(T0 + 805).cascades
    w.fail("gpu-c", T0 + 900)
    third = w.look(T0 + 905)
    assert [c.nodes for c in third.cascades] == [["gpu-a", "gpu-b", "gpu-c"]]


def test_three_nodes_needed_when_configured():
    w = World(cfg(cascade_nodes=3))
    assert not incident(w)[-1].cascades


def test_no_hop_no_cascade_unless_hops_are_not_required():
    for require_hop, expected in ((True, 0), (False, 1)):
        w = World(cfg(require_hop=require_hop, storm_nodes=0, storm_fraction=0))
        # two replicas placed long before either node failed: nothing moved
        w.pods["p1"] = pod("trainer-5d8f-aaaaa", "gpu-a", T0 - 3600)
        w.pods["p2"] = pod("trainer-5d8f-bbbbb", "gpu-b", T0 - 3600)
        w.look(T0)
        w.fail("gpu-a", T0 + 60)
        w.look(T0 + 70)
        w.fail("gpu-b", T0 + 200)
        det = w.look(T0 + 210)
        assert len(det.cascades) == expected, require_hop


def test_failures_farther_apart_than_the_window_are_no_cascade():
    w = World(cfg(window_s=300))
    assert not incident(w, gap=400)[-1].cascades
    w = World(cfg(window_s=600))
    assert incident(w, gap=400)[-1].cascades


def test_a_pod_that_arrived_after_the_node_failed_was_not_there():
    w = World()
    w.fail("gpu-a", T0)
    w.pods["p1"] = pod("trainer-5d8f-aaaaa", "gpu-a", T0 + 120)  # bound later (cannot be the cause)
    w.look(T0 + 130)
    del w.pods["p1"]
    w.pods["p2"] = pod("trainer-5d8f-bbbbb", "gpu-b", T0 + 200)
    w.look(T0 + 205)
    w.fail("gpu-b", T0 + 300)
    assert not w.look(T0 + 305).cascades


@pytest.mark.parametrize("mutate,why", [
    (lambda p: p["spec"]["containers"][0].update(resources={}), "no GPU request"),
    (lambda p: p["metadata"].update(namespace="kube-system"), "skipped namespace"),
    (lambda p: p["metadata"].update(ownerReferences=[{"kind": "DaemonSet", "name": "ds", "controller": True}]),
     "DaemonSet"),
    (lambda p: p["metadata"]["annotations"].update({"gpuwarden.io/no-remediation": "true"}), "opted out"),
    (lambda p: p["metadata"]["annotations"].update({"kubernetes.io/config.mirror": "x"}), "static pod"),
])
def test_never_a_culprit(mutate, why):
    w = World()
    orig = pod

    def mk(*a, **kw):
        p = orig(*a, **kw)
        mutate(p)
        return p

    w.pods["p1"] = mk("trainer-5d8f-aaaaa", "gpu-a", T0 - 3600)
    w.look(T0)
    w.fail("gpu-a", T0 + 60)
    w.look(T0 + 70)
    del w.pods["p1"]
    w.pods["p2"] = mk("trainer-5d8f-bbbbb", "gpu-b", T0 + 360)
    w.look(T0 + 365)
    w.fail("gpu-b", T0 + 460)
    assert not w.look(T0 + 470).cascades, why


def test_non_gpu_workloads_count_when_asked():
    assert not incident(World(), gpus=0)[-1].cascades
    assert incident(World(cfg(gpu_workloads_only=False)), gpus=0)[-1].cascades


def test_the_same_node_twice_is_no_chain():
    w = World()
    w.pods["p1"] = pod("trainer-5d8f-aaaaa", "gpu-a", T0 - 3600)
    w.look(T0)
    w.fail("gpu-a", T0 + 60)
    w.look(T0 + 70)
    w.nodes["gpu-a"] = node("gpu-a")  # recovers
    w.look(T0 + 200)
    del w.pods["p1"]
    w.pods["p2"] = pod("trainer-5d8f-bbbbb", "gpu-a", T0 + 300)
    w.look(T0 + 305)
    w.fail("gpu-a", T0 + 400)
    assert not w.look(T0 + 405).cascades


def test_driver_and_memory_findings_count_as_failures_device_access_does_not():
    base = cfg()
    for conds, expected in (
        ({"GPUUnchargedMemory": ("True", T0 + 460, "GpuNode001", "31 GiB uncharged")}, True),
        ({"GPUDriver": ("True", T0 + 460, "GpuDrv006", "nvidia-smi hangs")}, True),
        ({"GPUDeviceAccess": ("True", T0 + 460, "GpuDev001", "uvm missing")}, False),
    ):
        w = World(base)
        w.pods["p1"] = pod("trainer-5d8f-aaaaa", "gpu-a", T0 - 3600)
        w.look(T0)
        w.fail("gpu-a", T0 + 60)
        w.look(T0 + 70)
        del w.pods["p1"]
        w.pods["p2"] = pod("trainer-5d8f-bbbbb", "gpu-b", T0 + 360)
        w.look(T0 + 365)
        w.nodes["gpu-b"] = node("gpu-b", conds=conds)  # still Ready: the agent saw it first
        det = w.look(T0 + 470)
        assert bool(det.cascades) is expected, conds
        if expected:
            assert any("=True" in s for s in det.cascades[0].links[1].signals)


def test_agent_events_count_until_cleared_or_stale():
    n = node("gpu-b")
    c = cfg()
    ev = node_event("gpu-b", "GpuNode001", T0, T0 + 30, message="GPU-NODE-001: 31 GiB uncharged")
    sigs = node_signals(n, [ev], T0 + 60, c.bad_conditions, c.event_codes, c.event_hold_s)
    assert [s.what for s in sigs] == ["event GPU-NODE-001"] and sigs[0].at == T0
    # cleared by the agent
    cleared = node_event("gpu-b", "GpuNode001Cleared", T0 + 40, etype="Normal")
    assert not node_signals(n, [ev, cleared], T0 + 60, c.bad_conditions, c.event_codes, c.event_hold_s)
    # too old
    assert not node_signals(n, [ev], T0 + 30 + c.event_hold_s + 1, c.bad_conditions, c.event_codes, c.event_hold_s)
    # a device-access finding is not a node failure; a Normal event neither
    other = node_event("gpu-b", "GpuDev001", T0)
    normal = node_event("gpu-b", "GpuDrv001", T0, etype="Normal")
    assert not node_signals(n, [other, normal], T0 + 60, c.bad_conditions, c.event_codes, c.event_hold_s)


def test_a_node_without_a_ready_condition_is_not_failed():
    n = node("gpu-new", ready=None)
    c = cfg()
    assert not node_signals(n, [], T0, c.bad_conditions, c.event_codes, c.event_hold_s)


def test_storm_needs_both_count_and_fraction():
    c = cfg(storm_nodes=3, storm_fraction=0.3, storm_window_s=600)
    w = World(c, names=[f"gpu-{i}" for i in range(10)])
    w.look(T0)
    w.fail("gpu-0", T0 + 10)
    w.fail("gpu-1", T0 + 20)
    det = w.look(T0 + 30)
    assert det.storm is None  # 2 of 10
    w.fail("gpu-2", T0 + 40)
    det = w.look(T0 + 50)
    assert det.storm is not None and det.storm_new  # 3 of 10 = 30 %
    assert [n for n, _, _ in det.storm.nodes] == ["gpu-0", "gpu-1", "gpu-2"] and det.storm.total == 10
    assert "3 of 10 GPU nodes" in det.storm.summary()
    w.h.note_storm(det, T0 + 50)
    det = w.look(T0 + 60)
    assert det.storm is not None and not det.storm_new  # reported once
    w.h.note_storm(det, T0 + 60)
    det = w.look(T0 + 700)  # the window has passed
    assert det.storm is None
    w.h.note_storm(det, T0 + 700)
    assert w.h.storm_since is None


def test_storm_fraction_dominates_in_a_large_pool():
    c = cfg(storm_nodes=3, storm_fraction=0.3)
    w = World(c, names=[f"gpu-{i:02}" for i in range(20)])
    w.look(T0)
    for i in range(5):
        w.fail(f"gpu-{i:02}", T0 + i)
    assert w.look(T0 + 10).storm is None  # 5 of 20 < 30 %
    w.fail("gpu-05", T0 + 6)
    assert w.look(T0 + 10).storm is not None  # 6 of 20


def test_history_survives_a_leader_change():
    """The first hop was seen by the old leader only; the new one detects the cascade at the second."""
    w = World()
    w.pods["p1"] = pod("trainer-5d8f-aaaaa", "gpu-a", T0 - 3600)
    w.look(T0)
    w.fail("gpu-a", T0 + 60)
    w.look(T0 + 70)
    state = w.h.to_json()
    # the old leader dies; the pod is moved; a new leader starts from the Lease's state
    w2 = World()
    w2.nodes = w.nodes
    w2.pods = {"p2": pod("trainer-5d8f-bbbbb", "gpu-b", T0 + 360)}
    w2.h.merge(FleetHistory.from_json(state))
    assert not w2.look(T0 + 365).cascades
    w2.fail("gpu-b", T0 + 460)
    det = w2.look(T0 + 470)
    assert [c.nodes for c in det.cascades] == [["gpu-a", "gpu-b"]]
    # what was reported travels too
    w2.h.mark_reported(det.cascades[0])
    w3 = World()
    w3.nodes, w3.pods = w2.nodes, w2.pods
    w3.h.merge(FleetHistory.from_json(w2.h.to_json()))
    assert not w3.look(T0 + 480).cascades
    assert FleetHistory.from_json("not json").episodes == []


def test_owner_chain():
    p = pod("trainer-5d8f-aaaaa", "gpu-a", T0)
    assert resolve_workload(p, RS) == TRAINER
    # the ReplicaSet could not be read: the pod-template-hash names the Deployment
    assert resolve_workload(p, {("ReplicaSet", "ml", "trainer-5d8f"): None}) == TRAINER
    # a ReplicaSet of its own
    assert resolve_workload(p, {("ReplicaSet", "ml", "trainer-5d8f"): replicaset("trainer-5d8f", None)}) == \
        WorkloadRef("ReplicaSet", "ml", "trainer-5d8f")
    job_pod = pod("nightly-29000-x", "gpu-a", T0, owner=("Job", "nightly-29000"), labels={})
    job = {"metadata": {"name": "nightly-29000", "namespace": "ml",
                        "ownerReferences": [{"kind": "CronJob", "name": "nightly", "controller": True}]}}
    assert resolve_workload(job_pod, {("Job", "ml", "nightly-29000"): job}) == WorkloadRef("CronJob", "ml", "nightly")
    assert resolve_workload(job_pod, {}) == WorkloadRef("Job", "ml", "nightly-29000")
    sts = pod("db-0", "gpu-a", T0, owner=("StatefulSet", "db"))
    assert resolve_workload(sts, {}) == WorkloadRef("StatefulSet", "ml", "db")
    bare = pod("lonely", "gpu-a", T0, owner=None)
    assert resolve_workload(bare, {}) == WorkloadRef("Pod", "ml", "lonely")


def test_workload_ref_parse():
    assert WorkloadRef.parse("deployment/ml/trainer") == TRAINER
    assert WorkloadRef.parse("deploy/trainer", "ml") == TRAINER
    assert WorkloadRef.parse("job/ml/burn-in").path == "/apis/batch/v1/namespaces/ml/jobs/burn-in"
    assert WorkloadRef.parse("sts/ml/db").key == "statefulset/ml/db"
    # a custom resource's workload can hold the pool taint: it parses to the same key
    assert WorkloadRef.parse("PyTorchJob/ml/llm").key == WorkloadRef("PyTorchJob", "ml", "llm").key
    for bad in ("trainer", "deployment//x", "a/b/c/d"):
        with pytest.raises(ValueError):
            WorkloadRef.parse(bad)


def _acted(pod_name: str, node_name: str, at: float, created: float, uid: str, action: str = "evict-pod-for-memory"):
    """The agent's action Event about a pod it removed for memory (remediation/executor.py)."""
    from gpuwarden.parsers.wallclock import format_rfc3339

    return {"metadata": {"name": f"{pod_name}.1", "namespace": "ml", "annotations": {
                "gpuwarden.io/node": node_name, "gpuwarden.io/owner-kind": "ReplicaSet",
                "gpuwarden.io/owner-name": "trainer-5d8f", "gpuwarden.io/pod-created": format_rfc3339(created)}},
            "involvedObject": {"kind": "Pod", "namespace": "ml", "name": pod_name, "uid": uid},
            "related": {"kind": "Node", "name": node_name}, "type": "Normal", "reason": "EvictedPod",
            "action": action, "reportingComponent": "gpuwarden", "source": {"component": "gpuwarden"},
            "firstTimestamp": format_rfc3339(at), "lastTimestamp": format_rfc3339(at), "message": "GPU-NODE-001: evicted"}


def _acted_on_node(pod_name: str, node_name: str, at: float, created: float, uid: str, claimed: str = ""):
    """The same Event as an agent writes it now: about its Node (the chart's policy checks that Node
    against the agent's token), the pod as `related`; `claimed`: an annotation naming another node."""
    ev = _acted(pod_name, node_name, at, created, uid)
    ev["involvedObject"], ev["related"] = {"kind": "Node", "name": node_name}, ev["involvedObject"]
    ev["metadata"]["namespace"] = "default"
    if claimed:
        ev["metadata"]["annotations"]["gpuwarden.io/node"] = claimed
    return ev


def test_action_events_on_the_node_lead_to_the_workload_and_the_node_is_the_involved_one():
    w = World()
    w.events.append(_acted_on_node("trainer-5d8f-aaaaa", "gpu-a", T0, T0 - 3600, "u-a"))
    assert w.look(T0 + 10).cascades == []
    # the annotation names gpu-a, but the Event is about gpu-b: gpu-b's agent acted there
    w.events.append(_acted_on_node("trainer-5d8f-bbbbb", "gpu-b", T0 + 400, T0 + 60, "u-b", claimed="gpu-a"))
    [c] = w.look(T0 + 410).cascades
    assert [(lk.node, lk.pod) for lk in c.links] == [("gpu-a", "ml/trainer-5d8f-aaaaa"), ("gpu-b", "ml/trainer-5d8f-bbbbb")]


@pytest.mark.parametrize("action", ["evict-pod-for-memory", "kill-pod-processes"])
def test_pods_our_agents_removed_early_still_lead_to_their_workload(action):
    """Incident 4 caught early: each node's agent evicts the escaping pod within seconds, before the
    controller ever lists it and before any node condition is seen. The action Events alone name the
    node, the pod and its owner, so the hop from node to node is still a cascade of the Deployment."""
    w = World()
    w.events.append(_acted("trainer-5d8f-aaaaa", "gpu-a", T0, T0 - 3600, "u-a", action))
    assert w.look(T0 + 10).cascades == []
    w.events.append(_acted("trainer-5d8f-bbbbb", "gpu-b", T0 + 400, T0 + 60, "u-b", action))
    det = w.look(T0 + 410)
    [c] = det.cascades
    assert c.workload == TRAINER
    assert [(lk.node, lk.pod, lk.hopped) for lk in c.links] == [("gpu-a", "ml/trainer-5d8f-aaaaa", None),
                                                                 ("gpu-b", "ml/trainer-5d8f-bbbbb", True)]


def test_other_pod_events_are_not_failures():
    w = World()
    ev = _acted("trainer-5d8f-aaaaa", "gpu-a", T0, T0 - 3600, "u-a", action="delete-pod")
    w.events.append(ev)
    assert w.look(T0 + 10).cascades == [] and not w.h.episodes
