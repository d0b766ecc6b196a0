"""The chart's alerts and Grafana dashboard, checked with Prometheus' own promtool and against the
metrics a real agent serves on /metrics.

- The PrometheusRule the chart renders (metrics.prometheusRule.enabled) is written as a rule file
  and run through `promtool check rules` and `promtool test rules` (tests/deploy/alerts_test.yaml);
  every dashboard query is checked by promtool too (as a recording rule's expression).
- Every metric the alerts and the dashboard query, and every label they group or match by, is one
  the agent exports: the exposition is read over HTTP from a running agent on built-in examples.

promtool comes from Debian's `prometheus` package (scripts/test installs it as root); where it is
missing the promtool tests skip, saying so (GPUWARDEN_REQUIRE_PROMTOOL=1 makes that a failure).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_FILES = REPO / "deploy" / "helm" / "gpuwarden" / "files"
_spec = importlib.util.spec_from_file_location("gw_render_alerts", REPO / "deploy" / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)

#: labels a scrape through the chart's ServiceMonitor adds to every series (and a histogram's `le`)
SCRAPE_LABELS = {"node", "namespace", "pod", "job", "instance", "service", "container", "endpoint", "le"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        reason = ("PROMTOOL UNAVAILABLE: install Debian's `prometheus` package (apt-get install prometheus; "
                  "scripts/test does it as root) to run the alert tests")
        if os.environ.get("GPUWARDEN_REQUIRE_PROMTOOL") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return path


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(render.rules_file())["groups"] for r in g["rules"]]


def dashboard() -> dict:
    return json.loads((CHART_FILES / "dashboard.json").read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def promql(expr: str) -> str:
    """A dashboard query as Prometheus sees it once Grafana substituted its variables."""
    return expr.replace("$__rate_interval", "5m").replace("$node", ".*")


# ---- promtool ------------------------------------------------------------------------------------

def test_promtool_checks_the_rendered_rules(tmp_path: Path) -> None:
    (tmp_path / "gpuwarden.rules.yaml").write_text(render.rules_file())
    p = _promtool("check", "rules", "gpuwarden.rules.yaml", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in p.stdout


def test_promtool_unit_tests_of_the_alerts(tmp_path: Path) -> None:
    (tmp_path / "gpuwarden.rules.yaml").write_text(render.rules_file())
    shutil.copy(REPO / "tests" / "deploy" / "alerts_test.yaml", tmp_path)
    p = _promtool("test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    tested = set(re.findall(r"alertname: (\w+)", (tmp_path / "alerts_test.yaml").read_text()))
    assert tested == {r["alert"] for r in alert_rules()}, "every alert has a promtool unit test"


def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    rules = [{"record": f"gpuwarden_dashboard:q{i}", "expr": promql(e)} for i, e in enumerate(dashboard_exprs())]
    (tmp_path / "dashboard.rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": rules}]}))
    p = _promtool("check", "rules", "dashboard.rules.yaml", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_shipped_rule_file_is_the_charts() -> None:
    assert render.RULES.read_text() == render.rules_file(), "run .venv/bin/python deploy/render.py"


# ---- kube-prometheus conventions -----------------------------------------------------------------

def test_alerts_follow_kube_prometheus_conventions() -> None:
    runbooks = (REPO / "docs" / "runbooks.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", runbooks, re.M)}
    for r in alert_rules():
        assert re.fullmatch(r"Gpuwarden[A-Z][A-Za-z]+", r["alert"])
        assert r["labels"]["severity"] in ("critical", "warning", "info"), r["alert"]
        assert {"summary", "description", "runbook_url"} <= set(r["annotations"]), r["alert"]
        url, _, anchor = r["annotations"]["runbook_url"].partition("#")
        assert url.endswith("docs/runbooks.md") and anchor in anchors, (r["alert"], anchor)


def test_the_chart_ships_rule_and_dashboard_when_asked() -> None:
    objs = render.objects({"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}},
                                       "grafanaDashboard": {"enabled": True},
                                       "serviceMonitor": {"enabled": True}}})
    kinds = {o["kind"]: o for o in objs if o["kind"] in ("PrometheusRule", "ServiceMonitor")}
    assert kinds["PrometheusRule"]["metadata"]["labels"]["release"] == "kps"
    relabel = kinds["ServiceMonitor"]["spec"]["endpoints"][0]["relabelings"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in relabel
    [cm] = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["gpuwarden.json"]) == dashboard()
    assert not [o for o in render.objects() if o["kind"] == "PrometheusRule" or o["metadata"]["name"].endswith(
        "-dashboard")], "both are off by default (they need the Prometheus Operator / Grafana's sidecar)"


# ---- against what the agent really exports -------------------------------------------------------

@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """metric name -> label names, from the /metrics of a running agent on built-in examples."""
    from prometheus_client.parser import text_string_to_metric_families

    from gpuwarden.agent.config import AgentConfig
    from gpuwarden.agent.loop import Agent
    from gpuwarden.agent.metrics import METRICS
    from gpuwarden.examples import open_example

    class Quiet:
        def info(self, *a, **k): ...
        warn = error = info

    out: dict[str, set[str]] = {}
    for example in ("egl-framebuffer-escape", "uvm-missing"):
        cfg = AgentConfig(node_name="n", kube=False, listen="127.0.0.1:0", probes=False, grpc=False, boot_grace_s=0)
        a = Agent(cfg, root=open_example(example), log=Quiet())
        a.start()
        try:
            a.check(), a.check()
            with urllib.request.urlopen(f"http://{a.server.address}/metrics", timeout=5) as r:
                text = r.read().decode()
        finally:
            a.server.stop()
        for fam in text_string_to_metric_families(text):
            names = out.setdefault(fam.name + ("_total" if fam.type == "counter" else ""), set())
            for s in fam.samples:
                names |= set(s.labels)
                out.setdefault(s.name, set()).update(s.labels)
    # a family with no sample yet (no probe timed out, no action planned) shows no labels: take the
    # agent's declaration, which the families that do have samples must match
    for name, (kind, _, labels) in METRICS.items():
        assert name in out, f"{name} is declared but not served"
        if out[name] and kind != "histogram":
            assert out[name] == set(labels), name
        out[name] |= set(labels)
        if kind == "histogram":
            for suffix, extra in (("_bucket", {"le"}), ("_sum", set()), ("_count", set())):
                out.setdefault(name + suffix, set()).update(set(labels) | extra)
    return out


_IDENT = re.compile(r"\b(gpuwarden_[a-z_]+)\b")
_BY = re.compile(r"\b(?:by|on|without|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_MATCH = re.compile(r"(gpuwarden_[a-z_]+)\{([^}]*)\}")


def _check_query(expr: str, exported: dict[str, set[str]]) -> None:
    metrics = set(_IDENT.findall(expr))
    assert metrics, expr
    for m in metrics:
        assert m in exported, f"{m} is not a metric the agent serves: {expr}"
    labels = set().union(*(exported[m] for m in metrics)) | SCRAPE_LABELS
    for group in _BY.findall(expr):
        for label in filter(None, (x.strip() for x in group.split(","))):
            assert label in labels, f"label {label!r} is on none of {sorted(metrics)}: {expr}"
    for m, matchers in _MATCH.findall(expr):
        for label in re.findall(r"(\w+)\s*[=!]~?", matchers):
            assert label in exported[m] | SCRAPE_LABELS, f"{m} has no label {label!r}: {expr}"


def test_alert_queries_use_what_the_agent_exports(exported) -> None:
    for r in alert_rules():
        _check_query(r["expr"], exported)


def test_dashboard_queries_use_what_the_agent_exports(exported) -> None:
    exprs = dashboard_exprs()
    for e in exprs:
        _check_query(e, exported)
    shown = " ".join(exprs)
    for wanted in ("gpuwarden_uncharged_memory_bytes", "gpuwarden_uncharged_memory_growth_bytes_per_second",
                   "gpuwarden_node_condition", "gpuwarden_findings", "gpuwarden_remediation_actions_total",
                   "gpuwarden_probe_timeouts_total"):
        assert wanted in shown, wanted


def test_runbook_links_resolve_in_the_repository() -> None:
    """By default each alert's runbook_url is a path of this repository with an anchor its headings make;
    a runbookURL that is set is used as given, and NOTES says how to make the links clickable."""
    for r in alert_rules():
        path, _, anchor = r["annotations"]["runbook_url"].partition("#")
        target = REPO / path
        assert target.is_file(), (r["alert"], path)
        heads = re.findall(r"^#+ (.+)$", target.read_text(), re.M)
        assert anchor in {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in heads}, (r["alert"], anchor)
    values = {"metrics": {"prometheusRule": {"enabled": True}}}
    notes = next(t for n, t in render.template(values).items() if n.endswith("NOTES.txt"))
    assert "runbook links name docs/runbooks.md" in notes
    served = "https://wiki.example.com/gpuwarden/runbooks.md"
    values["metrics"]["prometheusRule"]["runbookURL"] = served
    [rule] = [o for o in render.objects(values) if o["kind"] == "PrometheusRule"]
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert urls and all(u.startswith(served + "#") for u in urls)
    assert "runbook links" not in next(t for n, t in render.template(values).items() if n.endswith("NOTES.txt"))
