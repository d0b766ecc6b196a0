"""GPU-DRA-030 (a DRA kubelet plugin hung or not answering) from the probe result a bundle recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from gpuwarden import engine
from gpuwarden.facts.dra_probe import PROBE_FILE, from_json
from gpuwarden.findings import Severity, Status
from tests.support.bundles import bundle, facts_of

DRIVER = "gpu.nvidia.com"
REG = f"/var/lib/kubelet/plugins_registry/{DRIVER}-reg.sock"
SVC = f"/var/lib/kubelet/plugins/{DRIVER}/dra.sock"


def record(*calls: tuple[str, str], status: str = "ok", refused: dict | None = None) -> str:
    return json.dumps({"status": status, "elapsed_s": 5.1, "detail": "" if status == "ok" else "dra probe did not return",
                       "value": [{"driver": DRIVER, "registration": REG, "service": SVC, "info": None, "calls": [
                           {"rpc": r, "socket": REG if r == "GetInfo" else SVC, "status": s,
                            "elapsed_s": 5.0 if s == "timeout" else 0.003, "timeout_s": 5.0,
                            "detail": "no answer within 5s (DEADLINE_EXCEEDED)" if s == "timeout" else s}
                           for r, s in calls], **({"refused": refused} if refused else {})}]})


REFUSED = (("GetInfo", "unavailable"), ("NodePrepareResources", "unavailable"))
GONE_ON_THE_NODE = {"verdict": "gone", "why": "/proc: no process of the plugin among 312 (argv naming gpu.nvidia.com "
                                              "or gpu-kubelet-plugin)"}


def found(tmp_path: Path, doc: str) -> list:
    root = bundle(tmp_path, {PROBE_FILE: doc})
    rep = engine.run(facts_of(root), engine.select(engine.all_rules(), ("GPU-DRA-030",)), mode="bundle")
    assert rep.errors == []
    return rep.findings


@pytest.mark.rule("GPU-DRA-030", "positive")
def test_prepare_hung_while_getinfo_answers(tmp_path: Path) -> None:
    """The plugin stuck in NVML during a prepare: registration answers, the serialised prepare path does not."""
    (f,) = found(tmp_path, record(("GetInfo", "ok"), ("NodePrepareResources", "timeout")))
    assert f.status is Status.CONFIRMED and f.severity is Severity.HIGH
    assert f.summary.startswith(f"The DRA plugin {DRIVER} did not answer NodePrepareResources within 5s (it answered GetInfo)")
    assert [str(a) for a in f.affected][0] == f"plugin {DRIVER} (GetInfo ok, NodePrepareResources timeout)"
    assert f"probe:dra {SVC}: NodePrepareResources: no answer within 5s, waited 5s" in [str(e) for e in f.evidence]


@pytest.mark.rule("GPU-DRA-030", "positive")
def test_sockets_left_by_a_dead_plugin(tmp_path: Path) -> None:
    """Recorded on the node itself, with its process table showing no process of the plugin."""
    (f,) = found(tmp_path, record(*REFUSED, refused=GONE_ON_THE_NODE))
    assert f.status is Status.CONFIRMED and "refuses connections" in f.summary and "no process" in f.summary
    assert "/proc: no process of the plugin among 312 (argv naming gpu.nvidia.com or gpu-kubelet-plugin)" in \
        [str(e) for e in f.evidence]


@pytest.mark.rule("GPU-DRA-030", "positive")
def test_refused_while_the_plugin_process_runs_is_at_risk_only(tmp_path: Path) -> None:
    (f,) = found(tmp_path, record(*REFUSED, refused={"verdict": "running", "why": "/proc: … pid 4242"}))
    assert f.status is Status.AT_RISK and f.severity is Severity.HIGH and "still runs" in f.summary


@pytest.mark.rule("GPU-DRA-030", "negative")
@pytest.mark.parametrize("refused", [None, {"verdict": "not sure", "why": "this root is not the running node (…)"},
                                     {"verdict": "gone"}, {"verdict": "dead", "why": "x"}, "gone"])
def test_a_refusal_recorded_without_the_nodes_verdict_is_not_evaluated(tmp_path: Path, refused) -> None:
    """Issue 44 item 8: a socket with no listener (a copied tree's, or a record that says nothing of the
    node's processes) is evidence of nothing: not evaluated, never CONFIRMED."""
    doc = json.loads(record(*REFUSED))
    if refused is not None:
        doc["value"][0]["refused"] = refused
    root = bundle(tmp_path, {PROBE_FILE: json.dumps(doc)})
    rep = engine.run(facts_of(root), engine.select(engine.all_rules(), ("GPU-DRA-030",)), mode="bundle")
    assert rep.findings == [] and rep.errors == []
    (s,) = [s for s in rep.skipped if s.code == "GPU-DRA-030"]
    assert "no evidence of a dead plugin" in str(s), s
    assert any(g.source == f"probe:dra {DRIVER}" for g in rep.gaps), rep.gaps


def test_a_hung_call_still_confirms_beside_a_refusal_nobody_can_judge(tmp_path: Path) -> None:
    (f,) = found(tmp_path, record(("GetInfo", "timeout"), ("NodePrepareResources", "unavailable")))
    assert f.status is Status.CONFIRMED and "did not answer GetInfo" in f.summary
    assert not [e for e in f.evidence if "refused" in e.text]


@pytest.mark.rule("GPU-DRA-030", "positive")
def test_probe_child_past_its_deadline_is_at_risk_only(tmp_path: Path) -> None:
    (f,) = found(tmp_path, record(status="timeout"))
    assert f.status is Status.AT_RISK and f.severity is Severity.MEDIUM


@pytest.mark.rule("GPU-DRA-030", "negative")
@pytest.mark.parametrize("calls", [
    [("GetInfo", "ok"), ("NodePrepareResources", "ok")],
    [("GetInfo", "ok")],  # a CSI registrar: GetInfo only
    [("GetInfo", "ok"), ("NodePrepareResources", "unimplemented")],  # too old, not hung
])
def test_silent_when_the_plugin_answers(tmp_path: Path, calls) -> None:
    assert found(tmp_path, record(*calls)) == []


@pytest.mark.rule("GPU-DRA-030", "clears")
def test_clears_when_the_next_probe_answers(tmp_path: Path) -> None:
    assert len(found(tmp_path / "a", record(("GetInfo", "ok"), ("NodePrepareResources", "timeout")))) == 1
    assert found(tmp_path / "b", record(("GetInfo", "ok"), ("NodePrepareResources", "ok"))) == []


def test_not_evaluated_when_sockets_were_listed_but_no_probe_recorded(tmp_path: Path) -> None:
    listing = {"listdir": {"/var/lib/kubelet/plugins_registry": [f"{DRIVER}-reg.sock"]},
               "stat": {REG: {"path": REG, "kind": "other", "mode": 0o140755}}}
    root = bundle(tmp_path, {"/etc/hostname": "n\n"}, meta=listing)
    rep = engine.run(facts_of(root), engine.select(engine.all_rules(), ("GPU-DRA-030",)), mode="bundle")
    assert rep.findings == [] and any("no DRA plugin probe recorded" in str(s) for s in rep.skipped), rep.skipped


def test_a_node_without_dra_sockets_is_checked_and_silent(tmp_path: Path) -> None:
    root = bundle(tmp_path, {"/etc/hostname": "n\n"})
    rep = engine.run(facts_of(root), engine.select(engine.all_rules(), ("GPU-DRA-030",)), mode="bundle")
    assert rep.findings == [] and rep.skipped == []


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                       lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(
                           ["status", "value", "driver", "calls", "rpc", "elapsed_s", "info", "detail", "socket"]),
                           c, max_size=5), max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(JSONISH)
def test_garbage_records_never_raise_nor_confirm_from_nothing(doc) -> None:
    from gpuwarden.facts import FactUnavailable

    try:
        p = from_json(doc, recorded=True)
    except FactUnavailable:
        return
    for d in p.drivers:
        for c in d.calls:
            assert isinstance(c.status, str) and isinstance(c.elapsed_s, float)
