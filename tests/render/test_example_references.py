"""Every `--example NAME` the catalog shows a user names an example that exists and reproduces what it is
cited for (issue 44: GPU-DRA-010's DRA form pointed at `uvm-missing`, the device-plugin form)."""

from __future__ import annotations

import re

from click.testing import CliRunner

from gpuwarden import examples
from gpuwarden.cli import main
from gpuwarden.render import wording
from gpuwarden.rules import all_rules

_EXAMPLE = re.compile(r"--example ([A-Za-z0-9_.-]+)")


def _explained(code: str) -> str:
    r = CliRunner().invoke(main, ["explain", code])
    assert r.exit_code == 0, r.output
    return r.output


def test_every_example_the_catalog_names_exists() -> None:
    names = set(examples.names())
    bad = {}
    for rule in all_rules():
        named = set(_EXAMPLE.findall(_explained(rule.code)))
        if named - names:
            bad[rule.code] = sorted(named - names)
    assert bad == {}


def test_a_reference_to_an_incident_names_an_example_of_that_form() -> None:
    """An incident reference gets its examples; its DRA form only the DRA ones, its plain form none of them."""
    dra_examples = {n for n in examples.names() if "DRA form" in examples.describe(n)}
    assert dra_examples == {"dra-uvm-missing"}
    seen = 0
    for rule in all_rules():
        for ref in rule.references:
            if not re.search(r"\bincidents? \d", ref, re.I) or "shared/" not in ref:
                continue
            shown = set(_EXAMPLE.findall(wording.reference(ref)))
            assert shown, (rule.code, ref)
            if "DRA form" in ref:
                assert shown <= dra_examples, (rule.code, shown)
            else:
                assert not shown & dra_examples, (rule.code, shown)
            seen += 1
    assert seen >= 8


def test_gpu_dra_010_names_the_dra_example() -> None:
    out = _explained("GPU-DRA-010")
    assert "--example dra-uvm-missing" in out and "--example uvm-missing`" not in out
    assert "--example uvm-missing" in _explained("GPU-DEV-001")  # the negative: the plain form keeps its example
