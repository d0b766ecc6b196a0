"""docs/rules.md is generated from the registry (`gpuwarden rules --format markdown`) and kept current."""

from __future__ import annotations

from click.testing import CliRunner

from gpuwarden.cli import main
from gpuwarden.render import wording
from gpuwarden.render.rules_md import render
from gpuwarden.rules import all_rules
from tests.support.bundles import REPO


def test_docs_rules_md_is_up_to_date() -> None:
    want = render(all_rules())
    have = (REPO / "docs/rules.md").read_text()
    assert have == want, "docs/rules.md is stale: run `gpuwarden rules --format markdown > docs/rules.md`"


def test_cli_markdown_is_the_same_document() -> None:
    r = CliRunner().invoke(main, ["rules", "--format", "markdown"])
    assert r.exit_code == 0 and r.stdout == render(all_rules())


def test_every_rule_is_documented_with_its_parts() -> None:
    doc = render(all_rules())
    for r in all_rules():
        section = doc.split(f"## {r.code}\n", 1)[1].split("\n## ", 1)[0]
        assert f"**{r.title}**" in section and f"- severity: {r.severity.label}" in section
        assert f"- family: {r.family}" in section and "### Explanation" in section and "### Fix" in section
        assert r.explanation.strip().splitlines()[0] in section
        for ref in r.references:  # as a reader without the source checkout can follow it
            assert wording.reference(ref) in section and "shared/" not in section
