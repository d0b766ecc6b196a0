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


def from_mapping(raw: dict[str, Any]) -> Signature:
    """One table entry -> Signature (ValueError on a bad one)."""
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
        pattern = re.compile(regex, re.ASCII) if regex else None
    except re.error as exc:
        raise ValueError(f"log signature {sid}: bad regex: {exc}") from exc
    return Signature(
        id=sid, anchor=anchor.encode("ascii"), regex=pattern, logs=frozenset(logs),
        phase=str(raw.get("phase", "main")), keep=int(raw.get("keep", 200)),
        about=str(raw.get("about", "")), source=str(raw.get("source", "")),
    )


def load(text: str) -> dict[str, Signature]:
    doc = datafiles.parse(text, SCHEMA, "log signatures")
    return datafiles.by_id(doc.get("signatures") or [], from_mapping, "log signatures")


@functools.lru_cache(maxsize=1)
def _shipped() -> dict[str, Signature]:
    text = datafiles.read_text("log_signatures.yaml")
    return load(text)


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
