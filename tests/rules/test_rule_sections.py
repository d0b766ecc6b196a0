"""Every rule reads only the fact sections it declares, and never the root.

A rule's `needs` are the sections it cannot be evaluated without, its `uses` those it reads when
they are there. Each rule runs here against facts that hold its `needs` and, in turn, none and all
of its `uses`; any other section, and any reach past the facts to the node's files, fails the test.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from gpuwarden import engine
from gpuwarden.examples import names, open_bundle_dir, open_example
from gpuwarden.facts import FactUnavailable, NodeFacts, Settings
from gpuwarden.facts.node import registered_facts
from gpuwarden.rules import Rule, all_rules

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"
#: what a rule may touch on its facts besides sections: the check's settings, time and bookkeeping
ALLOWED = {"settings", "now", "gap", "gaps", "errors"}


class Undeclared(BaseException):
    """Not an Exception: a rule's own `except Exception` must not swallow it."""


class DeclaredOnly:
    """The facts a rule is allowed to see: its needs, and its uses when `with_uses`."""

    def __init__(self, real: NodeFacts, r: Rule, with_uses: bool) -> None:
        self._real, self._rule, self._with_uses = real, r, with_uses

    def get(self, name: str) -> Any:
        if name in self._rule.needs or (name in self._rule.uses and self._with_uses):
            return self._real.get(name)
        if name in self._rule.uses:
            raise FactUnavailable(f"{name}: left out by the test")
        raise Undeclared(f"{self._rule.code} reads section {name!r}, in neither its needs nor its uses")

    def maybe(self, name: str) -> Any | None:
        try:
            return self.get(name)
        except FactUnavailable:
            return None

    def __getattr__(self, attr: str) -> Any:
        if attr not in ALLOWED:
            raise Undeclared(f"{self._rule.code} reaches past its sections: facts.{attr}")
        return getattr(self._real, attr)


def _nodes() -> list[tuple[str, Any]]:
    out = [(f"example:{n}", lambda n=n: open_example(n)) for n in names()]
    out += [(f"capture:{p.name}", lambda p=p: open_bundle_dir(p)) for p in sorted(CAPTURES.iterdir())
            if (p / "meta.json").is_file()]
    return out


@pytest.mark.parametrize("label,open_root", _nodes(), ids=[n for n, _ in _nodes()])
def test_rules_read_only_their_declared_sections(label: str, open_root: Any) -> None:
    facts = NodeFacts(open_root(), Settings(probes=False))
    ran = 0
    for r in all_rules():
        try:
            for n in r.needs:
                facts.get(n)
        except FactUnavailable:
            continue  # the engine would not run it (test_missing_needs_are_reported)
        for with_uses in (False, True):
            try:
                list(r.func(DeclaredOnly(facts, r, with_uses)) or ())
            except FactUnavailable:
                pass  # "not evaluated", said by the rule itself
            ran += 1
    assert ran >= 2 * 20, f"{label}: only {ran // 2} rules had their needs"


def test_declared_sections_exist() -> None:
    known = set(registered_facts())
    for r in all_rules():
        assert set(r.needs) <= known and set(r.uses) <= known, r.code
        assert not set(r.needs) & set(r.uses), f"{r.code}: a section is either needed or used"


@pytest.mark.parametrize("code", [r.code for r in all_rules() if r.needs])
def test_missing_needs_are_reported_as_not_evaluated(code: str) -> None:
    """A rule whose needed section is unavailable is listed as skipped, with that section's reason."""
    r = next(x for x in all_rules() if x.code == code)
    facts = NodeFacts(open_example("healthy"), Settings(probes=False))
    missing = r.needs[0]
    facts._failed[missing] = "withheld by the test"
    report = engine.run(facts, [r])
    assert [s.code for s in report.skipped] == [code] and report.rules_run == 0 and not report.findings
    assert report.skipped[0].reason.startswith(f"{missing}: withheld by the test")


# -- the same, read from the source: also the paths no example node reaches -----------------------------

SRC = Path(__file__).resolve().parents[2] / "src" / "gpuwarden"
ROOT_ACCESS = ("facts.root", "read_text(", "read_bytes(", "open_binary(", "listdir(", "readlink(", "gpuwarden.root",
               "glob(")


def _facts_functions() -> dict[str, list[tuple[set[str], set[str]]]]:
    """name -> (sections it asks `facts` for, names it calls) of every function of rules/ and of the
    fact helpers rules call (functions whose first parameter is `facts`)."""
    out: dict[str, list[tuple[set[str], set[str]]]] = {}
    for path in sorted((SRC / "rules").glob("*.py")) + sorted((SRC / "facts").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef):
                continue
            if path.parent.name == "facts" and (not node.args.args or node.args.args[0].arg != "facts"):
                continue
            sections, calls = set(), set()
            for n in ast.walk(node):
                if not isinstance(n, ast.Call):
                    continue
                f = n.func
                calls.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
                if (isinstance(f, ast.Attribute) and f.attr in ("get", "maybe") and isinstance(f.value, ast.Name)
                        and f.value.id == "facts" and n.args and isinstance(n.args[0], ast.Constant)):
                    sections.add(n.args[0].value)
                for a in n.args:  # a tuple of section names handed to a helper (`_maybe_many(facts, (...))`)
                    if isinstance(a, ast.Tuple) and all(isinstance(e, ast.Constant) for e in a.elts):
                        sections |= {e.value for e in a.elts if e.value in KNOWN}
            out.setdefault(node.name, []).append((sections, calls))
    return out


KNOWN = set(registered_facts())


def _reads(functions: dict[str, list[tuple[set[str], set[str]]]], name: str, seen: set[str]) -> set[str]:
    got: set[str] = set()
    for sections, calls in functions.get(name, []):
        got |= sections
        for c in calls - seen:
            seen.add(c)
            got |= _reads(functions, c, seen)
    return got


def test_rules_declare_every_section_their_code_asks_for() -> None:
    functions = _facts_functions()
    for r in all_rules():
        undeclared = _reads(functions, r.func.__name__, {r.func.__name__}) - set(r.needs) - set(r.uses)
        assert not undeclared, f"{r.code} ({r.func.__name__}) asks for {sorted(undeclared)} without declaring them"


def test_no_rule_module_reaches_the_root() -> None:
    for path in sorted((SRC / "rules").glob("*.py")):
        text = path.read_text()
        assert not [s for s in ROOT_ACCESS if s in text], f"{path.name} reads the node itself: make it a fact section"
