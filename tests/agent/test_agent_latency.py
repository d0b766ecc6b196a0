"""Fault seen -> raised -> fenced: the two histograms, by the source and topic of the wake-up that saw it."""

from __future__ import annotations

from gpuwarden.agent.latency import Latency
from gpuwarden.agent.metrics import AgentMetrics
from gpuwarden.agent.scope import Scope
from gpuwarden.remediation.executor import RemediationOutcome
from gpuwarden.remediation.plan import Action, Target

NODE = Target("Node", "n", "", "")


def _count(m: AgentMetrics, name: str, **labels) -> float:
    return m.registry.get_sample_value(name + "_count", labels) or 0.0


def test_a_wake_ups_fault_is_timed_from_its_seen_to_raise_and_fence():
    m = AgentMetrics()
    lat = Latency(m)
    wake = Scope(frozenset({"log"}), "kmsg", 100.0)
    lat.seen({"GPU-HW-002": "bad"}, wake, 100.05)
    lat.seen({"GPU-HW-002": "bad"}, Scope(frozenset({"log"}), "kmsg", 100.0, frozenset({"GPU-HW-002"})), 100.3)
    lat.raised({"GPU-HW-002": "raised"}, wake, 100.3)
    s = m.registry.get_sample_value("gpuwarden_fault_seen_to_raised_seconds_sum", {"source": "kmsg", "topic": "log"})
    assert abs(s - 0.3) < 1e-6  # from the source's `seen`, not from the check that read it
    assert m.registry.get_sample_value("gpuwarden_fault_seen_to_raised_seconds_bucket",
                                       {"source": "kmsg", "topic": "log", "le": "0.5"}) == 1
    dry = RemediationOutcome(Action("taint-node", NODE, "GPU-HW-002", "x"), "dry-run")
    lat.fenced([dry], 100.31)  # a dry run fences nothing
    assert _count(m, "gpuwarden_raised_to_fenced_seconds", source="kmsg", topic="log") == 0
    restart = RemediationOutcome(Action("restart-device-plugin", NODE, "GPU-HW-002", "x"), "done")
    lat.fenced([restart], 100.32)  # not a fence
    assert _count(m, "gpuwarden_raised_to_fenced_seconds", source="kmsg", topic="log") == 0
    lat.fenced([RemediationOutcome(Action("taint-node", NODE, "GPU-HW-002", "x"), "done")], 100.4)
    assert _count(m, "gpuwarden_raised_to_fenced_seconds", source="kmsg", topic="log") == 1
    lat.fenced([RemediationOutcome(Action("taint-node", NODE, "GPU-HW-002", "x"), "done")], 105.0)
    assert _count(m, "gpuwarden_raised_to_fenced_seconds", source="kmsg", topic="log") == 1  # once per raise


def test_a_periodic_fault_is_labelled_periodic_and_a_clean_read_stops_its_clock():
    m = AgentMetrics()
    lat = Latency(m)
    lat.seen({"GPU-DEV-001": "bad"}, None, 1000.0)
    lat.seen({"GPU-DEV-001": "good"}, None, 1060.0)  # gone: its clock stops
    lat.seen({"GPU-DEV-001": "bad"}, None, 1120.0)
    lat.raised({"GPU-DEV-001": "raised"}, None, 1120.2)
    s = m.registry.get_sample_value("gpuwarden_fault_seen_to_raised_seconds_sum", {"source": "periodic", "topic": "all"})
    assert abs(s - 0.2) < 1e-6  # from the bad read after the clean one, not from the first
    lat.raised({"GPU-DEV-001": "cleared"}, None, 2000.0)
    lat.fenced([RemediationOutcome(Action("taint-node", NODE, "GPU-DEV-001", "x"), "done")], 2001.0)
    assert _count(m, "gpuwarden_raised_to_fenced_seconds", source="periodic", topic="all") == 0
