"""The README's figures are computed, not remembered (issue 44: its sample "Not checked" line and its
"empty directory: 9 of 32" had gone stale), and what it links is in the repository."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner

from gpuwarden import examples
from gpuwarden.cli import main
from gpuwarden.rules import all_rules, get_rule
from tests.support.bundles import REPO

README = (REPO / "README.md").read_text()


def _sample() -> tuple[str, list[str]]:
    """(the command the README runs, the lines of its sample report)."""
    m = re.search(r"A finding looks like this \(`gpuwarden (check --example [a-z-]+)`\).*?```\n(.*?)```", README, re.S)
    assert m, "the README's sample report"
    return m[1], m[2].splitlines()


def test_the_sample_report_is_what_the_command_prints() -> None:
    command, sample = _sample()
    out = CliRunner().invoke(main, command.split()).output.splitlines()
    shown = [ln for ln in sample if ln.strip() != "…"]
    at = 0
    for line in shown:  # every line of the sample, in the order the command prints them ("…" leaves some out)
        assert line in out[at:], f"README sample line not printed (in this order) by `gpuwarden {command}`: {line!r}"
        at = out.index(line, at) + 1
    tail = [ln for ln in out if ln.startswith(("Not checked:", "Not applicable:"))]
    assert tail and all(ln in sample for ln in tail)  # the lines of what was not checked, all of them


def test_the_empty_directory_figures(tmp_path) -> None:
    m = re.search(r"an empty directory as `--root`: (\d+) of (\d+)\)", README)
    assert m, "the README's figures for an empty directory"
    r = CliRunner().invoke(main, ["check", "--root", str(tmp_path), "--format", "json"])  # as a user runs it
    js = json.loads(r.stdout)
    applicable = len([x for x in all_rules() if x.scope == "node"]) - len(js["not_applicable"])
    assert r.exit_code == 4 and (int(m[1]), int(m[2])) == (js["summary"]["rules_run"], applicable)
    assert js["summary"]["not_checked"].startswith(f"only {m[1]} of {m[2]} ")


def test_what_the_readme_links_is_in_the_repository() -> None:
    assert "shared/incidents" not in README  # docs/incidents.md is the repository's own summary
    for path in set(re.findall(r"`((?:docs|deploy|tools|bench|tests|scripts)/[\w./-]+)`", README)):
        assert (REPO / path).exists(), path


def test_the_incidents_page_names_rules_and_examples_that_exist() -> None:
    text = (REPO / "docs/incidents.md").read_text()
    assert "shared/incidents/README.md" in text  # its origin, cited
    codes = set(re.findall(r"GPU-[A-Z]+-\d{3}", text))
    assert codes and all(get_rule(c) is not None for c in codes), codes
    named = set(re.findall(r"`([a-z0-9-]+)`", text)) & set(examples.names())
    cited = {n for n in examples.names() if re.match(r"(The DRA form of i|I)ncidents? ", examples.describe(n))}
    assert cited <= named, cited - named  # every example of an incident is on the page
