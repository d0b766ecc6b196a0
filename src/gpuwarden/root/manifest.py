"""A bundle's manifest (`meta.json`): read once, every entry typed and checked on its own.

A manifest is written by whoever sent the bundle. Each entry of its tables is converted to the type
`collect` writes (msgspec checks the shape and the bounds); one that is not becomes an "invalid"
answer for its path, never a fabricated fact and never a lower layer's answer, and a problem that
says where and why. `archive.open_bundle` refuses a bundle with any problem (a usage error): an
invalid entry must not quietly make a fact unavailable and let the report read as healthy (issue 44).
"""

from __future__ import annotations

import json
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from gpuwarden.parsers.plausible import MAX_MAJOR, MAX_MINOR
from gpuwarden.root.base import DirFd, Missing, StatInfo, norm, read_member

#: a bundle's manifest: a big node's is a few MB
MAX_META_BYTES = 64 * 1024 * 1024
#: the kinds a manifest may record for a path that could not be read
MISSING_KINDS = frozenset({"missing", "denied", "error", "not-captured"})
#: a stat record's times must be a date a node can have (1970 .. 2200); anything else is garbage
MAX_STAT_TIME = 7.3e9
#: problems kept (and said) per manifest: a hostile one may have millions
MAX_PROBLEMS = 100

_Time = Annotated[float, Meta(ge=0, lt=MAX_STAT_TIME)]
#: a name in a directory: not empty, ".", "..", and without "/" or NUL
_Name = Annotated[str, Meta(pattern=r"^(?!\.\.?$)[^/\x00]+$")]


class StatRecord(Struct):
    """One `stat` entry as collect writes it; keys it does not know (a newer collector's) are ignored."""

    kind: Literal["chr", "blk", "dir", "file", "link", "other"]
    major: Annotated[int, Meta(ge=0, le=MAX_MAJOR)] | None = None  # dev_t: 12 bits of major, 20 of minor
    minor: Annotated[int, Meta(ge=0, le=MAX_MINOR)] | None = None
    mode: Annotated[int, Meta(ge=0, lt=1 << 16)] = 0
    ctime: _Time = 0.0
    mtime: _Time = 0.0
    size: Annotated[int, Meta(ge=0, lt=1 << 62)] = 0


_LINK = Annotated[str, Meta(pattern=r"^[^\x00]*$")]
_LISTING = list[_Name]
_MISSING = Annotated[tuple[str, ...], Meta(min_length=1, max_length=2)]
_REMOVE = list[Annotated[str, Meta(pattern=r"^[^\x00]+$")]]


def _why(exc: msgspec.ValidationError) -> str:
    """msgspec's message, with `$` (the entry) left out: 'Expected `int` >= 0 - at `.major`'."""
    return str(exc).replace("`$", "`").replace(" - at ``", "")


class _Invalid(ValueError):
    """An entry of the right shape that no node can have."""


def _stat(p: str, raw: object) -> StatInfo:
    rec = msgspec.convert(raw, StatRecord)
    if rec.kind in ("chr", "blk") and (rec.major is None or rec.minor is None):
        raise _Invalid("a device without major and minor numbers")
    return StatInfo(p, rec.kind, rec.major, rec.minor, rec.mode, rec.ctime, rec.mtime, rec.size)


def _missing(p: str, raw: object) -> Missing:
    rec = msgspec.convert(raw, _MISSING)
    if rec[0] not in MISSING_KINDS:
        raise _Invalid(f"kind {rec[0]!r} is not one of {', '.join(sorted(MISSING_KINDS))}")
    return Missing(p, rec[0], rec[1] if len(rec) > 1 else "")


#: table name -> (the converter of one entry, what an invalid entry answers)
_TABLES = {
    "stat": (_stat, "bad stat record in meta.json"),
    "readlink": (lambda p, raw: msgspec.convert(raw, _LINK), "bad readlink record in meta.json"),
    "listdir": (lambda p, raw: msgspec.convert(raw, _LISTING), "invalid entry in meta.json"),
    "missing": (_missing, "invalid entry in meta.json"),
}


def read_meta(base: DirFd) -> tuple[dict, str]:
    """(meta.json as a JSON object, "") or ({}, why it is not one): a regular file directly in the bundle."""
    try:
        doc = json.loads(read_member(base, "meta.json", MAX_META_BYTES))
    except FileNotFoundError:
        return {}, "no meta.json (not a gpuwarden bundle)"
    except OSError as exc:
        return {}, f"meta.json is unreadable ({exc.strerror or exc})"
    except (ValueError, RecursionError) as exc:
        return {}, f"meta.json is unreadable ({exc})"
    return (doc, "") if isinstance(doc, dict) else ({}, "meta.json is not a JSON object")


class Manifest:
    """The typed tables of one meta.json, by normalised node path (a key can name nothing above the root).

    `stat`: StatInfo, `readlink`: the target, `listdir`: names, `missing`: the recorded Missing; an
    invalid entry is a Missing of kind "invalid" in its table. `problems`: (where in meta.json, why).
    """

    __slots__ = ("stats", "links", "listed", "missing", "removed", "problems", "dropped")

    def __init__(self, meta: dict) -> None:
        self.problems: list[tuple[str, str]] = []
        self.dropped = 0  # problems beyond MAX_PROBLEMS, counted
        tables = {name: self._table(meta, name, convert, invalid) for name, (convert, invalid) in _TABLES.items()}
        self.stats: dict[str, StatInfo | Missing] = tables["stat"]
        self.links: dict[str, str | Missing] = tables["readlink"]
        self.listed: dict[str, list[str] | Missing] = tables["listdir"]
        self.missing: dict[str, Missing] = tables["missing"]
        self.removed: tuple[str, ...] = ()
        if "remove" in meta:
            try:
                self.removed = tuple(norm(x) for x in msgspec.convert(meta["remove"], _REMOVE))
            except msgspec.ValidationError as exc:
                self._problem("meta.json remove", f"not a list of node paths ({_why(exc)})")

    def _problem(self, where: str, why: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append((where, why))
        else:
            self.dropped += 1

    def _table(self, meta: dict, name: str, convert, invalid: str) -> dict:
        raw = meta.get(name, {})
        out: dict = {}
        if not isinstance(raw, dict):
            self._problem(f"meta.json {name}", f"not an object ({type(raw).__name__})")
            return out
        for k, v in raw.items():
            p = norm(k.replace("\0", ""))
            try:
                if "\0" in k:
                    raise _Invalid("a path with a NUL byte")
                out[p] = convert(p, v)
            except (msgspec.ValidationError, _Invalid) as exc:
                why = _why(exc) if isinstance(exc, msgspec.ValidationError) else str(exc)
                self._problem(f"meta.json {name}[{k[:200]!r}]", f"invalid entry: {why}")
                out[p] = Missing(p, "invalid", f"{invalid}: {why}" if name == "stat" else invalid)
        return out

    def said(self) -> str:
        """The problems in one line (the first few), for a refusal."""
        shown = [f"{where.removeprefix('meta.json ')}: {why}" for where, why in self.problems[:3]]
        more = len(self.problems) + self.dropped - len(shown)
        return "; ".join(shown) + (f" (+{more} more)" if more > 0 else "")
