"""The engine: error isolation, skipped rules, --select/--ignore, the Report model."""

from __future__ import annotations

import pytest

from gpuwarden.facts.identity import report_identity
from gpuwarden import engine
from gpuwarden.facts import FactUnavailable, NodeFacts, Settings
from gpuwarden.facts import node as node_mod
from gpuwarden.findings import SCHEMA, Affected, Evidence, Finding, Report, Severity, Status
from gpuwarden.root import BundleRoot
from gpuwarden.rules import Hit, Rule, all_rules, get_rule
from tests.support.bundles import CAPTURE, example_root, facts_of


def make_rule(code: str, func, needs: tuple[str, ...] = (), severity: Severity = Severity.HIGH) -> Rule:
    return Rule(code, f"title of {code}", severity, "test", needs, "do the thing", ("ref",), "A3", func)


def hit_always(facts):
    """Always fires."""
    yield Hit(Status.CONFIRMED, "it fired", [Affected("node", "n")], [Evidence("/proc/x", "y")])


def test_a_raising_rule_is_reported_and_the_others_still_run() -> None:
    def boom(facts):
        raise RuntimeError("boom")
        yield  # pragma: no cover

    def boom_late(facts):
        yield Hit(Status.CONFIRMED, "half")
        raise KeyError("late")

    rules = [make_rule("GPU-TST-001", boom), make_rule("GPU-TST-002", hit_always), make_rule("GPU-TST-003", boom_late)]
    rep = engine.run(facts_of(example_root("healthy")), rules, mode="example")
    assert "rule GPU-TST-001 failed: RuntimeError: boom" in rep.errors
    assert "rule GPU-TST-003 failed: KeyError: 'late'" in rep.errors
    assert [f.code for f in rep.findings] == ["GPU-TST-002", "GPU-TST-003"]
    assert rep.rules_run == 3 and rep.skipped == []


def test_unavailable_needs_skip_with_reason() -> None:
    rules = [make_rule("GPU-TST-001", hit_always, needs=("containers",)),
             make_rule("GPU-TST-002", hit_always, needs=("no-such-section",)),
             make_rule("GPU-TST-003", hit_always, needs=("driver",))]
    rep = engine.run(facts_of(BundleRoot(CAPTURE)), rules, mode="bundle")
    skipped = {s.code: s.reason for s in rep.skipped}
    assert skipped["GPU-TST-001"] == ("containers: no kubepods cgroup under /sys/fs/cgroup "
                                      "(not a Kubernetes node, or kubelet not started)")
    assert skipped["GPU-TST-002"].startswith("no-such-section: no collector for 'no-such-section'")
    assert [f.code for f in rep.findings] == ["GPU-TST-003"]
    assert rep.rules_run == 1
    js = rep.to_json()
    assert {"code": "GPU-TST-001", "reason": skipped["GPU-TST-001"]} in js["not_evaluated"]


def test_fact_unavailable_raised_inside_a_rule_is_a_skip() -> None:
    def needs_more(facts):
        raise FactUnavailable("kubelet log not captured")
        yield  # pragma: no cover

    rep = engine.run(facts_of(example_root("healthy")), [make_rule("GPU-TST-001", needs_more)])
    assert [(s.code, s.reason) for s in rep.skipped] == [("GPU-TST-001", "kubelet log not captured")]
    assert rep.errors == [] or all("GPU-TST" not in e for e in rep.errors)


def test_a_crashing_collector_is_an_error_and_its_rules_are_skipped() -> None:
    def broken(facts):
        raise ZeroDivisionError("oops")

    node_mod._COLLECTORS["test-broken"] = broken
    try:
        facts = facts_of(example_root("healthy"))
        rep = engine.run(facts, [make_rule("GPU-TST-001", hit_always, needs=("test-broken",)),
                                 make_rule("GPU-TST-002", hit_always, needs=("driver",))])
        assert "collector test-broken failed: ZeroDivisionError: oops" in rep.errors
        assert rep.skipped[0].code == "GPU-TST-001" and "ZeroDivisionError" in rep.skipped[0].reason
        assert [f.code for f in rep.findings] == ["GPU-TST-002"]
        # memoised: asked again, the same reason, no second run
        with pytest.raises(FactUnavailable, match="oops"):
            facts.get("test-broken")
        assert facts.errors.count("collector test-broken failed: ZeroDivisionError: oops") == 1
    finally:
        del node_mod._COLLECTORS["test-broken"]


def test_hit_overrides_and_finding_stamping() -> None:
    def low(facts):
        yield Hit(Status.AT_RISK, "maybe", severity=Severity.MEDIUM, remedy="special", mechanism="m", data={"k": 1})

    rep = engine.run(facts_of(example_root("healthy")), [make_rule("GPU-TST-001", low)])
    (f,) = rep.findings
    assert (f.code, f.title, f.family, f.references) == ("GPU-TST-001", "title of GPU-TST-001", "test", ("ref",))
    assert (f.status, f.severity, f.remedy, f.mechanism, f.data) == (Status.AT_RISK, Severity.MEDIUM, "special", "m", {"k": 1})


def test_select_and_ignore_by_prefix() -> None:
    rules = [make_rule(c, hit_always) for c in ("GPU-DEV-001", "GPU-DEV-002", "GPU-DEV-003", "GPU-K8S-001", "GPU-DRV-006")]

    def codes(only=(), ignore=()):
        return [r.code for r in engine.select(rules, only, ignore)]

    assert codes() == [r.code for r in rules]
    assert codes(["GPU-DEV"]) == ["GPU-DEV-001", "GPU-DEV-002", "GPU-DEV-003"]
    assert codes(["gpu-dev-002"]) == ["GPU-DEV-002"]  # case-insensitive
    assert codes(["GPU-DEV-001", "GPU-K8S"]) == ["GPU-DEV-001", "GPU-K8S-001"]
    assert codes(ignore=["GPU-DEV"]) == ["GPU-K8S-001", "GPU-DRV-006"]
    assert codes(["GPU-DEV"], ["GPU-DEV-002"]) == ["GPU-DEV-001", "GPU-DEV-003"]
    assert codes(["GPU-D"]) == ["GPU-DEV-001", "GPU-DEV-002", "GPU-DEV-003", "GPU-DRV-006"]
    assert codes(["NOPE"]) == []


def test_select_real_registry() -> None:
    sel = engine.select(all_rules(), ["GPU-DEV"])
    assert [r.code for r in sel] == ["GPU-DEV-001", "GPU-DEV-002", "GPU-DEV-003", "GPU-DEV-004", "GPU-DEV-005"]
    assert get_rule("gpu-dev-001").code == "GPU-DEV-001" and get_rule("GPU-XXX-999") is None


def test_report_model() -> None:
    def f(code, sev, status):
        return Finding(code, status, sev, "t", "s")

    rep = Report({"hostname": "h"}, "bundle", [f("A", Severity.MEDIUM, Status.CONFIRMED), f("B", Severity.HIGH, Status.AT_RISK),
                                               f("C", Severity.HIGH, Status.CONFIRMED), f("D", Severity.HIGH, Status.CONFIRMED)])
    assert [x.code for x in rep.sorted_findings()] == ["C", "D", "B", "A"]
    assert rep.worst() is Severity.HIGH
    js = rep.to_json()
    assert js["schema"] == SCHEMA == "gpuwarden.report/v1"
    assert js["summary"]["worst_severity"] == "high" and js["summary"]["findings"] == 4
    assert Report({}, "live").to_json()["summary"]["worst_severity"] is None
    assert Severity.parse(" Critical ") is Severity.CRITICAL and Severity.HIGH.label == "high"
    with pytest.raises(KeyError):
        Severity.parse("nope")


def test_finding_json_drops_empty_affected_fields() -> None:
    fi = Finding("GPU-DEV-001", Status.CONFIRMED, Severity.HIGH, "t", "s", [Affected("pod", "p")], [Evidence("a", "b")])
    js = fi.to_json()
    assert js["affected"] == [{"kind": "pod", "name": "p"}]
    assert js["evidence"] == [{"source": "a", "text": "b"}]
    assert str(Affected("container", "p/c", "ns", detail="id x")) == "container ns/p/c (id x)"
    assert str(Evidence("/proc/devices", "238 nvidia-uvm")) == "/proc/devices: 238 nvidia-uvm"


def test_node_identity_and_now() -> None:
    facts = facts_of(example_root("uvm-missing"))
    assert facts.now == 1795313561.0  # the base's captured_at
    assert report_identity(facts)["source"] == "example:uvm-missing"
    assert NodeFacts(example_root("healthy"), Settings(), now=5.0).now == 5.0


def test_a_broken_rule_module_is_reported_not_fatal(monkeypatch) -> None:
    from gpuwarden.rules import base

    monkeypatch.setitem(base.LOAD_ERRORS, "gpuwarden.rules.fake", "SyntaxError: bad")
    rep = engine.run(facts_of(example_root("healthy")), [make_rule("GPU-TST-001", hit_always)])
    assert "rule module gpuwarden.rules.fake failed to import: SyntaxError: bad" in rep.errors
    assert [f.code for f in rep.findings] == ["GPU-TST-001"]
