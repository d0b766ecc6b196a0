"""Conformance of the rule catalog, the examples and the report schema.

Every rule needs a positive and a negative test, declared with the marker registered in
tests/conftest.py:

    @pytest.mark.rule("GPU-DEV-001", "positive")
    def test_...(): ...

The marks are read from the test sources (not from a collection run), so this check works
when run alone and sees every test file under tests/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwarden import examples
from gpuwarden.cli import main
from gpuwarden.facts import registered_facts
from gpuwarden.findings import Severity
from gpuwarden.rules import all_rules
from tests.support.minischema import validate
from tests.support.bundles import CAPTURE, REPO

TESTS = REPO / "tests"
CODE_RE = re.compile(r"^GPU-(DEV|K8S|DRV|HW|NODE|DRA)-\d{3}$")
_MARK = re.compile(r"""mark\.rule\(\s*["'](GPU-[A-Z0-9]+-\d{3})["']\s*,\s*["'](positive|negative|clears)["']\s*\)""")
RULES = all_rules()
SCHEMA = json.loads((REPO / "docs/report-schema.json").read_text())


def declared_cases() -> dict[str, set[str]]:
    """code -> {"positive", "negative", "clears"} from every @pytest.mark.rule(...) in the test sources."""
    out: dict[str, set[str]] = {}
    for f in TESTS.rglob("*.py"):
        if "fixtures" in f.parts:
            continue
        for code, kind in _MARK.findall(f.read_text(errors="replace")):
            out.setdefault(code, set()).add(kind)
    return out


CASES = declared_cases()


def test_every_rule_and_fact_module_imports() -> None:
    """The engine survives a module that fails to import (and reports it); the catalog must not."""
    from gpuwarden.facts import node
    from gpuwarden.rules import base

    registered_facts()
    assert base.LOAD_ERRORS == {} and node.IMPORT_ERRORS == {}


def test_rules_are_registered() -> None:
    assert {"GPU-DEV-001", "GPU-DEV-002", "GPU-DEV-003"} <= {r.code for r in RULES}


def test_codes_unique_and_well_formed() -> None:
    codes = [r.code for r in RULES]
    assert len(codes) == len(set(codes))
    bad = [c for c in codes if not CODE_RE.match(c)]
    assert bad == []
    titles = [r.title for r in RULES]
    assert len(titles) == len(set(titles)), "two rules share a title"


@pytest.mark.parametrize("r", RULES, ids=[r.code for r in RULES])
def test_rule_metadata(r) -> None:
    assert r.title.strip() and r.remedy.strip() and r.family.strip() and r.automation.strip()
    assert isinstance(r.severity, Severity)
    assert r.explanation.strip(), f"{r.code} has no docstring (its `gpuwarden explain` page)"
    assert len(r.explanation.splitlines()) >= 3, f"{r.code}: the explanation should say how the rule decides"
    assert all(isinstance(x, str) and x for x in r.references)
    unknown = [n for n in r.needs if n not in registered_facts()]
    assert unknown == [], f"{r.code} needs unregistered fact sections {unknown}"
    assert r.code.split("-")[1] in {"DEV", "K8S", "DRV", "HW", "NODE", "DRA"}


@pytest.mark.parametrize("r", RULES, ids=[r.code for r in RULES])
def test_rule_has_positive_and_negative_tests(r) -> None:
    have = CASES.get(r.code, set())
    missing = {"positive", "negative"} - have
    assert not missing, (f"{r.code} lacks {sorted(missing)} test(s): mark them with "
                         f'@pytest.mark.rule("{r.code}", "positive"|"negative")')


@pytest.mark.parametrize("r", RULES, ids=[r.code for r in RULES])
def test_condition_raising_rule_has_a_clears_test(r) -> None:
    """Every rule the agent can raise a NodeCondition for (agent/conditions.py maps its code or family to a
    type) has a test that the finding, or the condition, goes once its cause is gone."""
    from gpuwarden.kube.conditions import CONDITION_TYPES, condition_type

    if condition_type(r.code, r.family) not in CONDITION_TYPES:
        return
    assert "clears" in CASES.get(r.code, set()), (
        f"{r.code} raises {condition_type(r.code, r.family)} but has no test that it clears: mark one with "
        f'@pytest.mark.rule("{r.code}", "clears") (tests/agent/test_every_condition_clears.py shows the pattern)')


def test_marks_name_real_rules() -> None:
    stale = sorted(set(CASES) - {r.code for r in RULES})
    assert stale == [], f"tests are marked for rules that do not exist: {stale}"


def test_mark_scanner_sees_this_suite() -> None:
    assert CASES["GPU-DEV-001"] >= {"positive", "negative", "clears"}


# --- examples ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", examples.names())
def test_example_is_documented(name: str) -> None:
    d = examples.HERE / name
    origin = (d / "ORIGIN.md").read_text()
    assert origin.strip() and len(origin) > 80, f"{name}/ORIGIN.md must say where each file came from"
    meta = json.loads((d / "meta.json").read_text())
    assert isinstance(meta.get("description"), str) and meta["description"].strip()
    assert examples.describe(name) == meta["description"]
    assert meta.get("format") == "gpuwarden.bundle/v1"
    if "base" in meta:
        assert meta["base"] in examples.names() and meta["base"] != name
    assert (d / "files").is_dir()


def test_examples_listed_by_the_cli_are_the_package_examples() -> None:
    out = CliRunner().invoke(main, ["examples"]).stdout
    assert [ln.split()[0] for ln in out.splitlines()] == examples.names()


# --- the report schema -----------------------------------------------------------------------------------


def test_schema_file() -> None:
    assert SCHEMA["properties"]["schema"]["const"] == "gpuwarden.report/v1"
    from gpuwarden.findings import SCHEMA as CODE_SCHEMA

    assert SCHEMA["properties"]["schema"]["const"] == CODE_SCHEMA
    assert set(SCHEMA["required"]) == set(SCHEMA["properties"])


@pytest.mark.parametrize("source", [["--example", n] for n in examples.names()] + [["--bundle", str(CAPTURE)]],
                         ids=lambda a: a[1].rsplit("/", 1)[-1])
def test_reports_validate_against_the_schema(source: list[str]) -> None:
    r = CliRunner().invoke(main, ["check", *source, "--format", "json"])
    assert r.exit_code in (0, 1), r.output
    js = json.loads(r.stdout)
    assert validate(js, SCHEMA) == []


def test_schema_checker_catches_violations() -> None:
    r = CliRunner().invoke(main, ["check", "--example", "uvm-missing", "--format", "json"])
    js = json.loads(r.stdout)
    f = js["findings"][0]
    f["status"] = "maybe"
    f["evidence"].append({"source": "x"})
    del js["unavailable"]
    js["extra"] = 1
    errs = validate(js, SCHEMA)
    assert any("maybe" in e for e in errs)
    assert any("missing required key 'text'" in e for e in errs)
    assert any("missing required key 'unavailable'" in e for e in errs)
    assert any("unexpected key 'extra'" in e for e in errs)


def test_report_schema_is_documented_in_tree() -> None:
    assert Path(REPO / "docs/report-schema.json").is_file()
