"""`gpuwarden why SYMPTOM`: run the rules of one triage tree and say what is most likely.

The trees are data (`data/triage.yaml`, the catalog's §7). A symptom names its steps in order,
each a question answered by some rules. The result lists the causes found (confirmed before
at-risk, then in the tree's order, then by severity), the rules that were evaluated and found
nothing (ruled out), and those that could not be evaluated, with why. A report that is no verdict
(no NVIDIA GPU on the node, nothing evaluable) rules nothing out: its answer says "not checked"
first and last, and every rule of the tree is listed as not evaluated.
"""

from __future__ import annotations

import functools
import re
from typing import Any, TextIO

from msgspec import Struct, field

from gpuwarden import datafiles
from gpuwarden.findings import Finding, Report, Status

SCHEMA = "gpuwarden.triage/v1"
RESULT_SCHEMA = "gpuwarden.why/v1"
_CODE = re.compile(r"^GPU-(DEV|K8S|DRV|HW|NODE|DRA)-\d{3}$")


class Step(Struct, frozen=True):
    question: str
    rules: tuple[str, ...]
    hint: str = ""


class Symptom(Struct, frozen=True):
    id: str
    title: str
    steps: tuple[Step, ...]
    aliases: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    source: str = ""

    @property
    def rules(self) -> list[str]:
        out: list[str] = []
        for s in self.steps:
            out += [r for r in s.rules if r not in out]
        return out

    def step_of(self, code: str) -> int:
        for i, s in enumerate(self.steps):
            if code in s.rules:
                return i
        return len(self.steps)


def _words(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def load(text: str) -> dict[str, Symptom]:
    """Parse a triage document; ValueError on a malformed one (it ships with us; tests load it)."""
    doc = datafiles.parse(text, SCHEMA, "triage")
    out: dict[str, Symptom] = {}
    for raw in doc.get("symptoms") or []:
        sid = str(raw.get("id", ""))
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", sid) or sid in out:
            raise ValueError(f"triage: bad or duplicate symptom id {sid!r}")
        steps = []
        for st in raw.get("steps") or []:
            rules = tuple(str(r) for r in st.get("rules") or [])
            bad = [r for r in rules if not _CODE.match(r)]
            if not rules or bad:
                raise ValueError(f"triage {sid}: step {st.get('question')!r} has bad rules {bad or rules}")
            steps.append(Step(str(st.get("question", "")), rules, " ".join(str(st.get("hint", "")).split())))
        if not steps:
            raise ValueError(f"triage {sid}: no steps")
        out[sid] = Symptom(sid, str(raw.get("title", sid)), tuple(steps),
                           tuple(str(a) for a in raw.get("aliases") or []),
                           tuple(str(k).lower() for k in raw.get("keywords") or []), str(raw.get("source", "")))
    return out


@functools.lru_cache(maxsize=1)
def symptoms() -> dict[str, Symptom]:
    return load(datafiles.read_text("triage.yaml"))


def match(text: str) -> tuple[Symptom | None, list[Symptom]]:
    """The symptom meant by `text` (an id or free text), else (None, the candidates)."""
    table = symptoms()
    w = _words(text)
    for s in table.values():
        if w == _words(s.id):
            return s, []
    best: tuple[int, Symptom] | None = None
    for s in table.values():
        for a in s.aliases:
            aw = _words(a)
            if aw and (w == aw or f" {aw} " in f" {w} "):
                if best is None or len(aw) > best[0]:
                    best = (len(aw), s)
    if best is not None:
        return best[1], []
    words = set(w.split())
    cands = [s for s in table.values() if s.keywords and set(s.keywords) <= words]
    if len(cands) == 1:
        return cands[0], []
    if not cands:  # one word the user knows ("nvml", "pending"): the only symptom it names
        cands = [s for s in table.values() if words & (set(s.keywords) | set(_words(s.id).split()))]
        if len(cands) == 1:
            return cands[0], []
    return None, cands or list(table.values())


class Cause(Struct):
    finding: Finding
    step: int
    question: str


class WhyResult(Struct):
    symptom: Symptom
    report: Report
    causes: list[Cause] = field(default_factory=list)
    ruled_out: list[tuple[str, str, str]] = field(default_factory=list)  # (code, title, question)
    not_evaluated: list[tuple[str, str]] = field(default_factory=list)  # (code, reason)
    not_applicable: list[tuple[str, str]] = field(default_factory=list)  # (code, reason): no gap (no DRA here)
    unknown_rules: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RESULT_SCHEMA,
            "symptom": {"id": self.symptom.id, "title": self.symptom.title, "source": self.symptom.source},
            "node": self.report.node,
            "mode": self.report.mode,
            "not_checked": self.report.not_checked or None,
            "causes": [dict(c.finding.to_json(), step=c.step + 1, question=c.question) for c in self.causes],
            "ruled_out": [{"code": c, "title": t, "question": q} for c, t, q in self.ruled_out],
            "not_evaluated": [{"code": c, "reason": r} for c, r in self.not_evaluated],
            "not_applicable": [{"code": c, "reason": r} for c, r in self.not_applicable],
            "unknown_rules": list(self.unknown_rules),
            "unavailable": [{"source": g.source, "reason": g.reason} for g in self.report.gaps],
            "errors": list(self.report.errors),
        }


def evaluate(symptom: Symptom, report: Report, titles: dict[str, str]) -> WhyResult:
    """Order a report of the symptom's rules into causes, ruled-out rules and gaps."""
    res = WhyResult(symptom, report)
    found_codes = {f.code for f in report.findings}
    skipped = {s.code: s.reason for s in report.skipped}
    absent = {s.code: s.reason for s in report.not_applicable}
    errored = {c for c in symptom.rules if any(f"rule {c} failed" in e for e in report.errors)}
    for f in sorted(report.findings, key=lambda f: (f.status != Status.CONFIRMED, symptom.step_of(f.code),
                                                    -int(f.severity), f.code)):
        i = symptom.step_of(f.code)
        res.causes.append(Cause(f, i, symptom.steps[i].question if i < len(symptom.steps) else ""))
    for code in symptom.rules:
        if code not in titles:
            res.unknown_rules.append(code)
        elif code in absent:
            res.not_applicable.append((code, absent[code]))
        elif code in skipped:
            res.not_evaluated.append((code, skipped[code]))
        elif code in errored:
            res.not_evaluated.append((code, "the rule failed (see errors)"))
        elif report.not_checked:  # the rule ran with nothing to look at: it rules nothing out
            res.not_evaluated.append((code, f"not checked: {report.not_checked_brief}"))
        elif code not in found_codes:
            res.ruled_out.append((code, titles[code], symptom.steps[symptom.step_of(code)].question))
    return res


def render_text(res: WhyResult, out: TextIO, verbose: bool = False) -> None:
    from gpuwarden import terminal

    res = terminal.tree(res, multiline=("remedy",))  # the report's node strings, once (as render.text does)
    s = res.symptom
    node = res.report.node
    name = node.get("hostname") or node.get("name") or node.get("source", "")
    out.write(f"gpuwarden why {s.id}: {s.title}\n")
    from gpuwarden.render.wording import origin

    out.write(f"node {name} ({origin(res.report)})\n\n")
    if res.report.not_checked:  # first: nothing below may read as a cause ruled out
        out.write(f"Not checked: {res.report.not_checked}.\n")
        out.write(f"None of the {len(s.rules)} check(s) of this tree is a verdict: nothing is ruled out.\n")
    elif res.causes:
        first = res.causes[0]
        out.write("Most likely cause:\n")
        _cause(out, first, verbose, full=True, node=str(name))
        if len(res.causes) > 1:
            out.write("\nAlso found:\n")
            for c in res.causes[1:]:
                _cause(out, c, verbose, full=verbose, node=str(name))
    else:
        applies = len(s.rules) - len(res.not_applicable)
        out.write(f"No cause found among the {applies} check(s) of this tree"
                  + (f" that apply to this node ({len(res.not_applicable)} do not).\n" if res.not_applicable else ".\n"))
        hints = [st for st in s.steps if st.hint]
        if hints:
            out.write("\nTo look at by hand:\n")
            for st in hints:
                out.write(f"  - {st.question}\n      {st.hint}\n")
    if res.ruled_out:
        out.write("\nRuled out (evaluated, nothing found):\n")
        for code, title, _q in res.ruled_out:
            out.write(f"  - {code:12} {title}\n")
    if res.not_evaluated:
        out.write("\nCould not be evaluated:\n")
        for code, reason in res.not_evaluated:
            out.write(f"  - {code:12} {reason}\n")
    if res.not_applicable:
        out.write("\nNot applicable to this node (no gap):\n")
        for code, reason in res.not_applicable:
            out.write(f"  - {code:12} {reason}\n")
    if res.report.gaps:
        gaps = res.report.gaps if verbose else res.report.gaps[:8]
        out.write("\nUnavailable evidence (a rule above may have missed a cause for lack of it):\n")
        for g in gaps:
            out.write(f"  - {g.source}: {g.reason}\n")
        if len(res.report.gaps) > len(gaps):
            out.write(f"  … and {len(res.report.gaps) - len(gaps)} more (--verbose)\n")
    for e in res.report.errors:
        out.write(f"internal error (result is partial): {e}\n")
    if res.report.not_checked:
        out.write(f"\nNot checked: {res.report.not_checked_brief}.\n")
    elif res.causes:
        out.write(f"\nMore: gpuwarden explain {res.causes[0].finding.code}; gpuwarden check --verbose\n")


def _cause(out: TextIO, c: Cause, verbose: bool, full: bool, node: str = "") -> None:
    f = c.finding
    status = "CONFIRMED" if f.status == Status.CONFIRMED else "AT-RISK"
    out.write(f"  {f.severity.label.upper():8} {status:9} {f.code}  {f.title}\n")
    out.write(f"      {f.summary}\n")
    if c.question:
        out.write(f"      (step {c.step + 1}: {c.question})\n")
    if not full:
        return
    ev = f.evidence if verbose else f.evidence[:4]
    if ev:
        out.write("      evidence:\n")
        for e in ev:
            out.write(f"        - {e.text}  [{e.source}]\n")
        if len(f.evidence) > len(ev):
            out.write(f"        … and {len(f.evidence) - len(ev)} more (--verbose)\n")
    out.write("      fix:\n")
    from gpuwarden.render.wording import fill_names

    for line in fill_names(f.remedy.strip(), f, node).splitlines():
        out.write(f"        {line}\n")
