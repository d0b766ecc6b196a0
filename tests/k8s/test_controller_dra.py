"""The controller's DRA duties against the real test API server (resource.k8s.io: ResourceSlice v1,
DeviceTaintRule v1beta2): a gpuwarden fence whose node is deleted or whose agent is silent is reported
(dry run: the exact DELETE), left alone without `fences`, deleted with `--execute --actions fences`;
a rule anyone else made is never touched; ResourceSlices of a deleted or long-NotReady node are
reported with an Event and cleared when the node is back or the slices are gone, a healthy node's
never; and all of it under the chart's controller identity and RBAC, every DRA grant used.
"""

from __future__ import annotations

import dataclasses
import json
import time
import types

import pytest
from kubernetes import client

from gpuwarden.controller.config import ControllerConfig
from gpuwarden.controller.loop import Controller
from gpuwarden.kube import dra
from gpuwarden.kube.client import Kube
from gpuwarden.kube.informer import start_informers
from gpuwarden.parsers.wallclock import format_rfc3339
from tests.k8s.controller_world import Cluster
from tests.support.agent_kube import ensure_namespace
from tests.k8s.test_dra_api import _rule_of, _server
from tests.support.rbac import chart_authz, least_privilege_report

pytestmark = pytest.mark.apiserver

DRIVER = "gpu.nvidia.com"
R = "/apis/resource.k8s.io"
HOUR = 3600.0


def make_slice(kube: Kube, node: str, devices: int = 2) -> dict:
    return kube.request("POST", f"{R}/v1/resourceslices", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd"}}}
                             for i in range(devices)]}})


def our_fence(kube: Kube, node: str, device: str = "gpu-1") -> dict:
    """The rule a node's agent makes on one device (kube.dra.taint_rule), as the agent creates it."""
    rule = dra.taint_rule(dra.DeviceRef(DRIVER, node, device), node, value="hardware", finding="GPU-HW-002")
    return kube.request("POST", f"{R}/v1beta2/devicetaintrules", rule)


def foreign_fence(kube: Kube, node: str, name: str, labels: dict | None = None) -> dict:
    """An operator's (or another tool's) rule on the same device: never gpuwarden's to remove."""
    return kube.request("POST", f"{R}/v1beta2/devicetaintrules", {
        "apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"deviceSelector": {"driver": DRIVER, "pool": node, "device": "gpu-1"},
                 "taint": {"key": "example.com/repair", "effect": "NoSchedule"}}})


def rule_names(kube: Kube) -> set[str]:
    return {r["metadata"]["name"] for r in kube.iter_items(f"{R}/v1beta2/devicetaintrules")}


def agent_reported(c: Cluster, node: str, at: float) -> None:
    """gpuwarden's agent on `node` wrote its conditions (heartbeat) at `at`."""
    c.v1.patch_node_status(node, {"status": {"conditions": [{
        "type": "GPUDeviceAccess", "status": "False", "reason": "NoGPUDeviceAccessProblem", "message": "ok",
        "lastHeartbeatTime": format_rfc3339(at), "lastTransitionTime": format_rfc3339(at - 60)}]}})


def controller(c: Cluster, clock=None, token: str = "", **kw) -> Controller:
    """A controller of the pool; with a `clock` of its own, no Lease (time jumps would end its leadership)."""
    opts = {"leader_elect": clock is None, "namespace": c.gw, "agent_namespace": c.gw, "identity": "ctl-a", "node_selector": c.selector,
            "watch": False, "log_format": "text", "listen": "", "dra_driver": DRIVER, **kw}
    cfg = dataclasses.replace(ControllerConfig(), **opts)
    cfg.validate()
    api = c.k8s.server.api_client(token) if token else c.k8s.server.api_client()
    return Controller(cfg, Kube(api, timeout_s=10.0), clock=clock or time.time)


def events(kube: Kube, reason: str, name: str = "") -> list[dict]:
    sel = f"reason={reason}" + (f",involvedObject.name={name}" if name else "")
    return kube.list_events(field_selector=sel)


@pytest.fixture
def world(kube, k8s):
    c = Cluster(k8s)
    yield c, kube
    for path in (f"{R}/v1/resourceslices", f"{R}/v1beta2/devicetaintrules"):
        for o in kube.iter_items(path):
            kube.request("DELETE", f"{path}/{o['metadata']['name']}")
    for n in c.nodes:  # the fleet view of later tests lists every node of the cluster
        kube.get_or_none(f"/api/v1/nodes/{n}") and c.v1.delete_node(n)


# -- fences that outlive their node ------------------------------------------------------------------
def test_fence_of_a_deleted_node_is_reported_in_dry_run_and_deleted_only_with_fences(world):
    c, kube = world
    gone, live = c.nodes[0], c.nodes[1]
    agent_reported(c, live, time.time())
    mine = our_fence(kube, gone)
    kept = our_fence(kube, live)  # its node is there and its agent reports: not orphaned
    # an operator's rule on the gone node's device; a lookalike wearing our labels but not our name
    foreign_fence(kube, gone, "repair-gpu-1")
    foreign_fence(kube, gone, "lookalike", {dra.NODE_LABEL: gone, dra.MANAGED_LABEL: dra.MANAGED_BY})
    c.v1.delete_node(gone)

    # made after the deletion: a controller of the whole cluster (one of a pool judges only nodes it saw)
    dry = controller(c, node_selector="")
    [d] = [d for d in dry.step() if d.kind == "orphaned-fence"]
    assert d.subject == mine["metadata"]["name"] and d.outcomes[0].result == "dry-run"
    # the exact request and object it would delete, in the Event
    [ev] = events(kube, "OrphanedDeviceFence", mine["metadata"]["name"])
    assert f"DELETE {R}/v1beta2/devicetaintrules/{mine['metadata']['name']} (precondition uid={mine['metadata']['uid']})" \
        in ev["message"]
    assert '"device":"gpu-1"' in ev["message"] and f"node {gone} does not exist" in ev["message"]
    assert ev["involvedObject"]["kind"] == "DeviceTaintRule" and ev["type"] == "Warning"
    assert not [d for d in dry.step() if d.kind == "orphaned-fence"]  # reported once
    assert len(events(kube, "OrphanedDeviceFence", mine["metadata"]["name"])) == 1

    # --execute without `fences` among the actions: reported only
    plain = controller(c, execute=True, identity="ctl-b", lease_name="other-lease", node_selector="")
    [d] = [d for d in plain.step() if d.kind == "orphaned-fence"]
    assert d.outcomes[0].result == "skipped" and "without fences" in d.outcomes[0].detail
    assert mine["metadata"]["name"] in rule_names(kube)

    acting = controller(c, execute=True, actions=["workload", "node", "fences"], identity="ctl-c", lease_name="l3",
                        node_selector="")
    [d] = [d for d in acting.step() if d.kind == "orphaned-fence"]
    assert d.outcomes[0].result == "done" and d.outcomes[0].detail.startswith("deleted DeviceTaintRule")
    assert rule_names(kube) >= {kept["metadata"]["name"], "repair-gpu-1", "lookalike"}
    assert mine["metadata"]["name"] not in rule_names(kube)
    [ev] = events(kube, "OrphanedDeviceFenceDeleted", mine["metadata"]["name"])
    assert ev["type"] == "Normal"
    assert not [d for d in acting.step() if d.kind == "orphaned-fence"]  # nothing left: the foreign ones stay
    assert {"repair-gpu-1", "lookalike"} <= rule_names(kube)


def test_fence_of_a_node_whose_agent_is_silent_is_orphaned_after_the_stated_time(world):
    c, kube = world
    node = c.nodes[0]
    now = [time.time()]
    agent_reported(c, node, now[0])
    rule = our_fence(kube, node)
    ctl = controller(c, clock=lambda: now[0], execute=True, actions=["fences"], fence_orphan_s=1800)
    assert not [d for d in ctl.step() if d.kind == "orphaned-fence"]  # the agent reports: its fence
    now[0] += 1799  # silent, but not long enough yet
    assert not [d for d in ctl.step() if d.kind == "orphaned-fence"]
    now[0] += 2
    [d] = [d for d in ctl.step() if d.kind == "orphaned-fence"]
    assert d.outcomes[0].result == "done" and "last reported 30m ago" in d.summary
    assert rule["metadata"]["name"] not in rule_names(kube)


def test_an_orphan_report_clears_when_the_agent_reports_again(world):
    c, kube = world
    node = c.nodes[0]
    now = [time.time() + 2 * HOUR]
    agent_reported(c, node, now[0] - 2 * HOUR)
    rule = our_fence(kube, node)
    ctl = controller(c, clock=lambda: now[0])  # dry run
    [d] = [d for d in ctl.step() if d.kind == "orphaned-fence"]
    assert d.outcomes[0].result == "dry-run" and ctl.dra.orphans
    assert ctl.registry.get_sample_value("gpuwarden_controller_orphaned_device_fences") == 1
    agent_reported(c, node, now[0])  # the agent is back: its fence is its own business again
    assert not [d for d in ctl.step() if d.kind == "orphaned-fence"]
    assert not ctl.dra.orphans and ctl.registry.get_sample_value("gpuwarden_controller_orphaned_device_fences") == 0
    assert rule["metadata"]["name"] in rule_names(kube)


def test_fences_are_deleted_within_the_token_bucket_and_by_the_leader_only(world):
    c, kube = world
    ctl = controller(c, execute=True, actions=["fences"], max_fence_deletes=2, fence_deletes_per_hour=0)
    ctl.step()  # the pool's nodes seen
    for n in c.nodes:
        our_fence(kube, n)
        c.v1.delete_node(n)
    got = [d.outcomes[0].result for d in ctl.step() if d.kind == "orphaned-fence"]
    assert sorted(got) == ["done", "done", "skipped"]
    assert len([r for r in kube.iter_items(f"{R}/v1beta2/devicetaintrules")
                if r["metadata"]["labels"].get(dra.NODE_LABEL) in c.nodes]) == 1
    # a second instance does not hold the Lease: it reconciles nothing, deletes nothing
    other = controller(c, execute=True, actions=["fences"], identity="ctl-z")
    assert other.step() is None


def test_the_running_controller_watches_and_deletes_a_fence_whose_node_goes(world):
    """Controller.run with its watches: the node's deletion and the rule arrive by watch, the fence goes."""
    import threading

    c, kube = world
    node = c.nodes[0]
    ctl = controller(c, watch=True, interval_s=1.0, execute=True, actions=["fences"])
    t = threading.Thread(target=ctl.run, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while ctl.dra is None or ctl.dra.rules is None or not ctl.dra.rules.ever_synced:
            assert time.monotonic() < deadline, "the rules' watch never synced"
            time.sleep(0.2)
        rule = our_fence(kube, node)
        c.v1.delete_node(node)
        while rule["metadata"]["name"] in rule_names(kube):
            assert time.monotonic() < deadline, "the orphaned fence was not deleted"
            time.sleep(0.2)
        assert events(kube, "OrphanedDeviceFenceDeleted", rule["metadata"]["name"])
    finally:
        ctl.stop()
        t.join(20)
    assert not t.is_alive()


# -- ResourceSlices of a dead node -------------------------------------------------------------------
def test_slices_of_a_notready_node_are_reported_after_the_stated_time_and_clear(world):
    c, kube = world
    sick, healthy = c.nodes[0], c.nodes[1]
    for n in (sick, healthy):
        make_slice(kube, n)
    now = [time.time()]
    ctl = controller(c, clock=lambda: now[0], slice_stale_s=600)
    c.node_fails(sick)
    assert not [d for d in ctl.step() if d.kind.startswith("stale-slices")]  # NotReady, not for long yet
    now[0] += 601
    [d] = [d for d in ctl.step() if d.kind.startswith("stale-slices")]
    assert (d.kind, d.subject) == ("stale-slices", sick) and "advertise 2 device(s)" in d.summary
    assert [o.result for o in d.outcomes] == ["skipped"]  # a report, never an action on the slices
    [ev] = events(kube, "StaleResourceSlices", sick)
    assert "Ready=Unknown" in ev["message"] and "141912" in ev["message"]
    assert not events(kube, "StaleResourceSlices", healthy)
    assert ctl.registry.get_sample_value("gpuwarden_controller_stale_resourceslice_nodes") == 1
    assert not [d for d in ctl.step() if d.kind.startswith("stale-slices")]  # once per episode
    c.v1.patch_node_status(sick, {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                                             "lastTransitionTime": format_rfc3339(now[0])}]}})
    [d] = [d for d in ctl.step() if d.kind.startswith("stale-slices")]
    assert d.kind == "stale-slices-cleared" and events(kube, "StaleResourceSlicesCleared", sick)
    assert ctl.registry.get_sample_value("gpuwarden_controller_stale_resourceslice_nodes") == 0
    assert len(list(kube.iter_items(f"{R}/v1/resourceslices", field_selector=f"spec.nodeName={sick}"))) == 1


def test_slices_of_a_deleted_node_are_reported_until_they_are_gone(world, k8s):
    c, kube = world
    gone = c.nodes[0]
    s = make_slice(kube, gone)
    outside = k8s.name("cpu-pool")  # a node outside the controller's pool: it exists, its slices are not stale
    c.v1.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": outside}})
    make_slice(kube, outside)
    ctl = controller(c)  # of the pool
    assert not [d for d in ctl.step() if d.kind == "stale-slices" and d.subject in (gone, outside)]
    late = controller(c, identity="ctl-late", lease_name="late")  # started after the deletion
    c.v1.delete_node(gone)
    assert not [d for d in late.step() if d.subject in (gone, outside)]  # never saw it in its pool: not its call
    stale = [d for d in ctl.step() if d.kind == "stale-slices"]
    assert [d.subject for d in stale if d.subject in (gone, outside)] == [gone]
    assert f"node {gone} does not exist" in stale[[d.subject for d in stale].index(gone)].summary
    kube.request("DELETE", f"{R}/v1/resourceslices/{s['metadata']['name']}")
    cleared = [d for d in ctl.step() if d.kind == "stale-slices-cleared"]
    assert gone in [d.subject for d in cleared]
    c.v1.delete_node(outside)


def test_cost_two_selected_lists_per_reconcile_and_no_request_per_foreign_node(world, k8s):
    """Without watches, --dra-driver adds exactly two lists per reconcile (the driver's slices, our
    rules), whatever the number of other pools' nodes with slices (60 here, none in the pool's cache):
    no per-node request; with watches, none (the caches follow the server)."""
    c, kube = world
    for i in range(60):
        n = f"{c.pool}-other-{i}"
        c.v1.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}})
        make_slice(kube, n)
    make_slice(kube, c.nodes[0])

    def per_reconcile(**kw) -> float:
        ctl = controller(c, leader_elect=False, **kw)
        ctl.reconcile()
        before = ctl.kube.requests
        for _ in range(3):
            ctl.reconcile()
        return (ctl.kube.requests - before) / 3

    assert per_reconcile() - per_reconcile(dra_driver="") == 2
    for i in range(60):
        c.v1.delete_node(f"{c.pool}-other-{i}")


# -- the fleet view: advertised devices against usable GPUs -------------------------------------------
def test_fleet_counts_advertised_devices_against_usable_and_names_dead_nodes_slices(world, k8s):
    from click.testing import CliRunner

    from gpuwarden.cli import main

    c, kube = world
    lost, healthy, gone = c.nodes
    for n in c.nodes:
        make_slice(kube, n)
    gpu1 = "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"  # make_slice's gpu-1
    now = time.time()
    c.v1.patch_node_status(lost, {"status": {"conditions": [{
        "type": "GPUHardware", "status": "True", "reason": "GPUFellOffTheBus",
        "message": f"GPU-HW-002 [GPU 1 (0000:3b:00.0) {gpu1}]: GPU fell off the bus (Xid 79)",
        "lastHeartbeatTime": format_rfc3339(now), "lastTransitionTime": format_rfc3339(now)}]}})
    c.v1.delete_node(gone)

    def view() -> dict:
        r = CliRunner().invoke(main, ["fleet", "--kubeconfig", k8s.server.kubeconfig_path, "--format", "json",
                                      "--dra-driver", DRIVER])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)

    v = view()
    rows = {r["name"]: r for r in v["nodes"]}
    assert rows[lost]["draDevices"] == {"advertised": 2, "fenced": 0, "lost": 1, "usable": 1,
                                        "offeredLost": [f"{DRIVER}/{lost}/gpu-1"], "overcounted": True}
    assert rows[healthy]["draDevices"] == {"advertised": 2, "fenced": 0, "lost": 0, "usable": 2, "offeredLost": [],
                                           "overcounted": False}
    [st] = [s for s in v["staleSlices"] if s["node"] == gone]
    assert st["gone"] and st["devices"] == 2 and not [s for s in v["staleSlices"] if s["node"] in (lost, healthy)]
    r = CliRunner().invoke(main, ["fleet", "--kubeconfig", k8s.server.kubeconfig_path, "--dra-driver", DRIVER])
    assert f"node {lost}: ResourceSlices advertise 2 GPU device(s), 0 fenced, usable 1; lost and still offered: " \
           f"{DRIVER}/{lost}/gpu-1" in r.output
    assert f"node {healthy}:" not in r.output and f"node {gone}: 1 ResourceSlice(s) still advertise 2 device(s)" in r.output

    # the agent fenced the lost GPU: counted, no longer offered
    our_fence(kube, lost)
    assert {r["name"]: r for r in view()["nodes"]}[lost]["draDevices"] == {
        "advertised": 2, "fenced": 1, "lost": 1, "usable": 1, "offeredLost": [], "overcounted": False}
    # with a selector the list is one pool: a node missing from it is not called deleted
    r = CliRunner().invoke(main, ["fleet", "--kubeconfig", k8s.server.kubeconfig_path, "--format", "json",
                                  "-l", c.selector, "--dra-driver", DRIVER])
    assert "draDevices" not in json.loads(CliRunner().invoke(
        main, ["fleet", "--kubeconfig", k8s.server.kubeconfig_path, "--format", "json"]).output)["nodes"][0]
    assert not [s for s in json.loads(r.output)["staleSlices"] if s["node"] == gone]


# -- the chart's controller identity and RBAC ----------------------------------------------------------
@pytest.mark.parametrize("controller_values", [{"execute": False},
                                               {"execute": True, "actions": ["workload", "node", "fences"]}],
                         ids=["dry-run", "fences"])
def test_controller_dra_grants_are_exactly_what_it_uses(controller_values):
    authz, ids = chart_authz("off", controller_values, [], values={"agent": {"remediate": "off", "dra_driver": DRIVER}})
    dtr = [r for r in authz["clusterRoles"] if "controller" in r["metadata"]["name"]
           for r in r["rules"] if "devicetaintrules" in r.get("resources", [])]
    assert [r["verbs"] for r in dtr] == [["list", "watch", "delete"] if controller_values["execute"] else ["list", "watch"]]
    with _server(authz) as s:
        admin_api = s.api_client()
        admin = Kube(admin_api)
        ensure_namespace(admin, ids.namespace)
        client.CoreV1Api(admin_api).create_namespace({"metadata": {"name": "work"}})
        c = Cluster(types.SimpleNamespace(api=admin_api, namespace="work", server=s))
        gone = c.nodes[0]
        make_slice(admin, gone)
        rule = our_fence(admin, gone)
        c.v1.delete_node(gone)
        ctl = controller(c, token=ids.controller_token, namespace=ids.namespace, agent_namespace=ids.namespace,
                         node_selector="",
                         execute=controller_values["execute"], actions=controller_values.get("actions", ["workload"]))
        kinds = {d.kind for d in ctl.step()}
        assert {"orphaned-fence", "stale-slices"} <= kinds
        assert (rule["metadata"]["name"] in rule_names(admin)) != controller_values["execute"]
        # the watches (list, then watch from the list's resourceVersion)
        stop = __import__("threading").Event()
        threads = start_informers(ctl.informers + [ctl.dra.rules], stop, timeout_s=10)
        stop.set()
        for inf in ctl.informers + [ctl.dra.rules]:
            inf.interrupt()
        for t in threads:
            t.join(5)
        refused, unused = least_privilege_report(s.audit(), authz, ids.controller_user)
        assert not refused, refused
        dra_unused = [u for u in unused if "resource.k8s.io" in _rule_of(authz, u[0], u[1]).get("apiGroups", [])]
        assert not dra_unused, f"DRA grants never used: {dra_unused}"


def test_fleet_dra_view_under_the_charts_viewer_role():
    """`gpuwarden fleet --dra-driver` as a person bound to the chart's kubectl viewer role (with
    agent.dra_driver set): nothing refused, and its DRA grant (resourceslices, devicetaintrules list)
    used; without agent.dra_driver the role has no DRA grant and fleet reads none by default."""
    import os

    from click.testing import CliRunner

    from gpuwarden.cli import main
    from tests.support.rbac import denied

    user, token = "alice@example.com", os.urandom(12).hex()
    authz, ids = chart_authz("off", {"execute": False}, [], values={
        "agent": {"remediate": "off", "dra_driver": DRIVER}, "kubectl": {"viewers": [{"kind": "Group", "name": "gpu-sre"}]}})
    authz["tokens"][token] = {"user": user, "groups": ["gpu-sre"], "extra": {}}
    with _server(authz) as s:
        admin = Kube(s.api_client())
        ensure_namespace(admin, ids.namespace)
        admin.request("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-a"}})
        make_slice(admin, "gpu-a")
        our_fence(admin, "gpu-a")
        r = CliRunner().invoke(main, ["fleet", "--kubeconfig", s.kubeconfig_for(token), "--format", "json",
                                      "--dra-driver", DRIVER])
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["nodes"][0]["draDevices"]["fenced"] == 1
        assert not denied(s.audit(), user)
        _, unused = least_privilege_report(s.audit(), authz, user, ("gpu-sre",))
        assert not [u for u in unused if "resource.k8s.io" in _rule_of(authz, u[0], u[1]).get("apiGroups", [])]
    plain, _ = chart_authz("off", {"execute": False}, [], values={"kubectl": {"viewers": [{"kind": "Group", "name": "x"}]}})
    assert not [r for role in plain["clusterRoles"] for r in role["rules"] if "resource.k8s.io" in r.get("apiGroups", [])]
