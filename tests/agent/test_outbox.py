"""The agent's outbox (agent/outbox.py): how a waiting Event is counted across an agent's restart."""

from __future__ import annotations

from gpuwarden.agent.outbox import Outbox


def body(count: int = 1) -> dict:
    return {"metadata": {"name": "gpu-a.1", "namespace": "default"}, "reason": "GpuDev001", "type": "Warning",
            "count": count, "firstTimestamp": "2026-11-26T20:00:00Z", "lastTimestamp": "2026-11-26T20:00:00Z"}


def test_a_repeat_in_one_agent_is_counted_but_not_the_restarted_agents_raise_of_the_same_event(tmp_path):
    path = str(tmp_path / "outbox.json")
    box = Outbox(path)
    box.put_event("k", "default", body())
    box.put_event("k", "default", {**body(), "lastTimestamp": "2026-11-26T20:05:00Z"})  # raised, cleared, raised
    assert box.events[0]["body"]["count"] == 2
    again = Outbox(path)  # a restarted agent reads the waiting Event back ...
    assert again.events[0]["body"]["count"] == 2
    again.put_event("k", "default", body())  # ... and, unable to read its Node, raises the same fault
    assert again.events[0]["body"]["count"] == 2  # the same occurrence: not counted again
    again.put_event("k", "default", body())  # a further repeat in this agent is one
    assert again.events[0]["body"]["count"] == 3
    assert Outbox(path).events[0]["body"]["count"] == 3


def test_a_different_event_is_queued_beside_a_carried_one(tmp_path):
    path = str(tmp_path / "outbox.json")
    Outbox(path).put_event("k", "default", body())
    box = Outbox(path)
    box.put_event("other", "default", body())
    assert [e["key"] for e in box.events] == ["k", "other"] and all(e["body"]["count"] == 1 for e in box.events)
