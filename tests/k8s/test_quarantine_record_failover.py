"""An action whose record is lost (issue 45 item 1), against the real test API server.

The leader quarantines the workload while it holds the Lease; then it can no longer prove the Lease
(its path to it cut right after the Deployment's PATCH was answered: what a slow or partitioned leader
sees), so its own Event is refused by its fence ("write not sent"). Before, the only Event in the
cluster was the successor's "CascadeDetected: not acting: already quarantined since …": an action
with no author and no reason. Now the record written with the action (the quarantine annotation)
names its Event, and the successor writes that Event from it: exactly one `WorkloadQuarantined`
Event, naming the leader that acted, why and when.

Two ways there: the Lease path cut at the exact moment (the race made certain, lease 3 s), and the
issue's own condition (the leader's whole path 3 s slow each way from the second hop on, client-go's
15 s / 10 s / 2 s, ~55 s).
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from kubernetes import client

from gpuwarden.controller.quarantine import ANNOTATION
from gpuwarden.kube.client import Kube
from tests.k8s.controller_world import Cluster
from tests.support.slowproxy import SlowProxy

pytestmark = pytest.mark.apiserver

TIMING = dict(lease_duration_s=3.0, renew_deadline_s=2.0, retry_period_s=0.4, interval_s=0.4)  # client-go's, 5x down


def _wait(pred, timeout: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def _about(c: Cluster, name: str) -> list:
    """The controller's Events about the workload (any reason)."""
    return [e for e in client.CoreV1Api(c.k8s.api).list_namespaced_event(c.ns).items
            if e.involved_object.name == name and e.involved_object.kind == "Deployment"]


def test_an_action_whose_leader_lost_the_lease_before_its_event_gets_its_event_once(k8s):
    c = Cluster(k8s)
    c.deployment("trainer", replicas=4)
    host, port = k8s.server.url.rsplit("//", 1)[1].split(":")
    with SlowProxy(host, int(port)) as action_path, SlowProxy(host, int(port)) as lease_path:
        a = c.controller("ctl-a", via=action_path.url, execute=True, **TIMING)
        lease_api = k8s.server.api_client()
        lease_api.configuration.host = lease_path.url
        a.elector.kube = Kube(lease_api, TIMING["lease_duration_s"])
        a.elector.kube.backoff_max_s = TIMING["retry_period_s"] / 2
        b = c.controller("ctl-b", execute=True, **TIMING)
        patch = a.kube.merge_patch
        cut_at: list[float] = []

        def acted_then_cut(path: str, body: dict) -> dict:
            out = patch(path, body)  # the quarantine landed: ctl-a held the Lease when it was sent
            if "/deployments/" in path:
                lease_path.cut = True  # ... and can no longer prove it: its Event will meet the fence
                cut_at.append(time.monotonic())
                assert _wait(lambda: not a.may_act(), TIMING["renew_deadline_s"] + 2.0) is not None
            return out

        a.kube.merge_patch = acted_then_cut
        threads = [threading.Thread(target=a.run, daemon=True)]
        threads[0].start()
        try:
            assert _wait(a.may_act, 15.0) is not None, "ctl-a never led"
            threads.append(threading.Thread(target=b.run, daemon=True))
            threads[-1].start()
            p1 = c.run_pod(c.nodes[0])
            for step in (lambda: c.node_fails(c.nodes[0], "False"), lambda: (c.evict(p1), c.run_pod(c.nodes[1]))):
                seen = a.reconciles
                assert _wait(lambda: a.reconciles > seen + 1, 20.0) is not None
                step()
            seen = a.reconciles
            assert _wait(lambda: a.reconciles > seen + 1, 20.0) is not None
            c.node_fails(c.nodes[1])  # the cascade
            assert _wait(lambda: bool(cut_at), 60.0) is not None, "ctl-a never quarantined the workload"
            assert _wait(b.may_act, 3 * TIMING["lease_duration_s"] + 5.0) is not None, "ctl-b never took over"
            assert _wait(lambda: _about(c, "trainer"), 30.0) is not None, "no Event about the workload"
            time.sleep(6 * TIMING["retry_period_s"])  # every chance for a second, wrong, Event
        finally:
            for x in (a, b):
                x.stop()
            for t in threads:
                t.join(15)

    dep = c.deployment_obj()
    rec = json.loads(dep.metadata.annotations[ANNOTATION])
    assert dep.spec.replicas == 0 and rec["by"] == "gpuwarden-controller/ctl-a" and rec["nodes"] == c.nodes[:2]
    assert a.elector.fenced >= 1  # ctl-a's own Event met its fence: not sent
    evs = _about(c, "trainer")
    assert [(e.reason, e.metadata.name) for e in evs] == [("WorkloadQuarantined", rec.get("event"))], \
        [(e.reason, e.reporting_instance, e.message[:160]) for e in evs]
    (ev,) = evs
    assert ev.type == "Warning" and ev.reporting_instance == "ctl-b"
    assert ev.message.startswith(f"scale deployment {c.ns}/trainer from 4 to 0 (by gpuwarden-controller/ctl-a at {rec['at']};")
    assert f"Undo: gpuwarden release deployment/{c.ns}/trainer" in ev.message and "Evidence:" in ev.message
    assert c.nodes[0] in ev.message and c.nodes[1] in ev.message
    assert c.events("CascadeDetected") == []
    print(f"ctl-a quarantined, lost the Lease, its Event fenced ({a.elector.fenced} write(s) refused); ctl-b wrote "
          f"the record's Event {ev.metadata.name}")


def test_the_issues_slow_leader_its_action_keeps_its_record(k8s):
    """The issue's own condition: from the second hop on, the leader's whole API path is 3 s slow each way,
    with client-go's 15 s / 10 s / 2 s and watches. Measured here (twice each): the leader's quarantine
    landed 12.3 s after the second hop (the issue: 12.2 s), its Event met its fence; on main the only Event
    was the successor's "CascadeDetected: not acting: already quarantined since …"; now exactly one
    `WorkloadQuarantined`, under the record's name, naming the leader that acted. The assertions hold
    whichever instance acts and whoever writes the Event: one action, one record, one Event."""
    timing = dict(lease_duration_s=15.0, renew_deadline_s=10.0, retry_period_s=2.0, interval_s=2.0, watch=True)
    c = Cluster(k8s)
    c.deployment("trainer", replicas=4)
    host, port = k8s.server.url.rsplit("//", 1)[1].split(":")
    with SlowProxy(host, int(port)) as path:
        a = c.controller("ctl-a", via=path.url, execute=True, **timing)
        b = c.controller("ctl-b", execute=True, **timing)
        threads = [threading.Thread(target=a.run, daemon=True)]
        threads[0].start()
        try:
            assert _wait(a.may_act, 30.0) is not None, "ctl-a never led"
            threads.append(threading.Thread(target=b.run, daemon=True))
            threads[-1].start()
            p1 = c.run_pod(c.nodes[0])
            for step in (lambda: c.node_fails(c.nodes[0], "False"), lambda: (c.evict(p1), c.run_pod(c.nodes[1]))):
                seen = a.reconciles
                assert _wait(lambda: a.reconciles > seen, 20.0) is not None
                step()
            seen = a.reconciles
            assert _wait(lambda: a.reconciles > seen, 20.0) is not None
            path.delay_s = path.reply_delay_s = 3.0
            c.node_fails(c.nodes[1])
            assert _wait(lambda: c.deployment_obj().spec.replicas == 0, 90.0) is not None, "never quarantined"
            assert _wait(lambda: _about(c, "trainer"), 60.0) is not None, "no Event about the workload"
            time.sleep(3 * timing["lease_duration_s"] / 2)  # every chance for a second, wrong, Event
        finally:
            path.delay_s = path.reply_delay_s = 0.0
            for x in (a, b):
                x.stop()
            for t in threads:
                t.join(20)
    rec = json.loads(c.deployment_obj().metadata.annotations[ANNOTATION])
    evs = _about(c, "trainer")
    assert [(e.reason, e.metadata.name) for e in evs] == [("WorkloadQuarantined", rec.get("event"))], \
        [(e.reason, e.reporting_instance, e.message[:160]) for e in evs]
    author = rec["by"].rsplit("/", 1)[1]
    assert evs[0].reporting_instance == author or f"(by {rec['by']} at {rec['at']};" in evs[0].message
    print(f"3 s each way: quarantined by {author}; the Event by {evs[0].reporting_instance}; ctl-a fenced "
          f"{a.elector.fenced} write(s), stepped down {a.elector.step_downs} time(s)")
