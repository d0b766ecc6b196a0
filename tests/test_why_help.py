"""`gpuwarden why --help` names every symptom of the triage table (issue 44: it omitted claim-pods-stuck)."""

from __future__ import annotations

from click.testing import CliRunner

from gpuwarden import why
from gpuwarden.cli import main


def test_why_help_lists_every_symptom_of_the_table_whole() -> None:
    out = CliRunner().invoke(main, ["why", "--help"]).output
    lines = {ln.strip() for ln in out.splitlines()}
    assert "claim-pods-stuck" in why.symptoms()
    missing = [s for s in why.symptoms() if s not in lines]  # each on its own line: no id cut by wrapping
    assert missing == []
    assert "{symptoms}" not in out


def test_why_help_follows_the_table(monkeypatch) -> None:
    """The help is the table's, read when shown: a symptom added to the table is in the help."""
    table = dict(why.symptoms())
    extra = next(iter(table.values()))
    monkeypatch.setattr(why, "symptoms", lambda: {**table, "gpu-on-fire": extra})
    out = CliRunner().invoke(main, ["why", "--help"]).output
    assert "gpu-on-fire" in {ln.strip() for ln in out.splitlines()}
