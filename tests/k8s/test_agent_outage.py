"""The agent through API outages, against the real test API server: the API cut off (a proxy that
refuses the agent's connections), and etcd stopped behind a running API server (requests hang).

Nothing the agent decides is lost: Events and condition changes wait in its outbox on the node's
disk (across a restart too) and are delivered when the API serves again; no check waits for the API
longer than one call's deadline; a restarted agent never clears a condition it did not observe clear.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from gpuwarden.examples import open_example
from gpuwarden.kube.client import Kube
from tests.support.agent_kube import (KUBELET_READY, conditions_of, ensure_namespace, make_node,
                                      new_agent, our_events)
from tests.support.slowproxy import SlowProxy

pytestmark = pytest.mark.apiserver


def _proxied(k8s, proxy: SlowProxy, timeout_s: float = 2.0) -> Kube:
    api = k8s.server.api_client()
    api.configuration.host = proxy.url
    return Kube(api, timeout_s=timeout_s)


def _reopen(kb: Kube) -> None:
    """Let the next call through at once (the test does not wait out the backoff window)."""
    kb._down_until = 0.0


def test_events_and_conditions_decided_during_an_outage_arrive_after_it_also_across_a_restart(kube, k8s, tmp_path):
    node = k8s.name("gpu-node")
    make_node(kube, node)
    host, port = k8s.server.url.rsplit("//", 1)[1].split(":")
    with SlowProxy(host, int(port)) as proxy:
        proxy.cut = True  # the API is away from the start
        kb = _proxied(k8s, proxy)
        agent, _ = new_agent(kb, node, open_example("uvm-missing"), k8s.namespace, state_dir=str(tmp_path))
        t0 = time.monotonic()
        agent.check()
        r = agent.check()
        assert r.transitions == {"GPU-DEV-001": "raised"}
        assert time.monotonic() - t0 < 5, "a check waited for the API"
        assert any("waiting for the API server" in e for e in r.errors)
        box = agent.outbox
        assert [e["body"]["reason"] for e in box.events][:1] == ["GpuDev001"]
        assert box.conditions["GPUDeviceAccess"]["status"] == "True"
        raised_at = box.events[0]["body"]["firstTimestamp"]
        assert (tmp_path / "outbox.json").exists()
        assert our_events(kube, node, "default") == []

        # the agent restarts during the outage: the outbox is read back from the node's disk
        agent2, _ = new_agent(_proxied(k8s, proxy), node, open_example("uvm-missing"), k8s.namespace,
                              state_dir=str(tmp_path))
        assert [e["body"]["reason"] for e in agent2.outbox.events] == [e["body"]["reason"] for e in box.events]
        agent2.check()

        proxy.cut = False  # the API is back
        _reopen(agent2.kube)
        agent2.check()
        ours = [e for e in our_events(kube, node, "default") if e["reason"] == "GpuDev001"]
        node_events = [e for e in ours if "related" not in e]
        assert len(node_events) == 1, node_events
        assert node_events[0]["firstTimestamp"] == raised_at  # when it was decided, not when delivered
        pod_events = [e for e in ours if (e.get("related") or {}).get("kind") == "Pod"]
        assert pod_events, "the pod's Warning Event was lost"
        gda = conditions_of(kube, node)["GPUDeviceAccess"]
        assert (gda["status"], gda["reason"]) == ("True", "GpuDev001")
        assert agent2.outbox.pending == 0
        assert not (tmp_path / "outbox.json").read_text().count("GpuDev001")
        # delivered once: another check adds nothing
        agent2.check()
        assert len([e for e in our_events(kube, node, "default") if e["reason"] == "GpuDev001"]) == 2  # node's, pod's


def test_a_restarted_agent_does_not_clear_a_condition_it_did_not_observe_clear(kube, k8s, tmp_path):
    """A previous agent left GPUDriver=True. The new one starts while the API is away and its checks find
    nothing (a healthy example): when the API returns it must not publish GPUDriver=False at once."""
    node = k8s.name("gpu-node")
    left = {"type": "GPUDriver", "status": "True", "reason": "GpuDrv003", "message": "GPU-DRV-003: Xid 79",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    make_node(kube, node, conditions=[KUBELET_READY, left])
    host, port = k8s.server.url.rsplit("//", 1)[1].split(":")
    with SlowProxy(host, int(port)) as proxy:
        proxy.cut = True
        kb = _proxied(k8s, proxy)
        agent, _ = new_agent(kb, node, open_example("healthy"), k8s.namespace, state_dir=str(tmp_path),
                             debounce_clear=3)
        for _ in range(3):  # clean checks the agent could not report
            agent.check()
        assert conditions_of(kube, node)["GPUDriver"]["status"] == "True"
        proxy.cut = False
        _reopen(kb)
        agent.check()  # reads the Node first: GPUDriver=True is carried over, not flipped
        conds = conditions_of(kube, node)
        assert conds["GPUDriver"]["status"] == "True"
        assert conds["GPUDriver"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
        assert conds["GPUDeviceAccess"]["status"] == "False"  # absent types are declared healthy
        for _ in range(3):  # debounce_clear clean observations after it was read: now it clears
            agent.check()
        assert conditions_of(kube, node)["GPUDriver"]["status"] == "False"


def test_etcd_stopped_behind_the_api_server_costs_a_check_one_deadline(k8s, tmp_path):
    """etcd frozen (SIGSTOP): the API server accepts requests and never answers them. Each check pays at
    most one call's deadline (no urllib3 retries, then backoff), the fault's Events wait in the outbox,
    and are delivered once etcd is back."""
    from tests.support.apiserver import start_apiserver

    with start_apiserver() as s:
        admin = Kube(s.api_client())
        ensure_namespace(admin, "ml")
        node = "gpu-node-etcd"
        make_node(admin, node)
        kb = Kube(s.api_client(), timeout_s=1.0)
        agent, _ = new_agent(kb, node, open_example("uvm-missing"), "default", state_dir=str(tmp_path))
        etcd = s._procs[0]
        os.kill(etcd.pid, signal.SIGSTOP)
        try:
            durations = []
            for _ in range(3):
                t0 = time.monotonic()
                agent.check()
                durations.append(time.monotonic() - t0)
            assert max(durations) < 2.5, durations  # one 1 s deadline, then the backoff answers at once
            assert agent.debounce.raised("GPU-DEV-001")
            assert any(e["body"]["reason"] == "GpuDev001" for e in agent.outbox.events)
        finally:
            os.kill(etcd.pid, signal.SIGCONT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # the API server reconnects to etcd (seconds; more on a busy host)
            try:
                admin.get_node(node)
                break
            except Exception:
                admin._down_until = 0.0
                time.sleep(0.5)
        for _ in range(20):
            _reopen(kb)
            agent.check()
            if agent.outbox.pending == 0:
                break
            time.sleep(0.5)
        assert agent.outbox.pending == 0
        assert [e for e in our_events(admin, node, "default") if e["reason"] == "GpuDev001"]
        assert conditions_of(admin, node)["GPUDeviceAccess"]["status"] == "True"


def test_a_condition_changed_during_an_outage_after_the_node_was_read_keeps_its_decision_time(kube, k8s, tmp_path):
    """Issue 29: the agent had read its Node; the API goes away and a fault is raised; the change must
    wait in the outbox with the time it was decided, and reach the Node with that lastTransitionTime
    once the API is back, not be stamped with the delivery time."""
    from gpuwarden.parsers.wallclock import rfc3339_epoch

    node = k8s.name("gpu-node")
    make_node(kube, node)
    host, port = k8s.server.url.rsplit("//", 1)[1].split(":")
    with SlowProxy(host, int(port)) as proxy:
        kb = _proxied(k8s, proxy)
        agent, _ = new_agent(kb, node, open_example("uvm-missing"), k8s.namespace, state_dir=str(tmp_path))
        assert agent.check().transitions == {}  # the Node is read and our types declared; nothing raised yet
        assert conditions_of(kube, node)["GPUDeviceAccess"]["status"] == "False"
        proxy.cut = True
        decided = time.time()
        r = agent.check()
        assert r.transitions == {"GPU-DEV-001": "raised"}
        waiting = agent.outbox.conditions["GPUDeviceAccess"]
        assert waiting["status"] == "True"
        assert abs(rfc3339_epoch(waiting["lastTransitionTime"]) - decided) <= 1.5
        time.sleep(2.2)  # the outage lasts: delivery is seconds after the decision
        proxy.cut = False
        _reopen(kb)
        delivered = time.time()
        agent.check()
        gda = conditions_of(kube, node)["GPUDeviceAccess"]
        assert (gda["status"], gda["reason"]) == ("True", "GpuDev001")
        assert gda["lastTransitionTime"] == waiting["lastTransitionTime"]
        assert rfc3339_epoch(gda["lastTransitionTime"]) < delivered - 1.0
        assert agent.outbox.pending == 0


def test_a_condition_changed_during_an_outage_before_the_node_was_read_is_held(kube, k8s, tmp_path):
    """The negative: an agent that never read its Node plans nothing against a guess (hold(): problems
    only), and its publisher queues no change from publish()."""
    node = k8s.name("gpu-node")
    make_node(kube, node)
    host, port = k8s.server.url.rsplit("//", 1)[1].split(":")
    with SlowProxy(host, int(port)) as proxy:
        proxy.cut = True
        kb = _proxied(k8s, proxy)
        agent, _ = new_agent(kb, node, open_example("healthy"), k8s.namespace, state_dir=str(tmp_path))
        agent.check()
        agent.check()
        assert agent.outbox.conditions == {}  # nothing False is sent for a Node never read


def test_an_event_raised_again_by_a_restarted_agent_during_the_outage_is_delivered_once_with_count_1(kube, k8s, tmp_path):
    """Issue 29: the fault's Event waits in the outbox; the agent restarts during the outage and, not
    having read its Node, raises the same fault again: that is the same occurrence, not a second one.
    Delivered once, count 1. The negative: a fault raised, cleared and raised again by one agent is two."""
    node = k8s.name("gpu-node")
    make_node(kube, node)
    host, port = k8s.server.url.rsplit("//", 1)[1].split(":")
    with SlowProxy(host, int(port)) as proxy:
        proxy.cut = True
        agent, _ = new_agent(_proxied(k8s, proxy), node, open_example("uvm-missing"), k8s.namespace,
                             state_dir=str(tmp_path))
        agent.check()
        assert agent.check().transitions == {"GPU-DEV-001": "raised"}
        agent2, _ = new_agent(_proxied(k8s, proxy), node, open_example("uvm-missing"), k8s.namespace,
                              state_dir=str(tmp_path))
        agent2.check()
        assert agent2.check().transitions == {"GPU-DEV-001": "raised"}  # it could not read its Node
        waiting = [e["body"] for e in agent2.outbox.events if e["body"]["reason"] == "GpuDev001"]
        # every Event is on the Node now (the pod's as `related`, issue 29): the Node's own is the one without
        assert [b["involvedObject"]["kind"] for b in waiting if not b.get("related")].count("Node") == 1
        assert all(b["count"] == 1 for b in waiting), [b["count"] for b in waiting]
        proxy.cut = False
        _reopen(agent2.kube)
        agent2.check()
        evs = [e for e in our_events(kube, node, "default") if e["reason"] == "GpuDev001"]
        (ev,) = [e for e in evs if not e.get("related")]
        assert ev["count"] == 1 and all(e["count"] == 1 for e in evs), [e["count"] for e in evs]
