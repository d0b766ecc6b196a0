"""The remediation plan (pure) and its guards: who is never touched, what waits for what."""

from __future__ import annotations

from gpuwarden.findings import Affected, Finding, Severity, Status
from gpuwarden.remediation.guard import Cooldowns, TokenBucket, protected_pod
from gpuwarden.remediation.plan import ClusterState, Options, attributed_pod, build

OWNED = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs1", "controller": True}]


def pod(name, ns="ml", uid=None, labels=None, ann=None, owners=OWNED, ready=True, created="2026-01-01T00:00:00Z"):
    return {"metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}", "labels": labels or {},
                         "annotations": ann or {}, "ownerReferences": owners, "creationTimestamp": created},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


PLUGIN = pod("nvidia-device-plugin-abcde", "gpu-operator", labels={"app.kubernetes.io/name": "nvidia-device-plugin"},
             owners=[{"kind": "DaemonSet", "name": "ds", "uid": "ds1", "controller": True}])
NODE = {"metadata": {"name": "n1", "uid": "node-uid"}, "spec": {}}


def state(*pods, node=NODE):
    pods = list(pods)
    return ClusterState(node, pods, [p for p in pods if p["metadata"]["name"].startswith("nvidia-device-plugin")])


def dev001(*uids, stale=True, status=Status.CONFIRMED):
    return Finding("GPU-DEV-001", status, Severity.HIGH, "t", "s", family="device-access",
                   affected=[Affected("container", f"p{i}/c", "ml", u) for i, u in enumerate(uids)],
                   mechanism="device plugin /dev snapshot predates nvidia-uvm", data={"stale_plugin": stale})


def kinds(plan):
    return [(a.kind, a.target.name) for a in plan.actions]


def test_stale_plugin_restart_first_then_pods_once_it_is_back():
    p0 = pod("p0")
    plan = build([dev001("uid-p0")], state(p0, PLUGIN), Options())
    assert kinds(plan) == [("restart-device-plugin", PLUGIN["metadata"]["name"])]
    assert [d.target.name for d in plan.deferred] == ["p0"]
    # restarted at T; the DaemonSet's new pod is not ready yet: keep waiting
    t = 1767225600.0
    newp = pod("nvidia-device-plugin-fghij", "gpu-operator", labels={"app.kubernetes.io/name": "nvidia-device-plugin"},
               ready=False, created="2026-01-01T00:05:00Z")
    plan = build([dev001("uid-p0")], state(p0, newp), Options(), plugin_restarted_at=t + 200)
    assert plan.actions == [] and plan.deferred
    newp["status"]["conditions"][0]["status"] = "True"
    plan = build([dev001("uid-p0")], state(p0, newp), Options(), plugin_restarted_at=t + 200)
    assert kinds(plan) == [("delete-pod", "p0")]


def test_not_stale_deletes_affected_pods_only():
    plan = build([dev001("uid-p0", stale=False)], state(pod("p0"), pod("bystander"), PLUGIN), Options())
    assert kinds(plan) == [("delete-pod", "p0")]


def test_device_loss_deletes_exactly_the_affected_pods():
    f = Finding("GPU-DEV-002", Status.CONFIRMED, Severity.HIGH, "t", "s", family="device-access",
                affected=[Affected("container", "a/c", "ml", "uid-a"), Affected("container", "a/d", "ml", "uid-a"),
                          Affected("container", "b/c", "ml", "uid-b")])
    plan = build([f], state(pod("a"), pod("b"), pod("c")), Options())
    assert kinds(plan) == [("delete-pod", "a"), ("delete-pod", "b")]


def test_at_risk_loss_does_nothing():
    f = Finding("GPU-DEV-002", Status.AT_RISK, Severity.MEDIUM, "t", "s", affected=[Affected("container", "a/c", "ml", "uid-a")])
    assert build([f], state(pod("a")), Options()).actions == []


def test_uid_mismatch_is_never_a_same_named_successor():
    plan = build([dev001("old-uid", stale=False)], state(pod("p0", uid="new-uid")), Options())
    assert plan.actions == [] and "not found" in plan.skipped[0].why


def test_guards():
    mirror = pod("m", ann={"kubernetes.io/config.mirror": "abc"})
    optout = pod("o", ann={"gpuwarden.io/no-remediation": "true"})
    cp = pod("kube-apiserver-n1", "kube-system", labels={"component": "kube-apiserver"})
    etcd = pod("etcd-n1", "kube-system", owners=[{"kind": "Node", "name": "n1", "uid": "x"}])
    bare = pod("bare", owners=[])
    f = Finding("GPU-DEV-003", Status.CONFIRMED, Severity.HIGH, "t", "s",
                affected=[Affected("container", f"{p['metadata']['name']}/c", p["metadata"]["namespace"], p["metadata"]["uid"])
                          for p in (mirror, optout, cp, etcd, bare)])
    plan = build([f], state(mirror, optout, cp, etcd, bare), Options())
    assert plan.actions == []
    whys = " | ".join(s.why for s in plan.skipped)
    for word in ("mirror", "opted out", "control-plane", "owned by the Node", "no controller"):
        assert word in whys
    assert kinds(build([f], state(mirror, optout, cp, etcd, bare), Options(delete_unowned_pods=True))) == [("delete-pod", "bare")]
    assert protected_pod(pod("ok")) is None


def test_node_opt_out_blocks_everything():
    node = {"metadata": {"name": "n1", "annotations": {"gpuwarden.io/no-remediation": "true"}}, "spec": {}}
    plan = build([dev001("uid-p0", stale=False)], state(pod("p0"), node=node), Options())
    assert plan.actions == [] and "node opted out" in plan.skipped[0].why


def test_critical_driver_fault_taints_or_cordons():
    f = Finding("GPU-DRV-006", Status.CONFIRMED, Severity.CRITICAL, "t", "s", family="driver")
    [a] = build([f], state(), Options()).actions
    assert a.kind == "taint-node" and a.detail["taint"] == {"key": "gpuwarden.io/unhealthy", "value": "driver",
                                                            "effect": "NoSchedule"}
    [a] = build([f], state(), Options(node_fault_action="cordon")).actions
    assert a.kind == "cordon-node"
    tainted = {"metadata": {"name": "n1"}, "spec": {"taints": [{"key": "gpuwarden.io/unhealthy", "value": "driver",
                                                                "effect": "NoSchedule"}]}}
    assert build([f], state(node=tainted), Options()).actions == []
    high = Finding("GPU-DRV-004", Status.CONFIRMED, Severity.MEDIUM, "t", "s", family="driver")
    assert build([high], state(), Options()).actions == []


def test_memory_guard_hook_evicts_the_attributed_pod():
    f = Finding("GPU-NODE-001", Status.CONFIRMED, Severity.CRITICAL, "t", "s", family="memory",
                data={"attribution": {"pod": {"namespace": "ml", "name": "render", "uid": "uid-render"}}})
    assert attributed_pod(f) == ("ml", "render", "uid-render")
    assert kinds(build([f], state(pod("render"), pod("other")), Options())) == [("evict-pod-for-memory", "render")]
    f2 = Finding("GPU-NODE-001", Status.CONFIRMED, Severity.CRITICAL, "t", "s", data={"pod": "ml/render"})
    assert kinds(build([f2], state(pod("render")), Options())) == [("evict-pod-for-memory", "render")]
    f3 = Finding("GPU-NODE-001", Status.CONFIRMED, Severity.CRITICAL, "t", "s")
    assert build([f3], state(pod("render")), Options()).actions == []
    # the memory ledger's own shape: suspects, used only with high confidence
    suspects = [{"kind": "process", "ref": "Xorg (pid 9)"}, {"kind": "pod", "ref": "ml/render", "uid": "uid-render"}]
    for confidence, expect in (("high", [("evict-pod-for-memory", "render")]), ("medium", []), ("low", [])):
        f4 = Finding("GPU-NODE-001", Status.CONFIRMED, Severity.CRITICAL, "t", "s", family="node-memory",
                     data={"attribution": {"confidence": confidence, "suspects": suspects}})
        assert kinds(build([f4], state(pod("render")), Options())) == expect, confidence


def test_plan_renders_every_line():
    plan = build([dev001("uid-p0")], state(pod("p0"), PLUGIN), Options())
    text = plan.render()
    assert "restart-device-plugin pod gpu-operator/nvidia-device-plugin-abcde" in text
    assert "deferred: delete-pod pod ml/p0" in text


def test_token_bucket_and_cooldown():
    now = [0.0]
    b = TokenBucket(2, 60.0, clock=lambda: now[0])
    assert b.take() and b.take() and not b.take()
    now[0] += 60  # one per minute
    assert b.take() and not b.take()
    c = Cooldowns(100, clock=lambda: now[0])
    c.mark("delete-pod", "ml/p0")
    now[0] += 50
    assert 49 < c.remaining("delete-pod", "ml/p0") <= 50
    now[0] += 51
    assert c.remaining("delete-pod", "ml/p0") == 0


def test_a_stale_cdi_spec_withholds_pod_deletion_until_the_spec_is_regenerated():
    """A pod recreated from the same node CDI spec gets the same devices: nothing to do but say so."""
    f = Finding("GPU-DEV-001", Status.CONFIRMED, Severity.HIGH, "t", "s", family="device-access",
                affected=[Affected("container", "p0/c", "ml", "uid-p0")],
                mechanism="node CDI spec generated before nvidia-uvm existed",
                data={"stale_plugin": False, "cause": "stale-cdi-spec"})
    plan = build([f], state(pod("p0"), PLUGIN), Options())
    assert plan.actions == []
    assert [(w.kind, w.target.name) for w in plan.skipped] == [("delete-pod", "p0")]
    assert "regenerate the spec first" in plan.skipped[0].why
    # at risk (no pod hit yet, the plugin named): nothing planned, nothing withheld
    risk = Finding("GPU-DEV-001", Status.AT_RISK, Severity.MEDIUM, "t", "s", family="device-access",
                   affected=[Affected("plugin", PLUGIN["metadata"]["name"], "gpu-operator", PLUGIN["metadata"]["uid"])],
                   mechanism="node CDI spec generated before nvidia-uvm existed",
                   data={"stale_plugin": False, "cause": "stale-cdi-spec"})
    plan = build([risk], state(pod("p0"), PLUGIN), Options())
    assert plan.actions == [] and plan.skipped == []
    # once the spec lists the node, the cause is another one: the pod goes
    f.data["cause"] = "not-determined"
    assert kinds(build([f], state(pod("p0"), PLUGIN), Options())) == [("delete-pod", "p0")]
