"""GPU-K8S-020..022 are catalog entries of scope "api" (rules/dra_api.py): first-class for `gpuwarden
explain`, `gpuwarden rules` and docs/rules.md, stamped on the agent's findings, and never run by the
engine on a node's facts, so a node check neither lists them "not evaluated" nor, in the agent,
counts them "good" (which would clear a verdict only the API can make)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gpuwarden import engine
from gpuwarden.agent.dra import NodeSide, judge
from gpuwarden.cli import main
from gpuwarden.examples import open_example
from gpuwarden.facts import NodeFacts, Settings
from gpuwarden.findings import Status
from gpuwarden.kube.dra import parse_slices
from gpuwarden.rules import all_rules, get_rule

API = ("GPU-K8S-020", "GPU-K8S-021", "GPU-K8S-022")


def test_api_codes_are_in_the_catalog_with_scope_api():
    rules = {r.code: r for r in all_rules()}
    assert all(rules[c].scope == "api" and rules[c].family == "dra" for c in API)
    assert {r.scope for r in rules.values() if r.code not in API} == {"node"}
    out = CliRunner().invoke(main, ["explain", "GPU-K8S-020"])
    assert out.exit_code == 0 and "raised by: the gpuwarden agent, from the API server" in out.output
    assert "kubernetes/kubernetes#141912" in out.output
    listed = json.loads(CliRunner().invoke(main, ["rules", "--format", "json"]).output)
    assert set(API) <= {r["code"] for r in listed}


def test_the_engine_never_runs_them_on_a_node():
    facts = NodeFacts(open_example("healthy"), Settings(probes=False))
    report = engine.run(facts)
    codes = {s.code for s in report.skipped} | {f.code for f in report.findings}
    assert not codes & set(API)
    assert report.rules_run == len([r for r in all_rules() if r.scope == "node"]) - len(report.skipped) \
        - len(report.not_applicable)
    only = engine.run(NodeFacts(open_example("healthy"), Settings(probes=False)), [get_rule("GPU-K8S-020")])
    assert only.rules_run == 0 and not only.skipped and only.not_checked == "no rule was selected"


def test_the_agents_verdict_carries_the_catalog_entry():
    sl = parse_slices("n1", "gpu.nvidia.com", [{"metadata": {"name": "s"}, "spec": {
        "nodeName": "n1", "driver": "gpu.nvidia.com", "pool": {"name": "n1", "generation": 1},
        "devices": [{"name": "gpu-0"}]}}])
    [f] = judge(sl, NodeSide("gpu.nvidia.com", "absent"), [], [], 0.0).findings
    r = get_rule("GPU-K8S-020")
    assert (f.code, f.status, f.title, f.severity, f.family) == (r.code, Status.CONFIRMED, r.title, r.severity, r.family)
    assert f.remedy == r.remedy and f.references == r.references


def test_the_agent_counts_no_api_code_good_from_a_node_check(tmp_path):
    from gpuwarden.agent.config import AgentConfig
    from gpuwarden.agent.loop import Agent
    from tests.support.agent_kube import Quiet

    agent = Agent(AgentConfig(node_name="n1", kube=False, listen="", probes=False, grpc=False, boot_grace_s=0,
                              dra_driver="gpu.nvidia.com"), root=open_example("healthy"), log=Quiet())
    res = agent.check()
    assert res.observed  # the node rules were observed
    assert not set(API) & set(res.observed)  # no API read (no client): not observed at all, never "good"
