"""Incident 4 against the real test API server: the controller quarantines the workload that hops
from node to node, at the second failed node, and `gpuwarden release` restores it."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gpuwarden.cli import main
from gpuwarden.remediation.breaker import check
from tests.k8s.controller_world import Cluster

pytestmark = pytest.mark.apiserver


def play_incident(c: Cluster, ctl, third: bool = False) -> list:
    """Each step's decisions: healthy, first failure, pod moved, second failure (, moved, third failure)."""
    a, b, cc = c.nodes[:3]
    steps = []
    p1 = c.run_pod(a)
    steps.append(ctl.step())
    c.node_fails(a, "False")  # the kubelet, starved of memory, reports NotReady ...
    steps.append(ctl.step())
    c.evict(p1)  # ... the node lifecycle controller evicts the pod, the scheduler binds its replacement
    p2 = c.run_pod(b)
    steps.append(ctl.step())
    c.node_fails(b)  # the next node dies too: its kubelet stops posting status
    steps.append(ctl.step())
    if third:
        c.evict(p2)
        c.run_pod(cc)
        steps.append(ctl.step())
        c.node_fails(cc)
        steps.append(ctl.step())
    return steps


def test_quarantine_at_the_second_node_then_release(k8s):
    c = Cluster(k8s)
    c.deployment("trainer", replicas=3)
    ctl = c.controller(execute=True)
    healthy, first, moved, second = play_incident(c, ctl)
    assert healthy == [] and first == [] and moved == []
    # nothing was touched after the first failure (checked through the API, not the return values)
    assert [d.kind for d in second] == ["cascade"]
    dep = c.deployment_obj()
    assert dep.spec.replicas == 0
    rec = c.annotation(dep)
    assert rec["undo"] == {"kind": "Deployment", "replicas": 3}
    assert rec["nodes"] == c.nodes[:2]
    assert [ln["node"] for ln in rec["chain"]] == c.nodes[:2]
    assert all(ln["pod"].startswith(f"{c.ns}/trainer-7d9c5b-") for ln in rec["chain"])
    assert rec["chain"][0]["signals"] == ["Ready=False (KubeletNotReady)"]
    assert rec["chain"][1]["signals"] == ["Ready=Unknown (NodeStatusUnknown)"] and rec["chain"][1]["hopped"]
    (ev,) = c.events("WorkloadQuarantined")
    assert ev.type == "Warning" and ev.involved_object.kind == "Deployment" and ev.involved_object.name == "trainer"
    assert ev.reporting_component == "gpuwarden" and ev.action == "quarantine"
    msg = ev.message
    assert msg.startswith("scale deployment") and "from 3 to 0" in msg
    assert f"Undo: gpuwarden release deployment/{c.ns}/trainer" in msg
    assert c.nodes[0] in msg and c.nodes[1] in msg and rec["chain"][1]["pod"] in msg
    assert c.events("CascadeDetected") == []

    # idempotent: the next passes neither act nor repeat the Event
    assert ctl.step() == [] and ctl.step() == []
    assert len(c.events("WorkloadQuarantined")) == 1

    # the on-call view
    kc = k8s.server.kubeconfig_path
    r = CliRunner().invoke(main, ["fleet", "--kubeconfig", kc, "--gpuwarden-namespace", c.gw, "-l", c.selector,
                                  "--format", "json"])
    assert r.exit_code == 0, r.output
    view = json.loads(r.output)
    assert [n["name"] for n in view["nodes"]][:2] == [c.nodes[0], c.nodes[1]]  # failing first (then by name)
    assert [n["state"] for n in view["nodes"]] == ["failing", "failing", "ok"]
    assert any(q["workload"] == f"deployment/{c.ns}/trainer" for q in view["quarantined"])
    assert view["controller"]["leader"] == "ctl-a" and view["controller"]["current"] is True
    assert any(d["reason"] == "WorkloadQuarantined" for d in view["decisions"])
    r = CliRunner().invoke(main, ["fleet", "--kubeconfig", kc, "--gpuwarden-namespace", c.gw, "-l", c.selector])
    assert r.exit_code == 0 and "QUARANTINED WORKLOADS" in r.output and "leader ctl-a" in r.output

    # release: dry run first, then for real
    args = ["release", f"deployment/{c.ns}/trainer", "--kubeconfig", kc, "--gpuwarden-namespace", c.gw]
    r = CliRunner().invoke(main, args + ["--dry-run"])
    assert r.exit_code == 0 and "[dry-run] would scale deployment" in r.output
    assert c.deployment_obj().spec.replicas == 0
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "back to 3" in r.output
    dep = c.deployment_obj()
    assert dep.spec.replicas == 3 and c.annotation(dep) is None
    assert c.annotation(dep, "gpuwarden.io/quarantine-released")["restored"]["replicas"] == 3
    assert len(c.events("QuarantineReleased")) == 1
    # a second release has nothing to undo
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and "not quarantined" in r.output
    # and the controller does not re-quarantine for the chain it already acted on
    assert ctl.step() == []
    assert c.deployment_obj().spec.replicas == 3


def test_dry_run_reports_and_changes_nothing(k8s):
    c = Cluster(k8s)
    c.deployment("trainer", replicas=3)
    ctl = c.controller(storm_nodes=0, storm_fraction=0)  # the default: dry run (no storm: 3 of 3 nodes fail)
    steps = play_incident(c, ctl, third=True)
    # the second node, then again when the chain grows to three
    assert [[d.kind for d in s] for s in steps] == [[], [], [], ["cascade"], [], ["cascade"]]
    dep = c.deployment_obj()
    assert dep.spec.replicas == 3 and c.annotation(dep) is None
    evs = sorted(c.events("CascadeDetected"), key=lambda e: e.metadata.creation_timestamp)
    assert len(evs) == 2 and c.events("WorkloadQuarantined") == []
    assert evs[0].message.startswith("Dry run: would scale deployment")
    assert "(the controller acts with --execute)" in evs[0].message
    assert "3 GPU nodes" in evs[1].message and all(n in evs[1].message for n in c.nodes)


def test_job_suspended_and_pool_tainted_then_released(k8s):
    c = Cluster(k8s)
    c.job("render")
    ctl = c.controller(execute=True, actions=["workload", "taint"])
    assert [len(s) for s in play_incident(c, ctl)] == [0, 0, 0, 1]
    job = c.batch.read_namespaced_job("render", c.ns)
    assert job.spec.suspend is True
    rec = c.annotation(job)
    assert rec["undo"]["kind"] == "Job" and rec["undo"]["suspend"] is False
    assert rec["undo"]["taint"] == {"key": "gpuwarden.io/quarantine", "value": "cascade", "effect": "NoSchedule"}
    for n in c.nodes:
        node = c.v1.read_node(n)
        assert [(t.key, t.value, t.effect) for t in node.spec.taints or []] == \
            [("gpuwarden.io/quarantine", "cascade", "NoSchedule")], n
        assert json.loads(node.metadata.annotations["gpuwarden.io/quarantine-holders"]) == [f"job/{c.ns}/render"]
    (ev,) = c.events("WorkloadQuarantined")
    assert "taint 3 GPU node(s) gpuwarden.io/quarantine=cascade:NoSchedule" in ev.message
    assert "suspend job" in ev.message

    r = CliRunner().invoke(main, ["release", f"job/{c.ns}/render", "--kubeconfig", k8s.server.kubeconfig_path,
                                  "--gpuwarden-namespace", c.gw])
    assert r.exit_code == 0, r.output
    assert c.batch.read_namespaced_job("render", c.ns).spec.suspend is False
    for n in c.nodes:
        node = c.v1.read_node(n)
        assert not node.spec.taints and "gpuwarden.io/quarantine-holders" not in (node.metadata.annotations or {})


def test_release_refuses_a_workload_changed_since(k8s):
    c = Cluster(k8s)
    c.deployment("trainer", replicas=2)
    play_incident(c, c.controller(execute=True))
    assert c.deployment_obj().spec.replicas == 0
    c.apps.patch_namespaced_deployment("trainer", c.ns, {"spec": {"replicas": 5}})  # someone scaled it meanwhile
    args = ["release", "deploy/trainer", "-n", c.ns, "--kubeconfig", k8s.server.kubeconfig_path,
            "--gpuwarden-namespace", c.gw]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and "replicas=5" in r.output
    r = CliRunner().invoke(main, args + ["--force"])
    assert r.exit_code == 0
    dep = c.deployment_obj()
    assert dep.spec.replicas == 5 and c.annotation(dep) is None


@pytest.mark.parametrize("execute", [False, True])
def test_storm_opens_the_agents_breaker(k8s, execute):
    c = Cluster(k8s, n_nodes=5)
    ctl = c.controller(execute=execute, storm_nodes=3, storm_fraction=0.5)
    kube = ctl.kube
    assert ctl.step() == []
    c.node_fails(c.nodes[0])
    c.node_fails(c.nodes[1], "False")
    assert ctl.step() == []  # 2 of 5: not yet
    assert kube.get_configmap(c.gw, "gpuwarden-breaker") is None
    c.node_fails(c.nodes[2])
    (d,) = ctl.step()  # 3 of 5: a storm
    assert d.kind == "storm"
    (ev,) = c.events("GPUNodeStorm", c.gw)
    assert ev.involved_object.kind == "ConfigMap" and ev.involved_object.name == "gpuwarden-breaker"
    assert "3 of 5 GPU nodes started failing" in ev.message and all(n in ev.message for n in c.nodes[:3])
    if not execute:
        assert ev.message.startswith("Dry run: would open the agents' circuit breaker")
        assert kube.get_configmap(c.gw, "gpuwarden-breaker") is None
        return
    state = check(kube, c.gw)  # what every agent reads before acting
    assert state.open and "3 of 5 GPU nodes" in state.why
    cm = kube.get_configmap(c.gw, "gpuwarden-breaker")
    assert json.loads(cm["metadata"]["annotations"]["gpuwarden.io/breaker"])["openedBy"] == "gpuwarden-controller/ctl-a"
    c.node_fails(c.nodes[3])
    assert ctl.step() == []  # one storm, one Event
    assert len(c.events("GPUNodeStorm", c.gw)) == 1
    r = CliRunner().invoke(main, ["release", "breaker", "--kubeconfig", k8s.server.kubeconfig_path,
                                  "--gpuwarden-namespace", c.gw])
    assert r.exit_code == 0, r.output
    assert not check(kube, c.gw).open
    assert len(c.events("BreakerClosed", c.gw)) == 1
