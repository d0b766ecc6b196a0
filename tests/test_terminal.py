"""gpuwarden.terminal: what a node's strings may not do to a terminal, and what they keep."""

from __future__ import annotations

from gpuwarden import terminal
from gpuwarden.findings import Affected, Evidence, Finding, Report, Severity, Status


def test_controls_are_shown_as_escapes() -> None:
    assert terminal.safe("a\x1b[2Jb\x07c\x9bd\x7f") == "a\\x1b[2Jb\\x07c\\x9bd\\x7f"
    assert terminal.safe("x\ny\rz") == "x\\ny\\rz"
    assert terminal.safe("\u202eevil\u2066\u2028") == "\\u202eevil\\u2066\\u2028"


def test_what_is_text_is_kept() -> None:
    for s in ("plain", "tab\tkept", "异常容器中缺少的", "café", "ml/trainer-0", "C:\\path\\x1b as typed"):
        assert terminal.safe(s) == s
    assert terminal.safe("one\ntwo\x1b", newlines=True) == "one\ntwo\\x1b"


def test_tree_copies_a_report_and_keeps_its_types() -> None:
    f = Finding("GPU-DRA-010", Status.CONFIRMED, Severity.HIGH, "t", "claim ml\x1b[31m/x",
                affected=[Affected("claim", "x\x1b]0;t\x07", "ml\n")], evidence=[Evidence("/s", "e\x1b")],
                remedy="1. a\n2. b\x1b", data={"k\x1b": ["v\x1b", ("t\x1b",)]})
    r = Report({"name": "n\x1b"}, "bundle", findings=[f], errors=["e\x1b"], rules_run=3)
    s = terminal.tree(r, multiline=("remedy",))
    g = s.findings[0]
    assert g.status is Status.CONFIRMED and g.severity is Severity.HIGH and s.rules_run == 3
    assert g.summary == "claim ml\\x1b[31m/x" and g.affected[0].name == "x\\x1b]0;t\\x07"
    assert g.affected[0].namespace == "ml\\n" and g.evidence[0].text == "e\\x1b"
    assert g.remedy == "1. a\n2. b\\x1b" and g.data == {"k\\x1b": ["v\\x1b", ("t\\x1b",)]}
    assert s.node == {"name": "n\\x1b"} and s.errors == ["e\\x1b"]
    assert f.summary == "claim ml\x1b[31m/x"  # the report itself is untouched
