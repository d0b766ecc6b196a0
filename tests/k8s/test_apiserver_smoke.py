"""The test API server behaves like the real one where gpuwarden depends on it.

Each test uses the official Python client the way gpuwarden does, against etcd and
tools/testapiserver (see tests/k8s/conftest.py).
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.apiserver


def _node(name, labels=None, conditions=None, unschedulable=False):
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels=labels or {}),
        spec=client.V1NodeSpec(unschedulable=unschedulable),
        status=client.V1NodeStatus(conditions=conditions or []),
    )


def _pod(name, node=None, labels=None):
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels or {}),
        spec=client.V1PodSpec(
            node_name=node,
            containers=[client.V1Container(name="main", image="registry.example/cuda:12")],
        ),
    )


def test_discovery_and_version(k8s):
    version = client.VersionApi(k8s.api).get_code()
    assert version.major == "1" and version.minor

    groups = {g.name for g in client.ApisApi(k8s.api).get_api_versions().groups}
    assert {"apps", "batch", "coordination.k8s.io"} <= groups
    core = {r.name for r in client.CoreV1Api(k8s.api).get_api_resources().resources}
    assert {"nodes", "nodes/status", "pods", "pods/status", "pods/eviction", "pods/binding",
            "events", "namespaces", "configmaps"} <= core


def test_create_and_list_nodes(k8s):
    v1 = client.CoreV1Api(k8s.api)
    gpu, cpu = k8s.name("gpu"), k8s.name("cpu")
    v1.create_node(_node(gpu, labels={"nvidia.com/gpu.present": "true"}))
    v1.create_node(_node(cpu, unschedulable=True))

    by_label = v1.list_node(label_selector="nvidia.com/gpu.present=true").items
    assert [n.metadata.name for n in by_label] == [gpu]

    cordoned = {n.metadata.name for n in v1.list_node(field_selector="spec.unschedulable=true").items}
    assert cpu in cordoned and gpu not in cordoned
    assert [n.metadata.name for n in v1.list_node(field_selector=f"metadata.name={gpu}").items] == [gpu]

    with pytest.raises(ApiException) as err:
        v1.list_node(field_selector="spec.providerID=x")
    assert err.value.status == 400


def test_node_status_patch_merges_conditions_by_type(k8s):
    v1 = client.CoreV1Api(k8s.api)
    name = k8s.name("gpu-node")
    # (labels, as a kubelet registers them: an object created with no field worth
    # tracking gets no managedFields, and then updates are not tracked either)
    v1.create_node(_node(name, labels={"kubernetes.io/hostname": name}))
    # the kubelet reports Ready
    v1.patch_node_status(
        name,
        {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}},
        field_manager="kubelet",
    )
    # gpuwarden adds its own condition with a strategic merge patch
    patched = v1.patch_node_status(
        name,
        {"status": {"conditions": [{"type": "GPUHealthy", "status": "False", "reason": "XidError"}]}},
        field_manager="gpuwarden",
    )
    conditions = {c.type: (c.status, c.reason) for c in patched.status.conditions}
    assert conditions == {"Ready": ("True", "KubeletReady"), "GPUHealthy": ("False", "XidError")}

    # and updates it in place, still leaving the kubelet's alone
    v1.patch_node_status(
        name, {"status": {"conditions": [{"type": "GPUHealthy", "status": "True", "reason": "Recovered"}]}},
        field_manager="gpuwarden",
    )
    node = v1.read_node(name)
    assert {c.type: c.status for c in node.status.conditions} == {"Ready": "True", "GPUHealthy": "True"}
    assert {"kubelet", "gpuwarden"} <= {m.manager for m in node.metadata.managed_fields}

    # a main-resource update keeps status; a status update keeps spec
    v1.patch_node(name, {"spec": {"unschedulable": True}, "status": {"conditions": []}})
    node = v1.read_node(name)
    assert node.spec.unschedulable is True and len(node.status.conditions) == 2
    v1.patch_node_status(name, {"spec": {"unschedulable": False}})
    assert v1.read_node(name).spec.unschedulable is True


def test_server_side_apply_of_node_condition(k8s):
    v1 = client.CoreV1Api(k8s.api)
    name = k8s.name("ssa-node")
    v1.create_node(_node(name, conditions=[client.V1NodeCondition(type="Ready", status="True")]))
    applied = v1.patch_node_status(
        name,
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
         "status": {"conditions": [{"type": "GPUHealthy", "status": "False"}]}},
        field_manager="gpuwarden", force=True, _content_type="application/apply-patch+yaml",
    )
    assert {c.type for c in applied.status.conditions} == {"Ready", "GPUHealthy"}


def test_pods_by_field_selector(k8s):
    v1 = client.CoreV1Api(k8s.api)
    ns = k8s.namespace
    node_a, node_b = k8s.name("node-a"), k8s.name("node-b")
    created = v1.create_namespaced_pod(ns, _pod("on-a", node_a))
    v1.create_namespaced_pod(ns, _pod("on-b", node_b))
    v1.create_namespaced_pod(ns, _pod("pending"))

    # like kube-apiserver, create drops any status and starts the pod Pending
    assert created.status.phase == "Pending"
    on_a = v1.list_namespaced_pod(ns, field_selector=f"spec.nodeName={node_a}").items
    assert [p.metadata.name for p in on_a] == ["on-a"]
    # across namespaces, as a node agent lists its pods
    assert [p.metadata.name for p in v1.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_a}").items] == ["on-a"]
    unbound = v1.list_namespaced_pod(ns, field_selector="spec.nodeName=").items
    assert [p.metadata.name for p in unbound] == ["pending"]

    # the kubelet reports Running; selectors on status.phase follow
    v1.patch_namespaced_pod_status("on-a", ns, {"status": {"phase": "Running"}})
    running = v1.list_namespaced_pod(ns, field_selector="status.phase=Running").items
    assert [p.metadata.name for p in running] == ["on-a"]
    both = v1.list_namespaced_pod(ns, field_selector=f"spec.nodeName={node_a},status.phase!=Failed").items
    assert [p.metadata.name for p in both] == ["on-a"]


def test_pod_binding_eviction_and_graceful_delete(k8s):
    v1 = client.CoreV1Api(k8s.api)
    ns = k8s.namespace
    node = k8s.name("node")
    pod = _pod("worker")
    pod.spec.termination_grace_period_seconds = 30
    v1.create_namespaced_pod(ns, pod)

    # the scheduler binds it (the client cannot parse the Status reply: read it raw)
    binding = client.V1Binding(metadata=client.V1ObjectMeta(name="worker"),
                               target=client.V1ObjectReference(kind="Node", name=node))
    resp = v1.create_namespaced_pod_binding("worker", ns, binding, _preload_content=False)
    assert resp.status == 201
    bound = v1.read_namespaced_pod("worker", ns)
    assert bound.spec.node_name == node
    assert any(c.type == "PodScheduled" and c.status == "True" for c in bound.status.conditions)

    # eviction of a bound pod with a grace period leaves it terminating for the kubelet to finish
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="worker", namespace=ns))
    resp = v1.create_namespaced_pod_eviction("worker", ns, eviction, _preload_content=False)
    assert resp.status == 201
    terminating = v1.read_namespaced_pod("worker", ns)
    assert terminating.metadata.deletion_timestamp is not None
    assert terminating.metadata.deletion_grace_period_seconds == 30
    # ... which the kubelet does by deleting with grace 0
    v1.delete_namespaced_pod("worker", ns, grace_period_seconds=0)
    with pytest.raises(ApiException) as err:
        v1.read_namespaced_pod("worker", ns)
    assert err.value.status == 404


def test_events_by_involved_object(k8s):
    v1 = client.CoreV1Api(k8s.api)
    ns = k8s.namespace
    node = k8s.name("gpu-node")
    for obj_name, reason in ((node, "GPUUnhealthy"), ("someone-else", "Scheduled")):
        v1.create_namespaced_event(ns, client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{obj_name}."),
            involved_object=client.V1ObjectReference(kind="Node", name=obj_name),
            reason=reason, type="Warning", message="x", source=client.V1EventSource(component="gpuwarden"),
        ))
    mine = v1.list_namespaced_event(ns, field_selector=f"involvedObject.name={node}").items
    assert [(e.involved_object.name, e.reason) for e in mine] == [(node, "GPUUnhealthy")]
    warnings = v1.list_namespaced_event(
        ns, field_selector="involvedObject.kind=Node,type=Warning,reason=GPUUnhealthy,source=gpuwarden").items
    assert len(warnings) == 1


def test_lease_create_and_renew(k8s):
    coord = client.CoordinationV1Api(k8s.api)
    ns = k8s.namespace
    # MicroTime fields need the microseconds: the client writes a datetime whose
    # microsecond is 0 without them, which kube-apiserver (and this server) refuse.
    t0 = datetime(2026, 11, 22, 0, 0, 0, 1, tzinfo=timezone.utc)
    lease = coord.create_namespaced_lease(ns, client.V1Lease(
        metadata=client.V1ObjectMeta(name="node-a"),
        spec=client.V1LeaseSpec(holder_identity="node-a", lease_duration_seconds=40, renew_time=t0),
    ))
    lease.spec.renew_time = t0 + timedelta(seconds=10)
    renewed = coord.replace_namespaced_lease("node-a", ns, lease)
    assert renewed.metadata.resource_version != lease.metadata.resource_version
    assert renewed.spec.renew_time == t0 + timedelta(seconds=10)

    # a renewal from a stale read conflicts
    with pytest.raises(ApiException) as err:
        coord.replace_namespaced_lease("node-a", ns, lease)
    assert err.value.status == 409


def test_deployment_scale_to_zero(k8s):
    apps = client.AppsV1Api(k8s.api)
    ns = k8s.namespace
    labels = {"app": "trainer"}
    dep = apps.create_namespaced_deployment(ns, client.V1Deployment(
        metadata=client.V1ObjectMeta(name="trainer"),
        spec=client.V1DeploymentSpec(
            replicas=3,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(name="t", image="registry.example/t:1")]),
            ),
        ),
    ))
    assert dep.metadata.generation == 1

    scaled = apps.patch_namespaced_deployment("trainer", ns, {"spec": {"replicas": 0}})
    assert scaled.spec.replicas == 0 and scaled.metadata.generation == 2

    # and through the scale subresource, as kubectl scale does
    apps.patch_namespaced_deployment_scale("trainer", ns, {"spec": {"replicas": 2}})
    scale = apps.read_namespaced_deployment_scale("trainer", ns)
    assert scale.spec.replicas == 2 and scale.status.selector == "app=trainer"
    assert apps.read_namespaced_deployment("trainer", ns).spec.replicas == 2


def test_job_suspend(k8s):
    batch = client.BatchV1Api(k8s.api)
    ns = k8s.namespace
    batch.create_namespaced_job(ns, client.V1Job(
        metadata=client.V1ObjectMeta(name="burn-in"),
        spec=client.V1JobSpec(template=client.V1PodTemplateSpec(spec=client.V1PodSpec(
            restart_policy="Never",
            containers=[client.V1Container(name="b", image="registry.example/burn:1")],
        ))),
    ))
    job = batch.patch_namespaced_job("burn-in", ns, {"spec": {"suspend": True}})
    assert job.spec.suspend is True
    assert batch.read_namespaced_job("burn-in", ns).spec.suspend is True


def test_watch_pods_sees_added(k8s):
    v1 = client.CoreV1Api(k8s.api)
    ns = k8s.namespace
    start_rv = v1.list_namespaced_pod(ns).metadata.resource_version
    creator = threading.Timer(0.2, lambda: v1.create_namespaced_pod(ns, _pod("watched", "node-w")))
    creator.start()
    w = watch.Watch()
    seen = []
    try:
        for event in w.stream(v1.list_namespaced_pod, ns, resource_version=start_rv, timeout_seconds=10):
            seen.append((event["type"], event["object"].metadata.name))
            if seen[-1] == ("ADDED", "watched"):
                break
    finally:
        w.stop()
        creator.join()
    assert ("ADDED", "watched") in seen
