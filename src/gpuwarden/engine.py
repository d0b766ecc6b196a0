"""Run every selected rule over one node's facts, each in its own error boundary."""

from __future__ import annotations

import time
from typing import Iterable

from gpuwarden import __version__
from gpuwarden.facts import FactUnavailable, NodeFacts, NotApplicable
from gpuwarden.facts.identity import DRIVER_VERSION_FILE, report_identity, without_nvidia_gpu
from gpuwarden.findings import Affected, Finding, Report, Skipped
from gpuwarden.parsers.wallclock import format_rfc3339
from gpuwarden.rules import Rule, all_rules
from gpuwarden.rules.base import rules_for  # noqa: F401  (what a --select needs, imported lazily)


def select(rules: Iterable[Rule], only: Iterable[str] = (), ignore: Iterable[str] = ()) -> list[Rule]:
    """--select / --ignore by code or code prefix (GPU-DEV selects the family)."""
    only_u = [s.upper() for s in only]
    ign_u = [s.upper() for s in ignore]
    out = []
    for r in rules:
        if only_u and not any(r.code.startswith(s) for s in only_u):
            continue
        if any(r.code.startswith(s) for s in ign_u):
            continue
        out.append(r)
    return out


def _load_errors() -> list[str]:
    """Rule and fact modules that failed to import: what they would have checked was not checked."""
    from gpuwarden.facts import node
    from gpuwarden.rules import base

    return ([f"rule module {m} failed to import: {e}" for m, e in sorted(base.LOAD_ERRORS.items())]
            + [f"fact module {m} failed to import: {e}" for m, e in sorted(node.IMPORT_ERRORS.items())])


def _name_plugin_pod(facts: NodeFacts, findings: list[Finding]) -> None:
    """A fix that restarts "the device-plugin pod" names it when the node shows which pod it is
    (the `plugin_pod` section): added to the finding's affected objects (kind `plugin`), which the text
    report fills into the fix's `kubectl delete pod` and the JSON carries."""
    wanting = [f for f in findings if ("<plugin-pod>" in f.remedy or "<plugin pod>" in f.remedy)
               and not any(a.kind == "plugin" and a.namespace for a in f.affected)]
    pod = facts.maybe("plugin_pod") if wanting else None
    for f in wanting if pod is not None else ():
        f.affected.append(Affected("plugin", pod.name, pod.namespace, pod.uid,
                                   detail=f"the device-plugin pod, pid {pod.pid}"))


EXAMPLE_HINT = "to see gpuwarden at work without a GPU: gpuwarden check --example uvm-missing (gpuwarden examples)"


#: a report without findings is a verdict of health only when at least this share of the rules that apply
#: to the node was evaluated (README, exit codes, where tests/test_readme_figures.py keeps the figures true)
MIN_EVALUATED_SHARE = 0.5


def not_checked(facts: NodeFacts, applicable: int, rules_run: int, findings: list[Finding], chosen: int = -1) -> str:
    """Why a report without findings is no verdict of health, or "" when it is one.

    "No problems found" must mean the rules looked and found nothing: not that no rule was chosen, the
    node has no NVIDIA GPU at all (GPU-DRV-001 speaks when the PCI bus shows NVIDIA GPUs without a
    driver), none of the chosen rules applies to it, or none (or fewer than MIN_EVALUATED_SHARE of
    those that apply) could read its evidence. `applicable`: the chosen rules less those that do not
    apply to the node (facts.NotApplicable: no DRA), which are no gap and no part of the share.
    """
    chosen = applicable if chosen < 0 else chosen
    if findings:
        return ""
    if chosen == 0:
        return "no rule was selected"
    if without_nvidia_gpu(facts):  # first: what no rule could have found on any node without a GPU
        where = "this host" if facts.root.live else "this node"
        return (f"no NVIDIA GPU on {where}: no NVIDIA GPU on the PCI bus and no NVIDIA driver loaded "
                f"({DRIVER_VERSION_FILE} is absent); {EXAMPLE_HINT}")
    if applicable == 0:
        return f"none of the {chosen} selected rule(s) applies to this node"
    if rules_run == 0:
        return f"none of the {applicable} selected rule(s) could be evaluated (their evidence is unreadable)"
    if rules_run < applicable * MIN_EVALUATED_SHARE:
        return (f"only {rules_run} of {applicable} selected rule(s) could be evaluated (a verdict needs at least "
                f"{MIN_EVALUATED_SHARE:.0%}): the node's evidence is missing or unreadable")
    return ""


def run(facts: NodeFacts, rules: Iterable[Rule] | None = None, mode: str = "live") -> Report:
    t0 = time.perf_counter()
    # a node's facts judge node rules only: API-side verdicts (scope "api") are the agent's to make
    chosen = [r for r in (rules if rules is not None else all_rules()) if r.scope == "node"]
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    errors: list[str] = []
    not_applicable: list[Skipped] = []
    for r in chosen:
        missing, absent = [], []
        for need in r.needs:
            try:
                facts.get(need)
            except NotApplicable as exc:
                absent.append(f"{need}: {exc}")
            except FactUnavailable as exc:
                missing.append(f"{need}: {exc}")
        if absent:  # the node has no such thing: the rule does not apply, whatever else is unreadable
            not_applicable.append(Skipped(r.code, "; ".join(absent)))
            continue
        if missing:
            skipped.append(Skipped(r.code, "; ".join(missing)))
            continue
        try:
            for hit in r.func(facts) or ():
                findings.append(
                    Finding(
                        code=r.code,
                        status=hit.status,
                        severity=hit.severity if hit.severity is not None else r.severity,
                        title=r.title,
                        summary=hit.summary,
                        affected=list(hit.affected),
                        evidence=list(hit.evidence),
                        remedy=hit.remedy if hit.remedy is not None else r.remedy,
                        references=r.references,
                        mechanism=hit.mechanism,
                        family=r.family,
                        data=dict(hit.data),
                    )
                )
        except NotApplicable as exc:
            not_applicable.append(Skipped(r.code, str(exc)))
        except FactUnavailable as exc:
            skipped.append(Skipped(r.code, str(exc)))
        except Exception as exc:  # one broken rule must not hide the others
            errors.append(f"rule {r.code} failed: {type(exc).__name__}: {exc}")
    rules_run = len(chosen) - len(skipped) - len(not_applicable)
    _name_plugin_pod(facts, findings)
    report = Report(
        node=report_identity(facts),
        mode=mode,
        findings=findings,
        gaps=facts.gaps(),
        skipped=skipped,
        not_applicable=not_applicable,
        errors=facts.errors + _load_errors() + errors,
        rules_run=rules_run,
        not_checked=not_checked(facts, len(chosen) - len(not_applicable), rules_run, findings, len(chosen)),
        duration_s=time.perf_counter() - t0,
        generated_at=format_rfc3339(time.time()),
        tool_version=__version__,
    )
    return report
