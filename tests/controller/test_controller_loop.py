"""The controller loop's guards that need no API server."""

from __future__ import annotations

import dataclasses
import io

from gpuwarden.controller.config import ControllerConfig
from gpuwarden.controller.detect import Episode
from gpuwarden.controller.loop import Controller, trim_node
from gpuwarden.kube.log import Log
from tests.controller.objects import T0, node


class NoApi:
    def __getattr__(self, name):
        raise AssertionError(f"unexpected API call {name}")


def controller():
    cfg = dataclasses.replace(ControllerConfig(), namespace="gw", agent_namespace="gw", identity="t", listen="")
    return Controller(cfg, NoApi(), clock=lambda: T0, log=Log("text", io.StringIO()))


def test_an_empty_cache_is_not_an_empty_cluster():
    """Before the watches filled their caches, nothing is observed: failing nodes must not look 'gone'."""
    ctl = controller()
    ctl.watching = True
    ctl.history.episodes.append(Episode("gpu-a", T0 - 60))
    assert ctl.reconcile() == []
    assert ctl.history.episodes[0].ongoing and ctl.reconciles == 0
    assert "caches not filled yet" in ctl.log.stream.getvalue()
    assert ctl.status()["ready"] is False


def test_trim_node_keeps_what_detection_and_fleet_read():
    n = node("gpu-a", conds={"GPUDriver": ("True", T0)})
    n["status"]["images"] = [{"names": ["x"] * 100}]
    n["status"]["capacity"]["cpu"] = "64"
    n["spec"]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    t = trim_node(n)
    assert "images" not in t["status"] and t["status"]["capacity"] == {"nvidia.com/gpu": "8"}
    assert t["status"]["conditions"] == n["status"]["conditions"] and t["spec"]["taints"] == n["spec"]["taints"]
    assert t["metadata"]["name"] == "gpu-a"


class ForbiddenPatches:
    """Reads a Deployment; every write but Events is refused (RBAC without the patch verb)."""

    def __init__(self):
        from tests.controller.objects import deployment

        self.dep = deployment("trainer", replicas=3)
        self.events = []

    def get(self, path):
        assert path == "/apis/apps/v1/namespaces/ml/deployments/trainer"
        return self.dep

    def merge_patch(self, path, patch):
        from gpuwarden.kube.errors import KubeError

        raise KubeError(403, "Forbidden", '{"message": "deployments.apps is forbidden"}')

    def create_event(self, ns, body):
        self.events.append(body)
        return body


def test_a_failed_quarantine_is_retried_and_says_so():
    from gpuwarden.controller.detect import Cascade, Link
    from gpuwarden.controller.model import WorkloadRef

    cfg = dataclasses.replace(ControllerConfig(), namespace="gw", agent_namespace="gw", identity="t", listen="",
                              execute=True)
    kube = ForbiddenPatches()
    ctl = Controller(cfg, kube, clock=lambda: T0, log=Log("text", io.StringIO()))
    c = Cascade(WorkloadRef("Deployment", "ml", "trainer"),
                [Link("gpu-a", T0 - 400, ["Ready=Unknown"], "ml/p1", "u1", T0 - 9000, None),
                 Link("gpu-b", T0 - 10, ["Ready=Unknown"], "ml/p2", "u2", T0 - 300, True)])
    d = ctl._cascade(c, T0)
    assert [o.result for o in d.outcomes] == ["failed"] and "forbidden" in d.outcomes[0].detail
    assert not ctl.history.reported("deployment/ml/trainer", "gpu-b", T0 - 10)  # tried again next time
    ev = kube.events[0]
    assert ev["reason"] == "CascadeDetected" and ev["message"].startswith("FAILED to act:")
    assert "Undo:" not in ev["message"] and "gpu-a failed" in ev["message"]


def test_a_new_leader_takes_over_the_failing_nodes_the_last_one_reported():
    """Carried on the Lease: a node the previous leader reported (and tainted) is not reported again
    within its window, the pods its taint spares still count, and a stale untainted report is pruned."""
    from gpuwarden.controller.admission import FailingNode
    from gpuwarden.controller.detect import FleetHistory

    old = controller()
    old.history.failing["gpu-b"] = {"at": T0 - 120, "rate": 12.0, "tainted": T0 - 120, "failed_after": 0}
    old.history.failing["gpu-c"] = {"at": T0 - 7200, "rate": 3.0, "tainted": None, "failed_after": 0}
    state = old.history.to_json()

    new = controller()  # NoApi: any taint or Event would fail the test
    new.history.merge(FleetHistory.from_json(state))
    again = FailingNode("gpu-b", failed=12, sent=12, window_s=600.0, first=T0 - 600, last=T0 - 60,
                        example="UnexpectedAdmissionError: Allocate failed")
    assert new._failing_node(again, T0, storm=False) is None
    new._count_spared([], T0)
    assert new.history.failing["gpu-b"]["spared"] == 24  # 12/min for the 2 min since the taint
    new.history.prune(T0, new.cfg)
    assert set(new.history.failing) == {"gpu-b"}
    assert FleetHistory.from_json(new.history.to_json()).failing["gpu-b"]["tainted"] == T0 - 120


def test_lease_state_without_failing_nodes_still_reads():
    """A Lease written by the previous release (no `failing` key) is taken over as before."""
    from gpuwarden.controller.detect import FleetHistory

    h = FleetHistory.from_json('{"v":1,"episodes":[],"reported":{},"stormSince":null}')
    assert h.failing == {} and h.storm_since is None


def test_a_long_reconcile_is_alive_while_the_lease_is_renewed_but_a_stuck_loop_is_not():
    """/healthz: a pool action of thousands of nodes takes minutes; the kubelet must not restart the
    leader in the middle of it while its renewal thread goes on, but a loop that stopped turning fails."""
    import time

    ctl = controller()
    ctl.last_loop = time.monotonic() - 3600  # the loop last turned an hour ago ...
    assert ctl.status()["alive"] is False
    ctl.reconciling_since = time.monotonic() - 3000  # ... inside a reconcile
    ctl.renew_beat = time.monotonic()  # while the renewal thread goes on
    assert ctl.status()["alive"] is True
    ctl.renew_beat = time.monotonic() - 3600  # the renewal thread stopped too
    assert ctl.status()["alive"] is False
