"""The terminal report: worst first; each finding's first line says what is wrong, who is hit and
how soon it matters (a title too long for it gets the next line, whole); short lines of detail, evidence and the fix with the names filled in under it.

What could not be checked is one line at the end (every rule and source with `--verbose`).
Every string of the report may come from a node's files: `render` makes the whole report
terminal-safe once (gpuwarden.terminal) before it adds its own colours.
The text is pinned by golden files of every built-in example (tests/render/test_text.py).
"""

from __future__ import annotations

import re
import textwrap
from typing import TextIO

from gpuwarden import terminal
from gpuwarden.findings import Finding, Report, Severity, Status
from gpuwarden.render import wording

_COLORS = {
    Severity.CRITICAL: "\033[1;31m",
    Severity.HIGH: "\033[31m",
    Severity.MEDIUM: "\033[33m",
    Severity.LOW: "\033[36m",
    Severity.INFO: "\033[2m",
}
_RESET = "\033[0m"
_BOLD = "\033[1m"
_DIM = "\033[2m"
#: the first line of a finding stays under this many characters (a terminal, a pager, a chat message)
HEADLINE_MAX = 160
WIDTH = 100
MAX_EVIDENCE, MAX_AFFECTED = 12, 8


def _c(text: str, code: str, color: bool) -> str:
    return f"{code}{text}{_RESET}" if color else text


#: a time as the report prints it, kept on one line
_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (?:\S+ = \d\d:\d\d:\d\d )?UTC")


def _wrap(text: str, indent: str, width: int = WIDTH) -> list[str]:
    text = _TIME.sub(lambda m: m[0].replace(" ", "\xa0"), text)
    lines = textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                          break_long_words=False, break_on_hyphens=False) or [indent]
    return [ln.replace("\xa0", " ") for ln in lines]


def _sentences(text: str) -> list[str]:
    """A summary as short statements: sentences, and the clauses of a long one."""
    out: list[str] = []
    for s in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9])", text.strip()):
        parts = s.split("; ") if len(s) > WIDTH else [s]
        out += [p for p in parts if p]
    return out


class _Context:
    """What the report knows about its node, for every finding's text."""

    def __init__(self, report: Report, verbose: bool) -> None:
        node = report.node
        self.name = str(node.get("name") or node.get("hostname") or "")
        self.tz_name = str(node.get("timezone") or "")
        self.tz = wording.zone(self.tz_name)
        self.example = report.mode == "example"
        self.verbose = verbose

    def text(self, s: str, quoted: bool = False) -> str:
        """Times labelled, kB in binary units, examples not called bundles; a line quoted from a log as read."""
        if quoted:
            return s
        s = wording.binary_units(wording.times(s, self.tz, self.tz_name))
        if self.example:
            s = s.replace("this bundle", "this example")
        return s


def headline(f: Finding, node: str) -> list[str]:
    """`SEVERITY STATUS CODE  title — who — how soon` as one line of at most HEADLINE_MAX characters.

    The title is never cut: when the line would be longer, the first line keeps severity, status,
    code, who and how soon (what a pager shows), and the whole title moves to the line under it.
    """
    status = "CONFIRMED" if f.status == Status.CONFIRMED else "AT-RISK  "
    head = f"{f.severity.label.upper():8} {status} {f.code}  "
    tail = f"{wording.who(f, node)} — {wording.urgency(f)}"
    one = f"{head}{f.title} — {tail}"
    if len(one) <= HEADLINE_MAX:
        return [one]
    return [head + tail, f"    {f.title}"]


def _quoted(source: str) -> bool:
    """Evidence that is a line quoted from a log, kept as written."""
    return "log" in source.rsplit("/", 1)[-1] or source.startswith("/var/log/")


def _finding(f: Finding, ctx: _Context, color: bool) -> list[str]:
    first, *title = headline(f, ctx.name)
    sev_len = len(f.severity.label.upper().ljust(8))
    lines = [_c(first[:sev_len], _COLORS[f.severity], color) + first[sev_len:]] + title
    if ctx.verbose:
        status = ("confirmed: present now, on evidence that could not be otherwise" if f.status == Status.CONFIRMED
                  else "at risk: its preconditions are present, it is not failing yet")
        lines.append(_c(f"    {status}", _DIM, color))
    for s in _sentences(ctx.text(f.summary)):
        lines += _wrap(s, "    ")
    if f.mechanism:
        mech = ctx.text(f.mechanism)
        if not ctx.verbose and len(mech) > HEADLINE_MAX:
            mech = f"`gpuwarden explain {f.code}` (or --verbose)"
        lines += _wrap("why: " + mech, "    ")
    if f.affected:
        shown = f.affected if ctx.verbose else f.affected[:MAX_AFFECTED]
        lines.append("    affected:")
        lines += [ln for a in shown for ln in _wrap("- " + ctx.text(str(a)), "      ")]
        if len(f.affected) > len(shown):
            lines.append(f"      … and {len(f.affected) - len(shown)} more (--verbose)")
    if f.evidence:
        lines.append("    evidence:")
        shown_ev = f.evidence if ctx.verbose else f.evidence[:MAX_EVIDENCE]
        for e in shown_ev:
            quoted = _quoted(e.source)
            text = ctx.text(e.text, quoted=quoted)
            lines += [f"      - {text}"] if quoted else _wrap("- " + text, "      ")
            lines.append(_c(f"          [{e.source}]", _DIM, color))
        if len(f.evidence) > len(shown_ev):
            lines.append(f"      … and {len(f.evidence) - len(shown_ev)} more (--verbose)")
    lines.append("    fix:")
    lines.append(textwrap.indent(ctx.text(wording.fill_names(f.remedy.strip("\n"), f, ctx.name)), "      "))
    if ctx.verbose and f.references:
        lines.append("    references:")
        lines += [ln for r in f.references for ln in _wrap("- " + wording.reference(r), "      ")]
    return lines


def _rule_title(code: str) -> str:
    try:
        from gpuwarden.rules import get_rule

        r = get_rule(code)
    except Exception:  # the report may come from another version (kubectl gpuwarden check)
        return ""
    return wording.short_title(r.title) if r is not None else ""


def not_checked(report: Report, ctx: _Context) -> list[str]:
    """What was not checked: one line, or every rule and source with its reason (--verbose)."""
    if not (report.skipped or report.gaps):
        return []
    if ctx.verbose:
        out = []
        if report.skipped:
            out.append(f"Not checked ({len(report.skipped)} rule(s): the evidence they need is unavailable):")
            out += [f"  - {s.code} {_rule_title(s.code)}: {ctx.text(s.reason)}".replace("  :", ":")
                    for s in report.skipped]
        if report.gaps:
            out.append(f"Unreadable evidence ({len(report.gaps)} source(s); the rules that need it said nothing):")
            out += [f"  - {g.source}: {ctx.text(g.reason)}" for g in report.gaps]
        return out
    parts = []
    if report.skipped:
        names = [f"{s.code}" + (f" ({t})" if (t := _rule_title(s.code)) else "") for s in report.skipped[:2]]
        more = f" +{len(report.skipped) - 2}" if len(report.skipped) > 2 else ""
        parts.append(f"{len(report.skipped)} rule(s) not evaluated: " + ", ".join(names) + more)
    if report.gaps:
        labels = list(dict.fromkeys(wording.source_label(g.source) for g in report.gaps))
        parts.append(f"{len(report.gaps)} source(s) unreadable: " + ", ".join(labels[:4])
                     + (f" +{len(labels) - 4}" if len(labels) > 4 else ""))
    return ["Not checked: " + "; ".join(parts) + " (--verbose says why)."]


def not_applicable(report: Report, ctx: _Context) -> list[str]:
    """Rules that do not apply to this node (no DRA on it): one line apart from what was not checked, being
    no gap; --verbose names each with why."""
    na = report.not_applicable
    if not na:
        return []
    why = _why_not_applicable(na)
    if ctx.verbose:
        return ([f"Not applicable ({len(na)} rule(s): {why}; no gap):"]
                + [f"  - {s.code} {_rule_title(s.code)}: {ctx.text(s.reason)}".replace("  :", ":") for s in na])
    return [f"Not applicable: {len(na)} rule(s) ({', '.join(s.code for s in na)}): {why}."]


def _why_not_applicable(na: list) -> str:
    """The common reason of the not-applicable rules, in a few words ("no DRA on this node")."""
    heads = {s.reason.split(": ", 2)[1] if s.reason.count(": ") >= 2 else s.reason for s in na}
    return heads.pop() if len(heads) == 1 else "the node has none of what they judge"


def render(report: Report, out: TextIO, color: bool = False, verbose: bool = False) -> None:
    report = terminal.tree(report, multiline=("remedy",))  # node strings: no control reaches the terminal
    ctx = _Context(report, verbose)
    node = report.node
    name = node.get("hostname") or node.get("name") or "unknown"
    out.write(_c(f"gpuwarden {report.tool_version} — node {name} ({wording.origin(report)})", _BOLD, color) + "\n")
    facts = [f"{k}={v}" for k, v in node.items() if k in ("driver", "gpus", "kernel", "cgroup") and v]
    if ctx.tz is not None and ctx.tz_name and ctx.tz_name not in ("UTC", "Etc/UTC"):
        facts.append(f"node time zone {ctx.tz_name}")
    if facts:
        out.write("  " + ", ".join(facts) + "\n")
    out.write("\n")
    findings = report.sorted_findings()
    if report.not_checked:  # never "No problems found" for a node that was not looked at
        out.write(_c(f"Not checked: {report.not_checked}.", _BOLD, color)
                  + " Finding nothing here is no verdict of health.\n")
    elif not findings:
        out.write(_c("No problems found.", "\033[32m", color) + f" {report.rules_run} rule(s) evaluated.\n")
    for f in findings:
        out.write("\n".join(_finding(f, ctx, color)) + "\n\n")
    for line in not_checked(report, ctx) + not_applicable(report, ctx):
        out.write(_c(line, _DIM, color) + "\n")
    for e in report.errors:
        out.write(_c(f"internal error (report is partial): {e}", _COLORS[Severity.HIGH], color) + "\n")
    worst = report.worst()
    out.write(
        f"\n{len(findings)} finding(s)"
        + (f", worst {worst.label}" if worst is not None else "")
        + f"; {report.rules_run} rule(s) run in {report.duration_s * 1000:.0f} ms"
        + (f"; not checked: {report.not_checked_brief}.\n" if report.not_checked else ".\n")
    )
