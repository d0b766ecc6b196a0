"""Run every selected rule over one node's facts, each in its own error boundary."""

from __future__ import annotations

import datetime as dt
import time
from typing import Iterable

from gpuwarden import __version__
from gpuwarden.facts import FactUnavailable, NodeFacts
from gpuwarden.findings import Affected, Finding, Report, Skipped
from gpuwarden.parsers.wallclock import format_rfc3339
from gpuwarden.root import Missing
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
    """A fix that restarts "the device-plugin pod" names it when the node shows which pod it is.

    The plugin's process is matched to the pod whose container cgroup holds its pid; with exactly one
    such pod it is added to the finding's affected objects (kind `plugin`), which the text report fills
    into the fix's `kubectl delete pod` and the JSON carries.
    """
    wanting = [f for f in findings if ("<plugin-pod>" in f.remedy or "<plugin pod>" in f.remedy)
               and not any(a.kind == "plugin" and a.namespace for a in f.affected)]
    if not wanting:
        return
    plugin, containers = facts.maybe("plugin"), facts.maybe("containers")
    if plugin is None or containers is None:
        return
    pids = {p.pid for p in plugin.processes}
    pods = {(pod.namespace, pod.name, pod.uid, pid) for pod, c in containers.containers() for pid in set(c.pids) & pids}
    if len({p[:3] for p in pods}) != 1:
        return
    ns, name, uid, pid = sorted(pods)[0]
    for f in wanting:
        f.affected.append(Affected("plugin", name, ns, uid, detail=f"the device-plugin pod, pid {pid}"))


def node_identity(facts: NodeFacts) -> dict:
    # only what the root says: never this machine's name for a tree that does not name itself
    ident = facts.maybe("identity") or {}
    out = dict(ident, source=facts.root.label)
    tz = node_timezone(facts)
    if tz:
        out["timezone"] = tz
    return out


def node_timezone(facts: NodeFacts) -> str:
    """The node's time zone as an IANA name or a `+08:00` offset, or "" when the node does not say.

    The text report prints times in it beside UTC, so that they match the node's own log lines.
    """
    import datetime as dt

    from gpuwarden.facts.logs import node_tz

    try:
        tz, how = node_tz(facts)
    except Exception:  # an unreadable root: times stay UTC
        return ""
    if how.startswith("UTC (zone unknown)"):
        return ""
    if tz is dt.timezone.utc:
        return "UTC"
    key = getattr(tz, "key", None)
    if key:
        return str(key)
    off = dt.datetime.now(tz).utcoffset() or dt.timedelta(0)
    mins = int(off.total_seconds() // 60)
    return f"{'+' if mins >= 0 else '-'}{abs(mins) // 60:02d}:{abs(mins) % 60:02d}"


#: the driver's own file: absent when no NVIDIA kernel module is loaded
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
EXAMPLE_HINT = "to see gpuwarden at work without a GPU: gpuwarden check --example uvm-missing (gpuwarden examples)"


#: a report without findings is a verdict of health only when at least this share of the chosen rules
#: was evaluated (README, exit codes): an empty directory evaluates 9 of 32, the sparsest real capture 25
MIN_EVALUATED_SHARE = 0.5


def not_checked(facts: NodeFacts, chosen: int, rules_run: int, findings: list[Finding]) -> str:
    """Why a report without findings is no verdict of health, or "" when it is one.

    "No problems found" must mean the rules looked and found nothing: not that no rule was chosen,
    none (or fewer than MIN_EVALUATED_SHARE) could read its evidence, or the node has no NVIDIA GPU
    at all (GPU-DRV-001 speaks when the PCI bus shows NVIDIA GPUs without a driver).
    """
    if findings:
        return ""
    if chosen == 0:
        return "no rule was selected"
    if rules_run == 0:
        return f"none of the {chosen} selected rule(s) could be evaluated (their evidence is unreadable)"
    if rules_run < chosen * MIN_EVALUATED_SHARE:
        return (f"only {rules_run} of {chosen} selected rule(s) could be evaluated (a verdict needs at least "
                f"{MIN_EVALUATED_SHARE:.0%}): the node's evidence is missing or unreadable")
    version = facts.root.stat(DRIVER_VERSION_FILE)
    if isinstance(version, Missing) and version.kind == "missing":
        pci = facts.maybe("pci")  # the bus read and no GPU on it: not merely a bus we could not read
        if pci is not None and not pci.gpus():
            where = "this host" if facts.root.live else "this node"
            return (f"no NVIDIA GPU on {where}: no NVIDIA GPU on the PCI bus and no NVIDIA driver loaded "
                    f"({DRIVER_VERSION_FILE} is absent); {EXAMPLE_HINT}")
    return ""


def run(facts: NodeFacts, rules: Iterable[Rule] | None = None, mode: str = "live") -> Report:
    t0 = time.perf_counter()
    # a node's facts judge node rules only: API-side verdicts (scope "api") are the agent's to make
    chosen = [r for r in (rules if rules is not None else all_rules()) if r.scope == "node"]
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    errors: list[str] = []
    for r in chosen:
        missing = []
        for need in r.needs:
            try:
                facts.get(need)
            except FactUnavailable as exc:
                missing.append(f"{need}: {exc}")
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
        except FactUnavailable as exc:
            skipped.append(Skipped(r.code, str(exc)))
        except Exception as exc:  # one broken rule must not hide the others
            errors.append(f"rule {r.code} failed: {type(exc).__name__}: {exc}")
    rules_run = len(chosen) - len(skipped)
    _name_plugin_pod(facts, findings)
    report = Report(
        node=node_identity(facts),
        mode=mode,
        findings=findings,
        gaps=facts.gaps(),
        skipped=skipped,
        errors=facts.errors + _load_errors() + errors,
        rules_run=rules_run,
        not_checked=not_checked(facts, len(chosen), rules_run, findings),
        duration_s=time.perf_counter() - t0,
        generated_at=format_rfc3339(time.time()),
        tool_version=__version__,
    )
    return report
