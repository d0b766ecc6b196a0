"""Least privilege, enforced: the agent and the controller run under the chart's own identities and
RBAC (rendered by Helm for each mode) against a test API server that authenticates their tokens and
enforces RBAC (tools/testapiserver --authz-file). A test fails on any request refused (403) and on any
granted (rule, verb, resource) the component's code never used in the scenario.
"""

from __future__ import annotations

import threading
import types

import pytest

from gpuwarden.kube.client import Kube
from gpuwarden.kube.events import node_ref
from gpuwarden.kube.informer import start_informers
from gpuwarden.root import HostRoot
from tests.support.agent_kube import ensure_namespace, make_node, make_pod, new_agent, plugin_pod
from tests.support.agent_nodes import POD_UID, synthetic_node
from tests.support.apiserver import ApiServerUnavailable, start_apiserver
from tests.support.bundles import open_dir
from tests.support.rbac import chart_authz, least_privilege_report

pytestmark = pytest.mark.apiserver

RENDER_UID = "5e0c3a7e-2b1d-4c9a-8e7f-6d5c4b3a2918"  # ml pod of the driver-memory-cascade example


def _server(authz):
    try:
        return start_apiserver(authz=authz)
    except ApiServerUnavailable as exc:
        pytest.skip(f"REAL API SERVER UNAVAILABLE: {exc}")


def _assert_least_privilege(s, authz, user):
    refused, unused = least_privilege_report(s.audit(), authz, user)
    assert not refused, f"{user} was refused: {refused}"
    assert not unused, f"{user} is granted and never used: {unused}"


# -- the agent -------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["off", "dry-run", "on"])
def test_agent_under_the_charts_rbac(mode, node_dir, tmp_path):
    nodes = ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
    # mode on: with the opt-in eviction confinement too, so the memory guard's eviction passes it
    authz, ids = chart_authz(mode, {"execute": False}, nodes, values={"nodeConfinement": {"evictions": True}})
    with _server(authz) as s:
        admin = Kube(s.api_client())
        for ns in (ids.namespace, "ml", "render"):
            ensure_namespace(admin, ns)

        def agent(node, root, **kw):
            kube = Kube(s.api_client(ids.agent_token(node)))
            return new_agent(kube, node, root, ids.namespace, remediate=mode, **kw)[0]

        # a GPU pod that lost /dev/nvidia-uvm, its device plugin; a repeated Event aggregates (patch)
        make_node(admin, "gpu-a")
        gpu = make_pod(admin, "ml", "trainer-0", "gpu-a")
        plugin_pod(admin, ids.namespace, "nvidia-device-plugin-aaaaa", "gpu-a")
        root = HostRoot(str(synthetic_node(node_dir / "root", "uvm-missing", {POD_UID: gpu["metadata"]["uid"]})))
        a = agent("gpu-a", root)
        for _ in range(3):
            a.check()
        for _ in range(2):
            a.recorder.emit(node_ref("gpu-a"), "Normal", "RbacProbe", "the same Event twice: aggregated")
        # a GPU the plugin reports lost, and a pod the kubelet rejected for it (GPU-K8S-012): the node's pods are
        # listed in every mode (pods list); with remediation on, the node is tainted (nodes patch)
        from tests.k8s.test_agent_admission_fence import plugin_lost_node, rejected_pod
        from tests.rules.test_lost_gpu import GPA_LOST

        make_node(admin, "gpu-d")
        rejected_pod(admin, "ml", "storm-0", "gpu-d", GPA_LOST)
        d = agent("gpu-d", open_dir(plugin_lost_node(tmp_path / "lost")))
        rs = [d.check() for _ in range(2)]
        assert [f.status.value for f in rs[-1].findings if f.code == "GPU-K8S-012"] == ["confirmed"]
        # a pod rejected now wakes the agent's pods source (list, then watch from its resourceVersion)
        import time

        from gpuwarden.agent.events import default_sources
        from gpuwarden.wake.pods import PodsWatch

        (w,) = [src for src in default_sources(d) if isinstance(src, PodsWatch)]
        got: list = []
        assert w.start(got.append) is None
        try:
            end = time.monotonic() + 10
            while not w.up and time.monotonic() < end:
                time.sleep(0.02)
            rejected_pod(admin, "ml", "storm-1", "gpu-d", GPA_LOST, t=time.time())
            while not got and time.monotonic() < end:
                time.sleep(0.02)
        finally:
            w.stop()
        assert got and "ml/storm-1" in got[0].detail, (got, w.why)
        if mode == "on":
            assert [(o.action.kind, o.result) for r in rs for o in r.outcomes] == [("taint-node", "done")]
        if mode == "on":
            plugin_pod(admin, ids.namespace, "nvidia-device-plugin-bbbbb", "gpu-a")  # the DaemonSet's new pod
            a.check()  # -> delete the GPU pod that lost its device
            # a critical driver fault: taint the node
            from tests.k8s.test_agent_remediation import _nvml_hang_node

            make_node(admin, "gpu-b")
            b = agent("gpu-b", _nvml_hang_node(tmp_path))
            for _ in range(2):
                b.check()
            # incident 4: the memory guard evicts the attributed pod
            make_node(admin, "gpu-c")
            render = make_pod(admin, "render", "egl-render-0", "gpu-c")
            croot = synthetic_node(node_dir / "root-c", "driver-memory-cascade", {RENDER_UID: render["metadata"]["uid"]})
            c = agent("gpu-c", HostRoot(str(croot)))
            for _ in range(2):
                c.check()
            assert "egl-render-0" not in {p["metadata"]["name"] for p in admin.list_pods(namespace="render")}
        _assert_least_privilege(s, authz, ids.agent_user)


# -- the controller --------------------------------------------------------------------------------
@pytest.mark.parametrize("controller", [{"execute": False},
                                        {"execute": True, "actions": ["workload"]},
                                        {"execute": True, "actions": ["workload", "taint"]}],
                         ids=["dry-run", "workload", "workload+taint"])
def test_controller_under_the_charts_rbac(controller):
    from tests.k8s.controller_world import Cluster
    from tests.k8s.test_controller_cascade import play_incident

    authz, ids = chart_authz("off", controller, [])
    with _server(authz) as s:
        from kubernetes import client

        admin_api = s.api_client()
        ensure_namespace(Kube(admin_api), ids.namespace)
        client.CoreV1Api(admin_api).create_namespace({"metadata": {"name": "work"}})
        k8s = types.SimpleNamespace(api=admin_api, namespace="work", server=s)
        execute = controller.get("execute", False)
        opts = dict(namespace=ids.namespace, agent_namespace=ids.namespace, execute=execute,
                    actions=controller.get("actions", ["workload"]), token=ids.controller_token)

        # a Deployment's cascade, then a Job's (owner chains through ReplicaSet and Job, both APIs)
        c = Cluster(k8s)
        c.deployment("trainer", replicas=2)
        ctl = c.controller("ctl-a", **opts)
        play_incident(c, ctl)
        j = Cluster(k8s)
        j.job("render")
        play_incident(j, j.controller("ctl-a", **opts))
        # a storm: the breaker ConfigMap is created, then (closed by an operator) opened again: patched
        storm = Cluster(k8s, n_nodes=4)
        sc = storm.controller("ctl-a", storm_nodes=3, storm_fraction=0.5, **opts)
        for n in storm.nodes[:3]:
            storm.node_fails(n)
        sc.step()
        if execute:
            client.CoreV1Api(admin_api).patch_namespaced_config_map(
                "gpuwarden-breaker", ids.namespace, {"data": {"open": "false"}})
            storm2 = Cluster(k8s, n_nodes=4)
            sc2 = storm2.controller("ctl-a", storm_nodes=3, storm_fraction=0.5, **opts)
            for n in storm2.nodes[:3]:
                storm2.node_fails(n)
            sc2.step()
        # the watches (list, then watch from the list's resourceVersion)
        stop = threading.Event()
        threads = start_informers(ctl.informers, stop, timeout_s=10)
        stop.set()
        for inf in ctl.informers:
            inf.interrupt()
        for t in threads:
            t.join(5)
        assert ctl.elector.release(ctl.history.to_json())
        _assert_least_privilege(s, authz, ids.controller_user)
