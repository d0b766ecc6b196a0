"""The quarantine record and the patches that apply and undo it (pure)."""

from __future__ import annotations

import json

from gpuwarden.controller import quarantine as q
from gpuwarden.controller.model import WorkloadRef
from tests.controller.objects import T0, deployment, node

DEP = WorkloadRef("Deployment", "ml", "trainer")
CHAIN = [{"node": "gpu-a", "failedAt": "x", "signals": ["Ready=Unknown"], "pod": "ml/p1"},
         {"node": "gpu-b", "failedAt": "y", "signals": ["Ready=Unknown"], "pod": "ml/p2"}]


def quarantine(obj, ref=DEP, **kw):
    return q.plan_quarantine(obj, ref, "cascade: evidence", ["gpu-a", "gpu-b"], CHAIN, T0, "gpuwarden-controller/t", **kw)


def test_deployment_scaled_to_zero_with_the_undo_recorded():
    p = quarantine(deployment("trainer", replicas=3, rv="42"))
    assert isinstance(p, q.QuarantinePatch)
    assert p.describe == "scale deployment ml/trainer from 3 to 0"
    assert p.patch["spec"] == {"replicas": 0}
    assert p.patch["metadata"]["resourceVersion"] == "42"
    rec = json.loads(p.patch["metadata"]["annotations"][q.ANNOTATION])
    assert rec["undo"] == {"kind": "Deployment", "replicas": 3}
    assert rec["nodes"] == ["gpu-a", "gpu-b"] and rec["chain"] == CHAIN
    assert rec["reason"] == "cascade: evidence" and rec["by"] == "gpuwarden-controller/t" and rec["at"].endswith("Z")


def test_not_twice_not_opted_out_not_already_zero():
    rec = json.dumps({"at": "2026-11-22T10:00:00Z"})
    assert "already quarantined since 2026-11-22T10:00:00Z" in quarantine(
        deployment("trainer", annotations={q.ANNOTATION: rec})).why
    assert "opted out" in quarantine(deployment("trainer", annotations={"gpuwarden.io/no-remediation": "true"})).why
    assert "already scaled to 0" in quarantine(deployment("trainer", replicas=0)).why
    ds = WorkloadRef("DaemonSet", "ml", "exporter")
    assert "cannot quarantine a DaemonSet" in quarantine({"metadata": {}, "spec": {}}, ds).why


def test_job_and_cronjob_suspended():
    job = WorkloadRef("Job", "ml", "burn-in")
    p = quarantine({"metadata": {"name": "burn-in", "resourceVersion": "3"}, "spec": {"parallelism": 1}}, job)
    assert p.patch["spec"] == {"suspend": True} and p.undo == {"kind": "Job", "suspend": False}
    assert "already suspended" in quarantine({"metadata": {}, "spec": {"suspend": True}}, job).why
    cj = WorkloadRef("CronJob", "ml", "nightly")
    p = quarantine({"metadata": {"resourceVersion": "9"}, "spec": {},
                    "status": {"active": [{"name": "nightly-2"}, {"name": "nightly-1"}]}}, cj)
    assert p.patch["spec"] == {"suspend": True}
    assert p.jobs == ["nightly-1", "nightly-2"] and p.undo["jobs"] == ["nightly-1", "nightly-2"]


def test_taint_only_records_the_taint_and_changes_no_spec():
    taint = q.pool_taint("gpuwarden.io/quarantine")
    p = quarantine(deployment("trainer"), taint=taint, stop=False)
    assert "spec" not in p.patch
    assert json.loads(p.patch["metadata"]["annotations"][q.ANNOTATION])["undo"] == {"kind": "Deployment",
                                                                                     "taint": taint}


def quarantined(replicas_now=0, undo=None, rv="50"):
    rec = {"at": "2026-11-22T10:00:00Z", "undo": undo or {"kind": "Deployment", "replicas": 3}}
    return deployment("trainer", replicas=replicas_now, annotations={q.ANNOTATION: json.dumps(rec)}, rv=rv)


def test_release_restores_replicas_and_leaves_a_note():
    p = q.plan_release(quarantined(), DEP, T0, "me")
    assert p.describe == "scale deployment ml/trainer back to 3"
    assert p.patch["spec"] == {"replicas": 3}
    ann = p.patch["metadata"]["annotations"]
    assert ann[q.ANNOTATION] is None  # merge patch: delete
    assert json.loads(ann[q.RELEASED])["restored"] == {"kind": "Deployment", "replicas": 3}
    assert p.patch["metadata"]["resourceVersion"] == "50"


def test_release_refuses_when_changed_since_unless_forced():
    s = q.plan_release(quarantined(replicas_now=5), DEP, T0, "me")
    assert isinstance(s, q.Skip) and not s.absent and "replicas=5" in s.why
    p = q.plan_release(quarantined(replicas_now=5), DEP, T0, "me", force=True)
    assert "spec" not in p.patch and p.patch["metadata"]["annotations"][q.ANNOTATION] is None
    s = q.plan_release(deployment("trainer"), DEP, T0, "me")
    assert s.absent and "not quarantined" in s.why
    garbled = deployment("trainer", annotations={q.ANNOTATION: "{oops"})
    assert "no usable undo" in q.plan_release(garbled, DEP, T0, "me").why
    assert isinstance(q.plan_release(garbled, DEP, T0, "me", force=True), q.QuarantinePatch)


def test_release_resumes_a_job():
    job = WorkloadRef("Job", "ml", "burn-in")
    obj = {"metadata": {"annotations": {q.ANNOTATION: json.dumps({"undo": {"kind": "Job", "suspend": False}})}},
           "spec": {"suspend": True}}
    assert q.plan_release(obj, job, T0, "me").patch["spec"] == {"suspend": False}


def test_pool_taint_is_shared_by_holders():
    taint = q.pool_taint("gpuwarden.io/quarantine")
    n = node("gpu-c", rv="11")
    n["spec"]["taints"] = [{"key": "other", "effect": "NoExecute"}]
    patch = q.plan_taint(n, taint, "deployment/ml/a")
    assert patch["spec"]["taints"] == [{"key": "other", "effect": "NoExecute"}, taint]
    assert json.loads(patch["metadata"]["annotations"][q.NODE_HOLDERS]) == ["deployment/ml/a"]
    assert patch["metadata"]["resourceVersion"] == "11"
    # applied; a second workload joins without a second taint
    n["spec"]["taints"] = patch["spec"]["taints"]
    n["metadata"]["annotations"] = patch["metadata"]["annotations"]
    assert q.plan_taint(n, taint, "deployment/ml/a") is None
    p2 = q.plan_taint(n, taint, "job/ml/b")
    assert p2["spec"]["taints"].count(taint) == 1
    n["metadata"]["annotations"] = p2["metadata"]["annotations"]
    # the first release keeps the taint; the last removes it
    u1 = q.plan_untaint(n, "gpuwarden.io/quarantine", "deployment/ml/a")
    assert "spec" not in u1 and json.loads(u1["metadata"]["annotations"][q.NODE_HOLDERS]) == ["job/ml/b"]
    n["metadata"]["annotations"] = u1["metadata"]["annotations"]
    u2 = q.plan_untaint(n, "gpuwarden.io/quarantine", "job/ml/b")
    assert u2["spec"]["taints"] == [{"key": "other", "effect": "NoExecute"}]
    assert u2["metadata"]["annotations"][q.NODE_HOLDERS] is None
    assert q.plan_untaint(node("gpu-d"), "gpuwarden.io/quarantine", "job/ml/b") is None
