"""The log signature table: `data/log_signatures.yaml`, plus signatures registered in code.

Adding a signature is a data change: a new entry in the YAML file (or `register()` from a
module that needs a computed one). The table is loaded once; a malformed shipped table is a
bug and raises at load, so the conformance test catches it.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Iterable

from gpuwarden import datafiles
from gpuwarden.logs.scan import Signature

SCHEMA = "gpuwarden.log-signatures/v1"
LOGS = ("kubelet", "containerd", "kernel", "pod")

_extra: dict[str, Signature] = {}


#: every signature's regex: ASCII-only classes (a digit class matches 0-9, not any script's digits: issue 30)
FLAGS = re.ASCII


class LazyPattern:
    """A regular expression compiled when first searched: a scan evaluates a signature's regex only on
    lines that hold its anchor, so most of the table's ~36 patterns are never needed in a check
    (compiling them all took ~6-17 ms of each process's start, docs/performance.md §9)."""

    __slots__ = ("pattern", "_compiled")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._compiled: re.Pattern[str] | None = None

    def compiled(self) -> re.Pattern[str]:
        if self._compiled is None:
            self._compiled = re.compile(self.pattern, FLAGS)
        return self._compiled

    def search(self, text: str) -> re.Match[str] | None:
        return self.compiled().search(text)

    @property
    def groupindex(self) -> Any:
        return self.compiled().groupindex

    @property
    def flags(self) -> int:
        return FLAGS

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyPattern):
            return self.pattern == other.pattern
        return isinstance(other, re.Pattern) and other.flags == FLAGS and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)

    def __repr__(self) -> str:
        return f"LazyPattern({self.pattern!r})"


def from_mapping(raw: dict[str, Any], lazy: bool = False) -> Signature:
    """One table entry -> Signature (ValueError on a bad one). `lazy`: the regex is compiled on first
    use (the shipped table, whose every pattern a test compiles); otherwise at once, so that a bad
    one raises here."""
    sid = str(raw.get("id", ""))
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", sid):
        raise ValueError(f"log signature id {sid!r}: lower-case dotted name expected")
    anchor = raw.get("anchor")
    if not isinstance(anchor, str) or not anchor:
        raise ValueError(f"log signature {sid}: anchor missing")
    logs = raw.get("logs") or []
    if isinstance(logs, str):
        logs = [logs]
    bad = [x for x in logs if x not in LOGS]
    if bad:
        raise ValueError(f"log signature {sid}: unknown logs {bad}; known: {LOGS}")
    regex = raw.get("regex")
    try:
        pattern = (LazyPattern(regex) if lazy else re.compile(regex, FLAGS)) if regex else None
    except re.error as exc:
        raise ValueError(f"log signature {sid}: bad regex: {exc}") from exc
    return Signature(
        id=sid, anchor=anchor.encode("ascii"), regex=pattern, logs=frozenset(logs),
        phase=str(raw.get("phase", "main")), keep=int(raw.get("keep", 200)),
        about=str(raw.get("about", "")), source=str(raw.get("source", "")),
        flood_class=_flood_class(sid, raw.get("flood_class"), pattern),
    )


def _flood_class(sid: str, raw: Any, pattern: Any) -> tuple[str, ...]:
    """The `flood_class` groups of an entry: names of its regex's named groups."""
    if not raw:
        return ()
    names = (raw,) if isinstance(raw, str) else tuple(str(x) for x in raw)
    have = set(re.findall(r"\(\?P<(\w+)>", pattern.pattern)) if pattern is not None else set()  # not compiled here
    bad = [n for n in names if n not in have]
    if bad:
        raise ValueError(f"log signature {sid}: flood_class names groups its regex lacks: {bad}")
    return names


def load(text: str, lazy: bool = False) -> dict[str, Signature]:
    doc = datafiles.parse(text, SCHEMA, "log signatures")
    return datafiles.by_id(doc.get("signatures") or [], functools.partial(from_mapping, lazy=lazy),
                           "log signatures")


@functools.lru_cache(maxsize=1)
def _shipped() -> dict[str, Signature]:
    text = datafiles.read_text("log_signatures.yaml")
    return load(text, lazy=True)


def register(sigs: Iterable[Signature]) -> None:
    """Add signatures from code (e.g. a table another module builds); ids must be new."""
    for s in sigs:
        if s.id in _shipped() or (s.id in _extra and _extra[s.id] != s):
            raise ValueError(f"log signature {s.id} registered twice")
        _extra[s.id] = s


def all_signatures() -> dict[str, Signature]:
    out = dict(_shipped())
    out.update(_extra)
    return out


def for_log(log: str, phase: str = "main") -> list[Signature]:
    """The signatures scanned in one kind of log ("kubelet", …) in one phase."""
    return [s for s in all_signatures().values() if s.applies_to(log) and s.phase == phase]


def get(sig_id: str) -> Signature:
    return all_signatures()[sig_id]
