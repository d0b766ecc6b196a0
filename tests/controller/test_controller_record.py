"""Every quarantine keeps its record (issue 45 item 1), without an API server: the record is written
with the action, and its Event, under the name the record gives, reaches the API exactly once, from
the acting leader or from whoever leads next."""

from __future__ import annotations

import dataclasses
import io
import json

from gpuwarden.controller.config import ControllerConfig
from gpuwarden.controller.detect import Cascade, FleetHistory, Link
from gpuwarden.controller.loop import Controller
from gpuwarden.controller.model import WorkloadRef
from gpuwarden.controller.quarantine import ANNOTATION
from gpuwarden.kube.errors import KubeError
from gpuwarden.kube.log import Log
from tests.controller.objects import T0, deployment

PATH = "/apis/apps/v1/namespaces/ml/deployments/trainer"


class Api:
    """One Deployment; Events stored by name, a second create of a name refused (409) as the API server
    does; `refuse_events`: every Event create fails (the Lease fence, or the API away)."""

    def __init__(self) -> None:
        self.dep = deployment("trainer", replicas=3)
        self.events: dict[str, dict] = {}
        self.refused = 0
        self.refuse_events = False

    def get(self, path):
        assert path == PATH
        return json.loads(json.dumps(self.dep))

    get_or_none = get

    def merge_patch(self, path, patch):
        assert path == PATH
        self.dep["metadata"]["annotations"].update(patch["metadata"]["annotations"])
        self.dep["spec"].update(patch.get("spec") or {})
        return self.dep

    def create_event(self, ns, body):
        if self.refuse_events:
            self.refused += 1
            raise KubeError(-1, "Fenced", "ctl-a does not hold the Lease within its renew deadline: write not sent")
        name = body["metadata"]["name"]
        if name in self.events:
            raise KubeError(409, "Conflict", f'events "{name}" already exists')
        self.events[name] = body
        return body


def ctl(api: Api, identity: str, clock: float = T0) -> Controller:
    cfg = dataclasses.replace(ControllerConfig(), namespace="gw", agent_namespace="gw", identity=identity, listen="",
                              execute=True, leader_elect=False)  # each acts as the leader of its turn
    return Controller(cfg, api, clock=lambda: clock, log=Log("text", io.StringIO()))


def cascade(nodes: int = 2) -> Cascade:
    links = [Link("gpu-a", T0 - 400, ["Ready=Unknown"], "ml/p1", "u1", T0 - 9000, None),
             Link("gpu-b", T0 - 10, ["Ready=Unknown"], "ml/p2", "u2", T0 - 300, True),
             Link("gpu-c", T0 - 5, ["Ready=Unknown"], "ml/p3", "u3", T0 - 8, True)]
    return Cascade(WorkloadRef("Deployment", "ml", "trainer"), links[:nodes])


def record(api: Api) -> dict:
    return json.loads(api.dep["metadata"]["annotations"][ANNOTATION])


def test_the_leaders_event_is_named_by_the_record_it_wrote_with_the_action():
    api = Api()
    d = ctl(api, "ctl-a")._cascade(cascade(), T0)
    rec = record(api)
    assert api.dep["spec"]["replicas"] == 0 and rec["by"] == "gpuwarden-controller/ctl-a"
    assert rec["action"] == "scale deployment ml/trainer from 3 to 0" and rec["event"].startswith("trainer.gwq-")
    (ev,) = api.events.values()
    assert ev["metadata"]["name"] == rec["event"] and ev["reason"] == "WorkloadQuarantined" and d.event == ev
    # a successor that detects the same chain: the record's Event is there (409), so nothing more is written
    d2 = ctl(api, "ctl-b")._cascade(cascade(), T0 + 20)
    assert list(api.events) == [rec["event"]] and d2.event is None and d2.outcomes[0].result == "skipped"


def test_an_event_the_fence_refused_is_written_once_by_the_successor_from_the_record():
    """The slow leader quarantined the workload while it held the Lease; its Event was refused by its
    fence. The successor finds the action without its Event and writes it from the record: author,
    reason, time, evidence; no 'not acting: already quarantined' Event."""
    api = Api()
    api.refuse_events = True
    a = ctl(api, "ctl-a")
    a._cascade(cascade(), T0)
    assert api.dep["spec"]["replicas"] == 0 and api.events == {} and api.refused == 1
    assert "deployment/ml/trainer" in a.history.unrecorded  # its own retry list (on the Lease if it still can)
    api.refuse_events = False
    b = ctl(api, "ctl-b", T0 + 15)  # its state never reached the Lease: b detects the cascade again
    d = b._cascade(cascade(), T0 + 15)
    rec = record(api)
    (ev,) = api.events.values()
    assert ev["metadata"]["name"] == rec["event"] and ev["reason"] == "WorkloadQuarantined" and d.event == ev
    assert ev["involvedObject"]["kind"] == "Deployment" and ev["involvedObject"]["name"] == "trainer"
    msg = ev["message"]
    assert msg.startswith("scale deployment ml/trainer from 3 to 0 (by gpuwarden-controller/ctl-a at ")
    assert "written by gpuwarden-controller/ctl-b" in msg and "Undo: gpuwarden release deployment/ml/trainer" in msg
    assert "gpu-a failed" in msg and "gpu-b failed" in msg  # the evidence
    assert "already quarantined" not in msg
    # and neither a third leader nor the first one's own retry writes it again
    ctl(api, "ctl-c", T0 + 30)._cascade(cascade(), T0 + 30)
    a._unrecorded()
    assert len(api.events) == 1 and a.history.unrecorded == {}


def test_the_leader_retries_its_own_unsent_event_from_the_record_carried_on_the_lease():
    api = Api()
    api.refuse_events = True
    a = ctl(api, "ctl-a")
    a._cascade(cascade(), T0)
    carried = FleetHistory.from_json(a.history.to_json())
    assert carried.unrecorded["deployment/ml/trainer"]["event"] == record(api)["event"]
    api.refuse_events = False
    b = ctl(api, "ctl-b", T0 + 15)
    b.history.merge(carried)  # b took the Lease with a's state: the cascade is reported, its Event is not
    b._unrecorded()
    (ev,) = api.events.values()
    assert ev["metadata"]["name"] == record(api)["event"] and b.history.unrecorded == {}


def test_no_event_from_a_record_once_it_is_released_or_past_the_event_ttl():
    api = Api()
    api.refuse_events = True
    a = ctl(api, "ctl-a")
    a._cascade(cascade(), T0)
    api.refuse_events = False
    del api.dep["metadata"]["annotations"][ANNOTATION]  # released meanwhile
    a._unrecorded()
    assert api.events == {} and a.history.unrecorded == {}
    api2 = Api()
    api2.refuse_events = True
    ctl(api2, "ctl-a")._cascade(cascade(), T0)
    api2.refuse_events = False
    late = ctl(api2, "ctl-b", T0 + 4000)  # after kube-apiserver's 1 h Event TTL: it may have expired; not again
    late._cascade(cascade(), T0 + 4000)
    assert api2.events == {}


def test_new_evidence_or_an_old_record_is_still_reported():
    """A third node joining the chain is a new decision (reported, not acting); a record written before
    records named their Event (no `event`) cannot be told from one whose Event exists: reported as before."""
    api = Api()
    ctl(api, "ctl-a")._cascade(cascade(), T0)
    d = ctl(api, "ctl-b", T0 + 20)._cascade(cascade(3), T0 + 20)
    assert d.event["reason"] == "CascadeDetected" and "not acting: already quarantined since" in d.event["message"]
    assert len(api.events) == 2
    old = Api()
    old.dep["metadata"]["annotations"][ANNOTATION] = json.dumps({"at": "2026-11-18T10:00:00Z", "by": "x",
                                                                 "nodes": ["gpu-a", "gpu-b"], "undo": {}})
    d = ctl(old, "ctl-b")._cascade(cascade(), T0)
    assert d.event["reason"] == "CascadeDetected" and "already quarantined since 2026-11-18T10:00:00Z" in d.event["message"]


def test_a_garbled_unrecorded_list_on_the_lease_is_dropped_not_fatal():
    state = json.dumps({"v": 1, "episodes": [], "reported": {}, "unrecorded": {
        "a": {"kind": "Pod", "namespace": "ml", "name": "x", "event": "x.gwq-1"},  # no such workload kind
        "b": {"kind": "Deployment"},  # no event
        "c": "garbage",
        "deployment/ml/trainer": {"kind": "Deployment", "namespace": "ml", "name": "trainer", "event": "t.gwq-2",
                                  "at": "2026-11-18T10:00:00Z"}}})
    h = FleetHistory.from_json(state)
    assert list(h.unrecorded) == ["deployment/ml/trainer"]


def test_a_record_naming_an_event_of_its_choosing_is_not_written():
    """An annotation whose `event` is not the name its own workload, time and author give (someone wrote
    the record by hand, or garbled it): reported as before, no Event under that name."""
    api = Api()
    ctl(api, "ctl-a")._cascade(cascade(), T0)
    rec = record(api)
    api.events.clear()
    rec["event"] = "someone-elses-event"
    api.dep["metadata"]["annotations"][ANNOTATION] = json.dumps(rec)
    d = ctl(api, "ctl-b", T0 + 15)._cascade(cascade(), T0 + 15)
    assert "someone-elses-event" not in api.events and d.event["reason"] == "CascadeDetected"
