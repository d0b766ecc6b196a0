"""The terminal report: worst first, evidence and the fix under each finding."""

from __future__ import annotations

import textwrap
from typing import TextIO

from gpuwarden.findings import Finding, Report, Severity, Status

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


def _c(text: str, code: str, color: bool) -> str:
    return f"{code}{text}{_RESET}" if color else text


def _indent(text: str, prefix: str = "      ") -> str:
    return textwrap.indent(text, prefix)


def _finding(f: Finding, color: bool, verbose: bool) -> list[str]:
    sev = _c(f"{f.severity.label.upper():8}", _COLORS[f.severity], color)
    status = "CONFIRMED" if f.status == Status.CONFIRMED else "AT-RISK  "
    lines = [f"{sev} {status} {_c(f.code, _BOLD, color)}  {f.title}", _indent(f.summary, "    ")]
    if f.mechanism:
        lines.append(f"    mechanism: {f.mechanism}")
    if f.affected:
        shown = f.affected if verbose else f.affected[:8]
        lines.append("    affected:")
        lines += [f"      - {a}" for a in shown]
        if len(f.affected) > len(shown):
            lines.append(f"      … and {len(f.affected) - len(shown)} more")
    if f.evidence:
        lines.append("    evidence:")
        shown_ev = f.evidence if verbose else f.evidence[:12]
        for e in shown_ev:
            lines.append(f"      - {e.text}")
            lines.append(_c(f"          [{e.source}]", _DIM, color))
        if len(f.evidence) > len(shown_ev):
            lines.append(f"      … and {len(f.evidence) - len(shown_ev)} more (--verbose)")
    lines.append("    fix:")
    lines.append(_indent(f.remedy))
    if verbose and f.references:
        lines.append("    references: " + "; ".join(f.references))
    return lines


def render(report: Report, out: TextIO, color: bool = False, verbose: bool = False) -> None:
    node = report.node
    name = node.get("hostname") or node.get("name") or node.get("source", "")
    out.write(_c(f"gpuwarden {report.tool_version} — node {name} ({report.mode}: {node.get('source', '')})", _BOLD, color) + "\n")
    facts = [f"{k}={v}" for k, v in node.items() if k in ("driver", "gpus", "kernel", "cgroup") and v]
    if facts:
        out.write("  " + ", ".join(facts) + "\n")
    out.write("\n")
    findings = report.sorted_findings()
    if report.not_checked:  # never "No problems found" for a node that was not looked at
        out.write(_c(f"Not checked: {report.not_checked}.", _BOLD, color) + f" {report.rules_run} rule(s) evaluated.\n")
    elif not findings:
        out.write(_c("No problems found.", "\033[32m", color) + f" {report.rules_run} rule(s) evaluated.\n")
    for f in findings:
        out.write("\n".join(_finding(f, color, verbose)) + "\n\n")
    if report.skipped:
        out.write(_c(f"Not evaluated ({len(report.skipped)} rule(s) lacked evidence):", _BOLD, color) + "\n")
        for s in report.skipped:
            out.write(f"  - {s.code}: {s.reason}\n")
    if report.gaps:
        out.write(_c(f"Unavailable evidence ({len(report.gaps)}):", _BOLD, color) + "\n")
        for g in report.gaps[: (None if verbose else 15)]:
            out.write(f"  - {g.source}: {g.reason}\n")
        if not verbose and len(report.gaps) > 15:
            out.write(f"  … and {len(report.gaps) - 15} more (--verbose)\n")
    for e in report.errors:
        out.write(_c(f"internal error (report is partial): {e}", _COLORS[Severity.HIGH], color) + "\n")
    worst = report.worst()
    out.write(
        f"\n{len(findings)} finding(s)"
        + (f", worst {worst.label}" if worst is not None else "")
        + f"; {report.rules_run} rule(s) run in {report.duration_s * 1000:.0f} ms.\n"
    )
