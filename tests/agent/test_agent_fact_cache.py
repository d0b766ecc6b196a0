"""Facts cached between checks (issue 41): a targeted check re-reads only the fact sections its wake-up
concerns (and what was built from them) and takes the others from the last check; the full check
re-reads everything."""

from __future__ import annotations

import io
import time
from collections import Counter

import pytest

from gpuwarden.agent.config import AgentConfig
from gpuwarden.agent.loop import Agent
from gpuwarden.agent.scope import SECTIONS, Scope
from gpuwarden.facts import node as factnode
from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.kube.log import Log
from gpuwarden.root import HostRoot
from tests.support.agent_nodes import synthetic_node


@pytest.fixture
def healthy(node_dir):
    return synthetic_node(node_dir / "root", "healthy")


@pytest.fixture
def reads(monkeypatch):
    """Section -> how many times its collector ran."""
    n: Counter = Counter()
    factnode.registered_facts()
    for name, fn in list(factnode._COLLECTORS.items()):
        def counted(facts, _fn=fn, _name=name):
            n[_name] += 1
            return _fn(facts)
        monkeypatch.setitem(factnode._COLLECTORS, name, counted)
    return n


def agent(root) -> Agent:
    cfg = AgentConfig(node_name="n", kube=False, listen="", probes=False, grpc=False, boot_grace_s=0,
                      interval_s=60.0, log_format="text", memory_samples_file="")
    return Agent(cfg, root=HostRoot(str(root)), log=Log("text", node="n", stream=io.StringIO()), out=io.StringIO())


def wake(topic: str) -> Scope:
    return Scope(frozenset({topic}), "test", time.time())


def test_a_targeted_check_reads_only_what_its_topic_concerns(healthy, reads):
    a = agent(healthy)
    a.check()
    full = dict(reads)
    assert {"logs", "xids", "plugin_sockets", "memory", "kubelet"} <= set(full)
    reads.clear()
    a.check(wake("log"))
    assert reads["logs"] == 1 and reads["xids"] == 1  # touched: re-read
    untouched = set(full) - set(SECTIONS["log"]) - {s for s in full if a._facts.deps.get(s, set()) & {"logs", "xids"}}
    assert "plugin_sockets" in untouched and "memory" in untouched
    assert not set(reads) & untouched, reads  # every untouched section came from the last check


def test_a_touched_section_is_read_again(healthy, reads):
    a = agent(healthy)
    a.check()
    reads.clear()
    a.check(wake("plugins"))
    assert reads["plugin_sockets"] == 1 and reads["logs"] == 0
    reads.clear()
    a.check(wake("memory"))
    assert reads["memory"] == 1 and reads["plugin_sockets"] == 0


def test_the_full_check_reads_everything_again(healthy, reads):
    a = agent(healthy)
    a.check()
    first = dict(reads)
    a.check(wake("log"))
    reads.clear()
    a.check()
    assert dict(reads) == first  # the full check takes nothing from the last one


def test_a_confirming_read_reads_what_its_rules_read(healthy, reads):
    a = agent(healthy)
    a.check()
    reads.clear()
    a.check(Scope(frozenset(), "test", time.time(), frozenset({"GPU-HW-002"})))
    assert reads["logs"] == 1 and reads["xids"] == 1


def test_confirming_a_monitors_code_reads_everything_again(healthy, reads):
    """A code no rule reports (a monitor's: device-access drift) declares no sections: its confirming read is
    a second reading of everything, never the last check's facts."""
    a = agent(healthy)
    a.check()
    reads.clear()
    a.check(Scope(frozenset(), "test", time.time(), frozenset({"GPU-DEV-900-not-a-rule"})))
    f = a._facts
    assert not f.reused and set(reads) == set(f._values) | set(f._failed) != set()  # all it read, read now


def test_a_change_on_a_topic_is_seen_and_cleared_only_by_the_full_check(healthy):
    """The cache never hides a change its wake-up names: an Xid 79 appended is raised by targeted checks."""
    a = agent(healthy)
    a.check()
    with open(healthy / ".gpuwarden/logs/kmsg.txt", "a") as f:
        f.write("3,900,99999999,-;NVRM: Xid (PCI:0000:00:06): 79, pid=1, GPU has fallen off the bus.\n")
    a.check(wake("plugins"))  # another topic: the log is the last check's, nothing seen
    assert not a.debounce.states.get("GPU-HW-002") or a.debounce.states["GPU-HW-002"].bad == 0
    a.check(wake("log"))
    a.check(wake("log"))
    assert a.debounce.raised("GPU-HW-002")


def test_a_reused_memory_section_adds_no_sample(healthy):
    a = agent(healthy)
    a.check()
    n = len(a.memory_history.samples)
    a.check(wake("log"))
    assert len(a.memory_history.samples) == n
    a.check(wake("memory"))
    assert len(a.memory_history.samples) == n + 1


# -- NodeFacts.inherit itself ------------------------------------------------------------------

@fact("test-cache-base")
def _base(facts: NodeFacts) -> int:
    facts.gap("/t/base", "not captured")
    return facts.settings.extra["base"]


@fact("test-cache-derived")
def _derived(facts: NodeFacts) -> int:
    return facts.get("test-cache-base") * 10


@fact("test-cache-other")
def _other(facts: NodeFacts) -> int:
    return facts.settings.extra["other"]


@fact("test-cache-broken")
def _broken(facts: NodeFacts) -> int:
    raise FactUnavailable("nothing there")


def facts(base: int, other: int) -> NodeFacts:
    from gpuwarden.facts import Settings

    return NodeFacts(HostRoot("/nonexistent-gw"), Settings(extra={"base": base, "other": other}))


def test_inherit_takes_what_did_not_change_and_what_was_built_from_a_change_is_read_again():
    prev = facts(1, 2)
    assert (prev.get("test-cache-derived"), prev.get("test-cache-other")) == (10, 2)
    with pytest.raises(FactUnavailable):
        prev.get("test-cache-broken")
    assert prev.deps["test-cache-derived"] == {"test-cache-base"}
    now = facts(3, 4)
    took = now.inherit(prev, {"test-cache-base"})
    assert took == {"test-cache-other", "test-cache-broken"} == now.reused
    assert now.get("test-cache-other") == 2  # the last check's
    assert now.get("test-cache-derived") == 30  # built from a changed section: read again
    with pytest.raises(FactUnavailable, match="nothing there"):
        now.get("test-cache-broken")


def test_inherit_carries_a_reused_sections_gaps():
    prev = facts(1, 2)
    prev.get("test-cache-base")
    now = facts(1, 2)
    now.inherit(prev, set())
    assert now.get("test-cache-base") == 1 and [g.source for g in now.gaps()] == ["/t/base"]
    fresh = facts(1, 2)
    fresh.inherit(prev, {"test-cache-base"})
    assert fresh.gaps() == []  # not read yet in this check
