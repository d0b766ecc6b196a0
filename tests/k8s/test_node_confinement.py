"""Each agent is confined to its own node, enforced: the chart's ValidatingAdmissionPolicy, created
through the API and enforced by kube-apiserver's own admission plugin in the test API server, with the
chart's RBAC, for every mode the chart renders (tools/testapiserver/admission.go).

The agent's identity is its bound ServiceAccount token: its user carries the node its pod runs on
(`authentication.kubernetes.io/node-name`), as kube-apiserver gives it. The agent of gpu-a writes its
own Node's conditions, its own Events, taints its own node and deletes its own node's pods (mode on);
the same identity is refused every such write to gpu-b, with the policy's 422, as a compromised node
would be. The controller, whose token names the node it runs on too, is not confined.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import contextmanager

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support.apiserver import ApiServerUnavailable, start_apiserver
from tests.support.rbac import chart_authz, denied

pytestmark = pytest.mark.apiserver

POLICY = "gpuwarden-node-confinement"
CONDITION = {"type": "GPUDriver", "status": "True", "reason": "GpuDrv004", "message": "forged",
             "lastHeartbeatTime": "2026-11-24T00:00:00Z", "lastTransitionTime": "2026-11-24T00:00:00Z"}


def _server(authz):
    try:
        return start_apiserver(authz=authz)
    except ApiServerUnavailable as exc:
        pytest.skip(f"REAL API SERVER UNAVAILABLE: {exc}")


def event(node: str, about: dict | None = None, reporter: str | None = None, related: dict | None = None) -> dict:
    """An Event as the agent of `reporter` (default `node`) sends it, about Node `node` unless `about`."""
    reporter = reporter or node
    return {"metadata": {"name": f"{node}.{uuid.uuid4().hex[:12]}", "labels": {"gpuwarden.io/node": reporter}},
            "involvedObject": about or {"kind": "Node", "name": node, "apiVersion": "v1"},
            "type": "Warning", "reason": "GpuDrv004", "message": "probe", "count": 1,
            "source": {"component": "gpuwarden", "host": reporter},
            "reportingComponent": "gpuwarden", "reportingInstance": reporter, **({"related": related} if related else {})}


def refused_by_policy(call) -> str:
    """Run `call`; it must be refused by the confinement policy (422 Invalid, as kube-apiserver answers
    a Deny of a ValidatingAdmissionPolicy). Returns the message."""
    with pytest.raises(ApiException) as err:
        call()
    body = json.loads(err.value.body)
    assert err.value.status == 422 and body["reason"] == "Invalid", body
    assert "ValidatingAdmissionPolicy 'gpuwarden-" in body["message"], body
    return body["message"]


@contextmanager
def _cluster(mode: str):
    """(mode, server, admin CoreV1Api, ids, agent-of-gpu-a CoreV1Api) with gpu-a, gpu-b, a pod on each."""
    authz, ids = chart_authz(mode, {"execute": True, "actions": ["workload", "taint"]}, ["gpu-a", "gpu-b"])
    with _server(authz) as s:
        admin = client.CoreV1Api(s.api_client())
        admin.create_namespace({"metadata": {"name": ids.namespace}})
        admin.create_namespace({"metadata": {"name": "ml"}})
        for n in ("gpu-a", "gpu-b"):
            admin.create_node({"metadata": {"name": n}})
            admin.create_namespaced_pod("ml", {"metadata": {"name": f"trainer-{n}"},
                                               "spec": {"nodeName": n, "containers": [{"name": "c", "image": "i"}]}})
        yield mode, s, admin, ids, client.CoreV1Api(s.api_client(ids.agent_token("gpu-a")))


@pytest.fixture(params=["off", "dry-run", "on"])
def cluster(request):
    """Every agent mode the chart renders: each grants nodes/status patch and Events create/patch; on
    also nodes patch (taint) and pods delete."""
    with _cluster(request.param) as c:
        yield c


@pytest.fixture
def cluster_off():
    with _cluster("off") as c:
        yield c


def test_the_charts_policy_is_served_with_kube_apiservers_defaults(cluster_off):
    _, s, _, _, _ = cluster_off
    adm = client.AdmissionregistrationV1Api(s.api_client())
    [policy] = [p for p in adm.list_validating_admission_policy().items if p.metadata.name == POLICY]
    mc = policy.spec.match_constraints
    assert (mc.match_policy, mc.namespace_selector.to_dict(), mc.object_selector.to_dict()) == (
        "Equivalent", client.V1LabelSelector().to_dict(), client.V1LabelSelector().to_dict())
    assert [b.spec.policy_name for b in adm.list_validating_admission_policy_binding().items] == [POLICY]


def test_the_agent_writes_its_own_node(cluster):
    mode, _, admin, ids, agent = cluster
    agent.patch_node_status("gpu-a", {"status": {"conditions": [CONDITION]}})
    assert "GPUDriver" in {c.type for c in admin.read_node("gpu-a").status.conditions}
    ev = agent.create_namespaced_event("default", event("gpu-a"))
    agent.patch_namespaced_event(ev.metadata.name, "default", {"count": 2})  # aggregated
    # about one of its pods: on its Node, the pod related (as the agent writes it)
    pod_about = {"kind": "Pod", "namespace": "ml", "name": "trainer-gpu-a"}
    ev = agent.create_namespaced_event("default", event("gpu-a", related=pod_about))
    agent.patch_namespaced_event(ev.metadata.name, "default", {"count": 2, "lastTimestamp": "2026-11-24T00:01:00Z"})
    if mode == "on":
        taint = {"spec": {"taints": [{"key": "gpuwarden.io/fault", "value": "GpuDrv004", "effect": "NoSchedule"}]}}
        agent.patch_node("gpu-a", taint)
        agent.delete_namespaced_pod("trainer-gpu-a", "ml", grace_period_seconds=0)
        assert [p.metadata.name for p in admin.list_namespaced_pod("ml").items] == ["trainer-gpu-b"]


def test_the_agent_is_refused_every_write_to_another_node(cluster):
    mode, _, admin, ids, agent = cluster
    before = admin.read_node("gpu-b")
    msg = refused_by_policy(lambda: agent.patch_node_status("gpu-b", {"status": {"conditions": [CONDITION]}}))
    assert "the gpuwarden agent of node gpu-a may not change Node gpu-b" in msg
    # another node's Event: reported as that node, about that Node while reporting as itself, or
    # aggregating (patching) the Event of gpu-b's own agent
    # any Event about a pod (the pod's node is not in the request: a pod of gpu-b's or its own alike),
    # or relating another Node
    b_pod = {"kind": "Pod", "namespace": "ml", "name": "trainer-gpu-b"}
    for ns, body in (("default", event("gpu-b")), ("default", event("gpu-b", reporter="gpu-a")),
                     ("ml", event("gpu-a", about=b_pod)),
                     ("ml", event("gpu-a", about={"kind": "Pod", "namespace": "ml", "name": "trainer-gpu-a"})),
                     ("default", event("gpu-a", related={"kind": "Node", "name": "gpu-b"})),
                     ("default", event("gpu-a") | {"metadata": {"name": f"x.{uuid.uuid4().hex[:8]}",
                                                                "labels": {"gpuwarden.io/node": "gpu-b"}}})):
        msg = refused_by_policy(lambda: agent.create_namespaced_event(ns, body))
        assert "may report only about its own Node" in msg
    theirs = client.CoreV1Api(cluster[1].api_client(ids.agent_token("gpu-b"))).create_namespaced_event(
        "default", event("gpu-b"))
    refused_by_policy(lambda: agent.patch_namespaced_event(theirs.metadata.name, "default", {"count": 5}))
    # gpu-b's Warning retargeted to gpu-a (hiding it from gpu-b's view and from the controller), by patch
    # or by a whole update
    retarget = {"involvedObject": {"kind": "Node", "name": "gpu-a", "apiVersion": "v1"}, "reportingInstance": "gpu-a",
                "source": {"component": "gpuwarden", "host": "gpu-a"}, "metadata": {"labels": {"gpuwarden.io/node": "gpu-a"}}}
    msg = refused_by_policy(lambda: agent.patch_namespaced_event(theirs.metadata.name, "default", retarget))
    assert "may update only its own Events" in msg
    whole = admin.read_namespaced_event(theirs.metadata.name, "default")
    whole.involved_object.name, whole.reporting_instance, whole.source.host = "gpu-a", "gpu-a", "gpu-a"
    whole.metadata.labels = {"gpuwarden.io/node": "gpu-a"}
    with pytest.raises(ApiException) as err:  # RBAC grants no update (403); were it granted, the policy (422)
        agent.replace_namespaced_event(theirs.metadata.name, "default", whole)
    assert err.value.status in (403, 422)
    # its own Event moved to another pod
    mine = agent.create_namespaced_event("default", event("gpu-a", related={**b_pod, "name": "trainer-gpu-a"}))
    msg = refused_by_policy(lambda: agent.patch_namespaced_event(mine.metadata.name, "default", {"related": b_pod}))
    assert "not what they are about" in msg
    if mode == "on":
        taint = {"spec": {"taints": [{"key": "gpuwarden.io/fault", "value": "x", "effect": "NoSchedule"}]}}
        assert "may not change Node gpu-b" in refused_by_policy(lambda: agent.patch_node("gpu-b", taint))
        msg = refused_by_policy(lambda: agent.delete_namespaced_pod("trainer-gpu-b", "ml", grace_period_seconds=0))
        assert "may not delete a pod of another node" in msg
    else:  # the verbs the mode does not grant are RBAC's 403, before admission
        with pytest.raises(ApiException) as err:
            agent.patch_node("gpu-b", {"spec": {"unschedulable": True}})
        assert err.value.status == 403
    after = admin.read_node("gpu-b")
    assert (after.metadata.resource_version, after.status.conditions) == (before.metadata.resource_version, None)
    assert "trainer-gpu-b" in {p.metadata.name for p in admin.list_namespaced_pod("ml").items}
    kept = admin.read_namespaced_event(theirs.metadata.name, "default")
    assert (kept.count, kept.involved_object.name, kept.reporting_instance) == (1, "gpu-b", "gpu-b")
    assert [e.metadata.name for e in admin.list_namespaced_event(
        "default", field_selector="involvedObject.kind=Node,involvedObject.name=gpu-b").items] == [theirs.metadata.name]
    # the server's audit has them too, so tests that fail on any refused request fail on these
    refusals = denied(cluster[1].audit(), ids.agent_user)
    assert any(r.startswith("patch nodes/status /gpu-b") and "[admission: " in r for r in refusals), refusals


def test_a_token_without_the_node_claim_is_refused_even_for_its_node(cluster_off):
    """A token of the agent's ServiceAccount that names no node (a legacy Secret token, one minted by
    TokenRequest without a pod): nothing it writes is admitted, its own node's status included."""
    _, s, admin, ids, _ = cluster_off
    legacy = client.CoreV1Api(s.api_client(ids.legacy_agent_token))
    msg = refused_by_policy(lambda: legacy.patch_node_status("gpu-a", {"status": {"conditions": [CONDITION]}}))
    assert "carries no node name" in msg
    refused_by_policy(lambda: legacy.create_namespaced_event("default", event("gpu-a")))
    assert admin.read_node("gpu-a").status.conditions is None


def test_the_controller_is_not_confined(cluster_off):
    """The controller's token names the node its pod runs on (cpu-node-0); the policy matches only the
    agent's user, so it taints and reports on any node."""
    _, s, admin, ids, _ = cluster_off
    ctl = client.CoreV1Api(s.api_client(ids.controller_token))
    ctl.patch_node("gpu-b", {"spec": {"taints": [{"key": "gpuwarden.io/quarantine", "effect": "NoSchedule"}]}})
    ctl.create_namespaced_event(ids.namespace, event("gpu-b", reporter="gpuwarden-controller"))
    assert admin.read_node("gpu-b").spec.taints[0].key == "gpuwarden.io/quarantine"


def test_a_policy_changed_through_the_api_takes_effect_as_in_kube_apiserver(cluster_off):
    """The policy objects are live: without the binding the agent is confined by RBAC alone; bound
    again, the policy refuses again, each within the plugin's one-second refresh."""
    _, s, _, _, agent = cluster_off
    adm = client.AdmissionregistrationV1Api(s.api_client())
    binding = adm.read_validating_admission_policy_binding(POLICY)
    adm.delete_validating_admission_policy_binding(POLICY)
    write = lambda: agent.create_namespaced_event("default", event("gpu-b"))  # noqa: E731
    assert _within(5, lambda: _admitted(write))
    adm.create_validating_admission_policy_binding(client.V1ValidatingAdmissionPolicyBinding(
        metadata=client.V1ObjectMeta(name=POLICY), spec=binding.spec))
    assert _within(5, lambda: not _admitted(write))
    refused_by_policy(write)


def _admitted(call) -> bool:
    try:
        call()
        return True
    except ApiException as exc:
        if exc.status != 422:
            raise
        return False


def _within(seconds: float, cond) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


# -- evictions (confined by default wherever the agent may evict: mode on) --------------------------
def test_evictions_are_confined_to_the_agents_node_by_default():
    """The Eviction names the pod, not its node: the policy takes the pods of the namespace as params
    and passes only if the named one runs on the agent's node. A pod of no node, another node's pod,
    a claimless token are refused; an unknown pod is the eviction's own 404. The chart's defaults."""
    authz, ids = chart_authz("on", {"execute": False}, ["gpu-a", "gpu-b"])
    with _server(authz) as s:
        admin = client.CoreV1Api(s.api_client())
        admin.create_namespace({"metadata": {"name": "ml"}})
        for n in ("gpu-a", "gpu-b", ""):
            if n:
                admin.create_node({"metadata": {"name": n}})
            admin.create_namespaced_pod("ml", {"metadata": {"name": f"trainer-{n or 'pending'}"},
                                               "spec": {"nodeName": n, "containers": [{"name": "c", "image": "i"}]}})
        agent = client.CoreV1Api(s.api_client(ids.agent_token("gpu-a")))

        def evict(api, pod):
            return lambda: api.create_namespaced_pod_eviction(pod, "ml", {"metadata": {"name": pod, "namespace": "ml"}},
                                                              _preload_content=False)

        msg = refused_by_policy(evict(agent, "trainer-gpu-b"))
        assert "'gpuwarden-eviction-confinement'" in msg and "may not evict pod trainer-gpu-b of node gpu-b" in msg
        assert "of node (none)" in refused_by_policy(evict(agent, "trainer-pending"))
        legacy = client.CoreV1Api(s.api_client(ids.legacy_agent_token))
        assert "carries no node name" in refused_by_policy(evict(legacy, "trainer-gpu-a"))
        with pytest.raises(ApiException) as err:
            evict(agent, "no-such-pod")()
        assert err.value.status == 404
        assert evict(agent, "trainer-gpu-a")().status == 201
        assert sorted(p.metadata.name for p in admin.list_namespaced_pod("ml").items) == ["trainer-gpu-b",
                                                                                          "trainer-pending"]
