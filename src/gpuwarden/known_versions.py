"""Known component versions: which driver, runc, kubelet or plugin release has which problem.

The facts live in `data/known_versions.yaml` (one entry per known problem or feature, with
the catalog's references) so that a new driver release is a data change, not a code change.
This module loads that file once and answers "is this version affected?" with a proper
version comparison: numeric parts compare as numbers (570.158.01 < 570.172.08), a
pre-release sorts before its release (1.0.0-rc92 < 1.0.0), missing parts are zeros (1.1 == 1.1.0).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Iterable, Mapping

from msgspec import Struct, field

from gpuwarden import datafiles

SCHEMA = "gpuwarden.known-versions/v1"

_VERSION = re.compile(r"v?(?P<rel>[0-9]+(?:\.[0-9]+)*)(?:[-~.]?(?P<pre>(?:alpha|beta|rc|pre|dev)[.\w-]*))?(?:\+\S*)?",
                      re.IGNORECASE)


class Version(Struct, frozen=True):
    """A release number with an optional pre-release tag, ordered the semver way."""

    release: tuple[int, ...]
    pre: tuple[tuple[int, int | str], ...] = ()  # () = a final release
    text: str = ""  # not compared: __eq__ and __hash__ below

    def _key(self, width: int) -> tuple:
        rel = self.release + (0,) * (width - len(self.release))
        # a final release sorts after every pre-release of the same number
        return rel, (1,) if not self.pre else (0, self.pre)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        w = max(len(self.release), len(other.release))
        return self._key(w) == other._key(w)

    def _cmp(self, other: "Version") -> tuple[tuple, tuple]:
        w = max(len(self.release), len(other.release))
        return self._key(w), other._key(w)

    # all four written out: Struct defines them in C, so functools.total_ordering would fill none
    def __lt__(self, other: "Version") -> bool:
        a, b = self._cmp(other)
        return a < b

    def __le__(self, other: "Version") -> bool:
        a, b = self._cmp(other)
        return a <= b

    def __gt__(self, other: "Version") -> bool:
        a, b = self._cmp(other)
        return a > b

    def __ge__(self, other: "Version") -> bool:
        a, b = self._cmp(other)
        return a >= b

    def __hash__(self) -> int:
        rel = list(self.release)
        while rel and rel[-1] == 0:
            rel.pop()
        return hash((tuple(rel), self.pre))

    def branch(self, depth: int) -> tuple[int, ...]:
        """The first `depth` numbers: the driver branch (570) or a runc minor line (1, 1)."""
        return (self.release + (0,) * depth)[:depth]

    def __str__(self) -> str:
        return self.text or ".".join(map(str, self.release))


def _pre_parts(pre: str) -> tuple[tuple[int, int | str], ...]:
    out: list[tuple[int, int | str]] = []
    for tok in re.findall(r"[A-Za-z]+|[0-9]+", pre):
        # numbers sort before words, as in semver; each as (kind, value) so they never compare
        out.append((0, int(tok)) if tok.isdigit() else (1, tok.lower()))
    return tuple(out)


def parse_version(text: str | None) -> Version | None:
    """'570.158.01', 'v1.27.5', '1.0.0-rc92', 'runc version 1.1.12' -> Version; None if no number."""
    if not text:
        return None
    m = _VERSION.search(text.strip())
    if not m:
        return None
    rel = tuple(int(x) for x in m.group("rel").split("."))
    pre = _pre_parts(m.group("pre")) if m.group("pre") else ()
    return Version(rel, pre, m.group(0))


_CMP = re.compile(r"\s*(>=|<=|==|!=|>|<|=)?\s*(\S+)\s*")


class VersionRange(Struct, frozen=True):
    """A set of versions: comparators joined by commas (`>=1.1.3, <=1.1.6`) or `a - b` (inclusive)."""

    text: str
    clauses: tuple[tuple[str, Version], ...]

    @classmethod
    def parse(cls, text: str) -> "VersionRange":
        t = str(text).strip()
        clauses: list[tuple[str, Version]] = []
        if " - " in t:
            lo, _, hi = t.partition(" - ")
            a, b = parse_version(lo), parse_version(hi)
            if a is None or b is None:
                raise ValueError(f"bad version range {text!r}")
            clauses = [(">=", a), ("<=", b)]
        else:
            for part in t.split(","):
                if not part.strip():
                    continue
                m = _CMP.fullmatch(part)
                v = parse_version(m.group(2)) if m and _VERSION.fullmatch(m.group(2)) else None
                if m is None or v is None:
                    raise ValueError(f"bad version range {text!r}")
                clauses.append((m.group(1) or "==", v))
        if not clauses:
            raise ValueError(f"empty version range {text!r}")
        return cls(t, tuple(clauses))

    def __contains__(self, v: Version) -> bool:
        for op, ref in self.clauses:
            ok = {
                ">=": v >= ref, "<=": v <= ref, ">": v > ref, "<": v < ref,
                "==": v == ref, "=": v == ref, "!=": v != ref,
            }[op]
            if not ok:
                return False
        return True

    @property
    def lower(self) -> Version | None:
        lows = [v for op, v in self.clauses if op in (">=", ">", "==", "=")]
        return max(lows) if lows else None

    @property
    def upper(self) -> Version | None:
        highs = [v for op, v in self.clauses if op in ("<=", "<", "==", "=")]
        return min(highs) if highs else None

    def __str__(self) -> str:
        return self.text


class AffectedRange(Struct, frozen=True):
    """A version range a known issue affects, with the source's note and date."""
    range: VersionRange
    note: str = ""
    as_of: str = ""


class Match(Struct, frozen=True):
    """How one version stands against one known issue."""

    issue: "KnownIssue"
    version: Version
    #: "affected" | "fixed" | "unaffected" | "unknown" (a gap the sources do not cover)
    status: str
    range: AffectedRange | None = None
    #: the fix to move to from this version (same branch first), if any
    fix: Version | None = None

    @property
    def affected(self) -> bool:
        return self.status == "affected"


class KnownIssue(Struct, frozen=True):
    """A published bug of a component (driver, plugin, runtime) and the versions it affects."""
    id: str
    component: str
    kind: str  # "bug" (affected = has the bug) | "feature" (affected = lacks the feature)
    summary: str
    affected: tuple[AffectedRange, ...]
    fixed_in: tuple[Version, ...] = ()
    unaffected: tuple[Version, ...] = ()
    conditions: Mapping[str, Any] = field(default_factory=dict)
    signatures: tuple[str, ...] = ()
    references: tuple[str, ...] = ()
    as_of: str = ""
    branch_depth: int = 1
    notes: str = ""

    def check(self, version: str | Version | None) -> Match | None:
        """This issue's verdict for a version; None when the version cannot be read."""
        v = version if isinstance(version, Version) else parse_version(version)
        if v is None:
            return None
        fix = self.fix_for(v)
        for r in self.affected:
            if v in r.range:
                return Match(self, v, "affected", r, fix)
        br = v.branch(self.branch_depth)
        for f in self.fixed_in:
            if f.branch(self.branch_depth) == br and v >= f:
                return Match(self, v, "fixed")
        if self.fixed_in and v >= max(self.fixed_in):
            return Match(self, v, "fixed")
        if v in self.unaffected:
            return Match(self, v, "unaffected")
        same_ranges = [r for r in self.affected if (r.range.lower or r.range.upper) is not None
                       and (r.range.lower or r.range.upper).branch(self.branch_depth) == br]
        same_fixes = [f for f in self.fixed_in if f.branch(self.branch_depth) == br]
        lows = [r.range.lower for r in self.affected if r.range.lower is not None]
        if not same_ranges and not same_fixes:
            # a branch the sources do not speak of: older than every known-bad release is clean
            if not lows or v < min(lows):
                return Match(self, v, "unaffected")
            return Match(self, v, "unknown", fix=fix)
        branch_lows = [r.range.lower for r in same_ranges if r.range.lower is not None]
        if branch_lows and v < min(branch_lows):
            return Match(self, v, "unaffected")
        return Match(self, v, "unknown", fix=fix)

    def fix_for(self, v: Version) -> Version | None:
        """The release to upgrade to: the fix on v's branch, else the lowest fix above v."""
        br = v.branch(self.branch_depth)
        same = [f for f in self.fixed_in if f.branch(self.branch_depth) == br and f > v]
        if same:
            return min(same)
        above = [f for f in self.fixed_in if f > v]
        return min(above) if above else None

    def conditions_met(self, context: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        """(unmet, unknown) condition names for what the caller knows about the node."""
        unmet, unknown = [], []
        for k, want in self.conditions.items():
            if k not in context or context[k] is None:
                unknown.append(k)
            elif context[k] != want:
                unmet.append(k)
        return unmet, unknown


def _tuple(x: Any) -> tuple:
    if x is None:
        return ()
    if isinstance(x, (list, tuple)):
        return tuple(x)
    return (x,)


def _versions(xs: Any, where: str) -> tuple[Version, ...]:
    out = []
    for x in _tuple(xs):
        v = parse_version(str(x))
        if v is None:
            raise ValueError(f"{where}: bad version {x!r}")
        out.append(v)
    return tuple(out)


def _entry(raw: Mapping[str, Any]) -> KnownIssue:
    where = f"known_versions.yaml entry {raw.get('id', '?')}"
    for key in ("id", "component", "summary", "affected"):
        if key not in raw:
            raise ValueError(f"{where}: missing {key!r}")
    affected = []
    for a in _tuple(raw["affected"]):
        if isinstance(a, str):
            affected.append(AffectedRange(VersionRange.parse(a)))
        else:
            affected.append(AffectedRange(VersionRange.parse(a["range"]), str(a.get("note", "")),
                                          str(a.get("as_of", ""))))
    return KnownIssue(
        id=str(raw["id"]), component=str(raw["component"]), kind=str(raw.get("kind", "bug")),
        summary=" ".join(str(raw["summary"]).split()), affected=tuple(affected),
        fixed_in=_versions(raw.get("fixed_in"), where), unaffected=_versions(raw.get("unaffected"), where),
        conditions=dict(raw.get("conditions") or {}), signatures=tuple(_tuple(raw.get("signatures"))),
        references=tuple(str(r) for r in _tuple(raw.get("references"))), as_of=str(raw.get("as_of", "")),
        branch_depth=int(raw.get("branch_depth", 1)), notes=" ".join(str(raw.get("notes", "")).split()),
    )


def load(text: str) -> dict[str, KnownIssue]:
    """Parse a known-versions document; raises ValueError on a malformed one (it ships with us)."""
    doc = datafiles.parse(text, SCHEMA, "known versions")
    return datafiles.by_id(doc.get("entries") or [], _entry, "known versions")


@functools.lru_cache(maxsize=1)
def catalog() -> dict[str, KnownIssue]:
    """The shipped knowledge base, loaded once."""
    text = datafiles.read_text("known_versions.yaml")
    return load(text)


def get(issue_id: str) -> KnownIssue:
    return catalog()[issue_id]


def issues(component: str | None = None, signature: str | None = None) -> list[KnownIssue]:
    return [e for e in catalog().values()
            if (component is None or e.component == component)
            and (signature is None or signature in e.signatures)]


def affected_by(component: str, version: str | Version | None,
                context: Mapping[str, Any] | None = None) -> list[Match]:
    """Known issues this version of a component has, with every known condition met."""
    out = []
    for e in issues(component):
        m = e.check(version)
        if m is None or not m.affected:
            continue
        unmet, _ = e.conditions_met(context or {})
        if not unmet:
            out.append(m)
    return out


def references(*issue_ids: str) -> tuple[str, ...]:
    """The references of several entries, in order, without repeats (for a rule's metadata)."""
    seen: dict[str, None] = {}
    for i in issue_ids:
        for r in get(i).references:
            seen.setdefault(r, None)
    return tuple(seen)


def iter_all() -> Iterable[KnownIssue]:
    return catalog().values()
