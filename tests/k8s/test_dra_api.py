"""The DRA world against the real test API server: resource.k8s.io served (DeviceClass, ResourceSlice,
ResourceClaim v1; DeviceTaintRule v1beta2, the newest the packaged types have), the agent's API-side
verdicts GPU-K8S-020/021 through its check loop (positive, negative, clears), and the one-GPU fence
(a DeviceTaintRule on exactly the device a critical finding names, removed once no raised finding
names it) under the chart's identity, RBAC and node-confinement policy, with no grant unused.
"""

from __future__ import annotations

import time

import pytest

from gpuwarden.findings import Affected, Finding, Severity, Status
from gpuwarden.kube import dra
from gpuwarden.kube.client import Kube
from gpuwarden.kube.errors import KubeError
from gpuwarden.root import HostRoot
from tests.support.agent_kube import conditions_of, ensure_namespace, make_node, new_agent
from tests.support.agent_nodes import sock, synthetic_node
from tests.support.apiserver import ApiServerUnavailable, start_apiserver
from tests.support.rbac import chart_authz, least_privilege_report

pytestmark = pytest.mark.apiserver

DRIVER = "gpu.nvidia.com"
R = "/apis/resource.k8s.io"
GPU_UUID = "GPU-517551a5-9054-f7d5-9cfb-b9575e192f6f"  # the healthy example's GPU
OTHER_UUID = "GPU-00000000-1111-2222-3333-444444444444"
REG = f"var/lib/kubelet/plugins_registry/{DRIVER}-reg.sock"
DRA_SOCK = f"var/lib/kubelet/plugins/{DRIVER}/dra.sock"


def slice_body(node: str, devices: int = 2, name: str = "", generation: int = 1, uuids=(GPU_UUID, OTHER_UUID)) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name or f"{node}-{DRIVER}-{generation}"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": uuids[i]},
                                                                     "type": {"string": "gpu"}}}
                                 for i in range(devices)]}}


def make_slice(kube: Kube, node: str, **kw) -> dict:
    return kube.request("POST", f"{R}/v1/resourceslices", slice_body(node, **kw))


@pytest.fixture
def clean(kube):
    yield kube
    for path in (f"{R}/v1/resourceslices", f"{R}/v1beta2/devicetaintrules"):
        for o in kube.iter_items(path):
            kube.request("DELETE", f"{path}/{o['metadata']['name']}")


# -- the server serves resource.k8s.io --------------------------------------------------------------
def test_resource_api_is_served_with_kube_apiservers_selectors(clean, k8s):
    kube = clean
    group = kube.get(f"{R}")
    assert [v["version"] for v in group["versions"]] == ["v1", "v1beta2"] and group["preferredVersion"]["version"] == "v1"
    v1 = {r["name"] for r in kube.get(f"{R}/v1")["resources"]}
    assert {"deviceclasses", "resourceslices", "resourceclaims", "resourceclaims/status", "resourceclaimtemplates"} <= v1
    assert "devicetaintrules" not in v1
    assert {r["name"] for r in kube.get(f"{R}/v1beta2")["resources"]} == {"devicetaintrules", "devicetaintrules/status"}
    assert dra.taint_rule_version(kube) == "v1beta2"

    kube.request("POST", f"{R}/v1/deviceclasses", {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                                   "metadata": {"name": k8s.name("gpu")},
                                                   "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}})
    a, b = k8s.name("node-a"), k8s.name("node-b")
    make_slice(kube, a)
    make_slice(kube, b, devices=1)
    other = slice_body(a, name=k8s.name("other-driver"))
    other["spec"]["driver"] = "example.com"
    kube.request("POST", f"{R}/v1/resourceslices", other)
    sl = dra.node_slices(kube, a)
    assert [d.ref.device for d in sl.devices] == ["gpu-0", "gpu-1"] and sl.generations == {a: 1}
    assert sl.devices[0].uuid == GPU_UUID
    with pytest.raises(KubeError) as e:  # a field kube-apiserver does not select by is refused
        list(kube.iter_items(f"{R}/v1/resourceslices", field_selector="spec.pool.name=x"))
    assert e.value.status == 400

    # a claim, its allocation in /status (the scheduler's write), reserved for a pod
    claim = kube.request("POST", f"{R}/v1/namespaces/{k8s.namespace}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "gpu"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {"reservedFor": [{"resource": "pods", "name": "x", "uid": "forged"}]}})
    assert not claim.get("status")  # status is not set on create
    claim["status"] = {"allocation": {"devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": a, "device": "gpu-1"}]}},
                       "reservedFor": [{"resource": "pods", "name": "trainer", "uid": "pod-uid"}]}
    kube.request("PUT", f"{R}/v1/namespaces/{k8s.namespace}/resourceclaims/gpu/status", claim)
    pod = {"metadata": {"namespace": k8s.namespace, "name": "trainer"},
           "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "gpu"}, {"name": "gone", "resourceClaimName": "gone"}]}}
    [got] = dra.pod_claims(kube, pod)
    assert dra.claim_devices(got) == [dra.DeviceRef(DRIVER, a, "gpu-1")] and dra.reserved_for(got) == ["pod-uid"]

    # a DeviceTaintRule: create (idempotent), find, delete (idempotent)
    dev = dra.DeviceRef(DRIVER, a, "gpu-1")
    assert dra.fence_device(kube, dev, a).startswith("created DeviceTaintRule")
    assert "already has" in dra.fence_device(kube, dev, a)
    [rule] = dra.own_taint_rules(kube, a, "v1beta2")
    assert dra.rule_device(rule) == dev and rule["metadata"]["generation"] == 1
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"
    assert dra.own_taint_rules(kube, b, "v1beta2") == []
    assert dra.unfence_device(kube, dev, a).startswith("deleted DeviceTaintRule")
    assert "no DeviceTaintRule" in dra.unfence_device(kube, dev, a)


# -- GPU-K8S-020 / 021 through the agent's check loop ----------------------------------------------
def _agent(kube, k8s, node, root, **kw):
    return new_agent(kube, node, HostRoot(str(root)), k8s.namespace, dra_driver=DRIVER, **kw)[0]


def _failed_prepare(kube, ns, pod):
    md = pod["metadata"]
    kube.create_event(ns, {"metadata": {"name": f"{md['name']}.prep", "namespace": ns},
                           "involvedObject": {"kind": "Pod", "namespace": ns, "name": md["name"], "uid": md["uid"]},
                           "reason": "FailedPrepareDynamicResources", "type": "Warning", "count": 3,
                           "message": f"Failed to prepare dynamic resources: plugin {DRIVER} not found in the list of registered DRA drivers",
                           "source": {"component": "kubelet", "host": "n"}})


@pytest.mark.rule("GPU-K8S-020", "positive")
@pytest.mark.rule("GPU-K8S-020", "clears")
def test_slices_of_a_node_whose_plugin_is_gone_raise_and_clear(clean, k8s, node_dir):
    kube = clean
    node = k8s.name("dra-node")
    make_node(kube, node)
    make_slice(kube, node)
    make_slice(kube, k8s.name("elsewhere"))  # another node's slices are neither read nor counted
    # a pod bound here whose claim the kubelet could not prepare
    pod = kube.request("POST", "/api/v1/namespaces/ml/pods", {
        "metadata": {"name": "trainer-0", "namespace": "ml"},
        "spec": {"nodeName": node, "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                 "containers": [{"name": "trainer", "image": "registry.example/x:1", "resources": {"claims": [{"name": "gpu"}]}}]}})
    _failed_prepare(kube, "ml", pod)
    root = synthetic_node(node_dir / "root", "healthy")
    (root / "var/lib/kubelet/plugins_registry").mkdir(parents=True)  # the kubelet's registry, without the driver
    agent = _agent(kube, k8s, node, root)
    for _ in range(2):
        r = agent.check()
    [f] = [f for f in r.findings if f.code == "GPU-K8S-020"]
    assert f.status == Status.CONFIRMED and "2 device(s)" in f.summary
    assert any(REG in e.source for e in f.evidence)
    assert ("pod", "trainer-0", "ml") in {(x.kind, x.name, x.namespace) for x in f.affected}
    c = conditions_of(kube, node)["GPUDevicePlugin"]
    assert (c["status"], c["reason"]) == ("True", "GpuK8s020")

    # the plugin comes back (its sockets): good, and after debounce_clear checks the condition clears
    sock(root, REG).touch()
    sock(root, DRA_SOCK).touch()
    for _ in range(3):
        r = agent.check()
        assert "GPU-K8S-020" not in {f.code for f in r.findings}
    assert r.transitions.get("GPU-K8S-020") == "cleared"
    assert conditions_of(kube, node)["GPUDevicePlugin"]["status"] == "False"


@pytest.mark.rule("GPU-K8S-021", "positive")
@pytest.mark.rule("GPU-K8S-021", "clears")
def test_empty_slices_past_the_grace_raise_and_clear_when_republished(clean, k8s, node_dir):
    kube = clean
    node = k8s.name("dra-node")
    make_node(kube, node)
    make_slice(kube, node, devices=0)
    root = synthetic_node(node_dir / "root", "healthy")  # one GPU in its driver facts
    sock(root, REG).touch()
    sock(root, DRA_SOCK).touch()
    # just published: the driver may still be starting: nothing raised
    agent = _agent(kube, k8s, node, root)
    for _ in range(2):
        assert "GPU-K8S-021" not in {f.code for f in agent.check().findings}
    # ten minutes on (the agent's clock), still empty: raised
    later = _agent(kube, k8s, node, root)
    later.clock = lambda: time.time() + 600
    for _ in range(2):
        r = later.check()
    [f] = [f for f in r.findings if f.code == "GPU-K8S-021"]
    assert f.status == Status.CONFIRMED and GPU_UUID in str(f.evidence)
    # the driver republishes a newer generation with the device: clears
    make_slice(kube, node, devices=1, generation=2)
    for _ in range(3):
        r = later.check()
        assert "GPU-K8S-021" not in {f.code for f in r.findings}
    assert r.transitions.get("GPU-K8S-021") == "cleared"


# -- one GPU fenced, under the chart's identity ----------------------------------------------------
def _server(authz):
    try:
        return start_apiserver(authz=authz)
    except ApiServerUnavailable as exc:
        pytest.skip(f"REAL API SERVER UNAVAILABLE: {exc}")


def lost_gpu(uuid=GPU_UUID):
    return Finding("GPU-HW-002", Status.CONFIRMED, Severity.CRITICAL, "GPU fell off the bus", "Xid 79",
                   family="hardware", affected=[Affected("gpu", uuid)])


def _rule_of(authz, role_label, index):
    kind, _, rest = role_label.partition("/")
    roles = authz["clusterRoles"] if kind == "ClusterRole" else authz["roles"]
    name = rest.rpartition("/")[2]
    return next(r for r in roles if r["metadata"]["name"] == name)["rules"][index]


@pytest.mark.parametrize("mode", ["off", "dry-run", "on"])
def test_dra_grants_are_exactly_what_the_agent_uses_and_the_fence_is_confined(mode, node_dir):
    """Under the chart's identity, RBAC and policy: no request refused, and every grant the DRA option
    adds (resource.k8s.io, pods list and events list in mode off) used; in mode on one GPU of two fenced
    and unfenced, and another node's agent refused both on this node's device."""
    authz, ids = chart_authz(mode, {"execute": False}, ["gpu-a", "gpu-b"],
                             values={"agent": {"remediate": mode, "dra_driver": DRIVER}})
    with _server(authz) as s:
        admin = Kube(s.api_client())
        for ns in (ids.namespace, "ml"):
            ensure_namespace(admin, ns)
        for n in ("gpu-a", "gpu-b"):
            make_node(admin, n)
            make_slice(admin, n)
        pending = admin.request("POST", "/api/v1/namespaces/ml/pods", {
            "metadata": {"name": "trainer-0", "namespace": "ml"},
            "spec": {"nodeName": "gpu-a", "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                     "containers": [{"name": "t", "image": "registry.example/x:1"}]}})
        _failed_prepare(admin, "ml", pending)
        root = synthetic_node(node_dir / "root", "healthy")
        (root / "var/lib/kubelet/plugins_registry").mkdir(parents=True)
        a = new_agent(Kube(s.api_client(ids.agent_token("gpu-a"))), "gpu-a", HostRoot(str(root)), ids.namespace,
                      remediate=mode, dra_driver=DRIVER)[0]
        a.check()  # the plugin's sockets are absent: GPU-K8S-020 observed, the pending pod's Events read
        assert any(f.code == "GPU-K8S-020" for f in a.check().findings)

        if mode != "off":
            # GPU gpu-0 of two falls off the bus: a DeviceTaintRule on exactly it, not a node taint
            plan, outs = a._remediate([lost_gpu()])
            want = "done" if mode == "on" else "dry-run"
            assert [(o.action.kind, o.action.target.name, o.result) for o in outs] == \
                [("taint-device", f"{DRIVER}/gpu-a/gpu-0", want)]
        if mode == "on":
            [rule] = admin.list(f"{R}/v1beta2/devicetaintrules")["items"]
            assert rule["spec"] == {"deviceSelector": {"driver": DRIVER, "pool": "gpu-a", "device": "gpu-0"},
                                    "taint": {"key": "gpuwarden.io/unhealthy", "value": "hardware", "effect": "NoSchedule"}}
            assert not admin.get_node("gpu-a")["spec"].get("taints")
            ev = admin.list_events(field_selector="reason=TaintedDevice")
            assert ev and ev[0]["involvedObject"]["name"] == "gpu-a" and "gpu-0" in ev[0]["message"]
            assert a._remediate([lost_gpu()])[1] == []  # fenced already
            # the GPU is healthy again (no raised finding names it): the rule is removed
            outs = a._remediate([])[1]
            assert [(o.action.kind, o.result) for o in outs] == [("untaint-device", "done")]
            assert admin.list(f"{R}/v1beta2/devicetaintrules")["items"] == []

        refused, unused = least_privilege_report(s.audit(), authz, ids.agent_user)
        assert not refused, refused
        dra_rules = [u for u in unused if "resource.k8s.io" in _rule_of(authz, u[0], u[1]).get("apiGroups", [])]
        assert not dra_rules, f"DRA grants never used: {dra_rules}"
        if mode == "off":  # granted only for DRA in this mode
            lists = {(tuple(_rule_of(authz, r, i)["resources"]), v) for r, i, v in unused}
            assert (("pods",), "list") not in lists and (("events",), "list") not in lists

        if mode == "on":
            # confined to its node: the agent of gpu-b may not fence a device of gpu-a, nor remove its fence
            b = Kube(s.api_client(ids.agent_token("gpu-b")))
            with pytest.raises(KubeError) as e:
                dra.create_taint_rule(b, dra.taint_rule(dra.DeviceRef(DRIVER, "gpu-a", "gpu-1"), "gpu-b"))
            assert "may taint only one device of its own node" in str(e.value)
            pool = dra.taint_rule(dra.DeviceRef(DRIVER, "gpu-b", "gpu-1"), "gpu-b")
            del pool["spec"]["deviceSelector"]["device"]  # its own node's whole pool: refused too
            with pytest.raises(KubeError):
                dra.create_taint_rule(b, pool)
            dra.create_taint_rule(Kube(s.api_client(ids.agent_token("gpu-a"))),
                                  dra.taint_rule(dra.DeviceRef(DRIVER, "gpu-a", "gpu-1"), "gpu-a"))
            [ra] = dra.own_taint_rules(admin, "gpu-a", "v1beta2")
            with pytest.raises(KubeError):
                dra.delete_taint_rule(b, ra)
            assert len(admin.list(f"{R}/v1beta2/devicetaintrules")["items"]) == 1


def test_noexecute_fence_only_when_enabled(clean, k8s, node_dir):
    kube = clean
    node = k8s.name("dra-node")
    make_node(kube, node)
    make_slice(kube, node)
    root = synthetic_node(node_dir / "root", "healthy")
    agent = _agent(kube, k8s, node, root, remediate="on", device_taint_effect="NoExecute")
    outs = agent._remediate([lost_gpu(OTHER_UUID)])[1]
    assert [(o.action.kind, o.result) for o in outs] == [("taint-device", "done")]
    [rule] = dra.own_taint_rules(kube, node, "v1beta2")
    assert rule["spec"]["taint"]["effect"] == "NoExecute" and rule["spec"]["deviceSelector"]["device"] == "gpu-1"
    # dry-run: the exact object printed, nothing created
    dry, out = new_agent(kube, node, HostRoot(str(root)), k8s.namespace, dra_driver=DRIVER, remediate="dry-run")
    outs = dry._remediate([lost_gpu(GPU_UUID)])[1]
    assert [(o.action.kind, o.result) for o in outs] == [("untaint-device", "dry-run"), ("taint-device", "dry-run")]
    assert '"device": "gpu-0"' in out.getvalue() and len(dra.own_taint_rules(kube, node, "v1beta2")) == 1


def test_dra_reads_cost_a_few_selected_requests_per_check(clean, k8s, node_dir):
    """Cost grows with the node's work, not the cluster: with remediation off, DRA adds two selected
    lists per check (the node's pods, its slices) and one Events list per pending pod with claims;
    other nodes' slices (100 here) are never read."""
    kube = clean
    node = k8s.name("dra-node")
    make_node(kube, node)
    make_slice(kube, node)
    for i in range(100):
        make_slice(kube, f"{node}-other-{i}", name=f"{node}-other-{i}")
    root = synthetic_node(node_dir / "root", "healthy")
    sock(root, REG).touch()

    def per_check(**kw):
        a = new_agent(Kube(k8s.server.api_client()), node, HostRoot(str(root)), k8s.namespace, **kw)[0]
        a.check()
        before = a.kube.requests
        for _ in range(3):
            a.check()
        return (a.kube.requests - before) / 3

    assert per_check(dra_driver=DRIVER) - per_check() == 2
