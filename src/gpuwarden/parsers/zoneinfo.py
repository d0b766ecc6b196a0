"""/proc/zoneinfo: per-zone free pages and the min/low/high watermarks.

    Node 0, zone   Normal
      pages free     665646
            boost    0
            min      9149
            low      11436
            high     13723
            …
            managed  917504

The kernel wakes kswapd when a zone's free pages fall below `low`, lets it
reclaim until `high`, and makes allocations reclaim directly (and finally OOM)
below `min`. Summed over zones with managed pages they say how close the node
is to the point where reclaim stalls every allocation. Values are pages; the
per-cpu `high:` lines of the pagesets (with a colon) are not watermarks.
"""

from __future__ import annotations

import re

from msgspec import Struct, field

from gpuwarden.parsers import plausible

_HEADER = re.compile(r"^Node\s+([0-9]+),\s*zone\s+(\S+)")
_FIELD = re.compile(r"^\s+(min|low|high|present|managed|boost)\s+([0-9]+)\s*$")
#: the matched name -> the same name as a constant: getattr/setattr with a fresh string from a match
#: leaves that string in CPython's type attribute cache (up to 4,096 entries, keyed by the string's
#: address), so an agent parsing zoneinfo every check grew by ~1 string a check until the cache filled
_ATTRS = {n: n for n in ("min", "low", "high", "present", "managed")}
_FREE = re.compile(r"^\s+pages free\s+([0-9]+)\s*$")


class Zone(Struct):
    """One memory zone of /proc/zoneinfo with its watermarks."""
    node: int
    name: str
    free: int | None = None
    min: int | None = None
    low: int | None = None
    high: int | None = None
    managed: int | None = None
    present: int | None = None


class ZoneInfo(Struct, frozen=True):
    """/proc/zoneinfo."""
    zones: tuple[Zone, ...] = ()
    problems: tuple[str, ...] = field(default_factory=tuple)

    def _active(self) -> list[Zone]:
        # zones without managed pages (an empty Movable zone) still print a token min of 32
        return [z for z in self.zones if z.managed is None or z.managed > 0]

    def _sum(self, attr: str) -> int | None:
        vals = [getattr(z, attr) for z in self._active()]
        vals = [v for v in vals if v is not None]
        return sum(vals) if vals else None

    @property
    def min_pages(self) -> int | None:
        return self._sum("min")

    @property
    def low_pages(self) -> int | None:
        return self._sum("low")

    @property
    def high_pages(self) -> int | None:
        return self._sum("high")

    @property
    def free_pages(self) -> int | None:
        return self._sum("free")

    @property
    def managed_pages(self) -> int | None:
        return self._sum("managed")


def parse(text: str) -> ZoneInfo:
    """Parse zoneinfo text; never raises. Zones cut off before their watermarks keep None there."""
    if not isinstance(text, str):
        return ZoneInfo((), ("not text",))
    zones: list[Zone] = []
    problems: list[str] = []
    cur: Zone | None = None
    lines = text.splitlines()
    truncated = bool(text) and not text.endswith("\n")
    for i, raw in enumerate(lines):
        if truncated and i == len(lines) - 1:
            problems.append(f"line {i + 1}: cut short; dropped")
            break
        m = _HEADER.match(raw)
        if m:
            cur = Zone(int(m.group(1)), m.group(2))
            zones.append(cur)
            continue
        if cur is None:
            if raw.strip():
                problems.append(f"line {i + 1}: outside any zone {raw[:40]!r}")
            continue
        m = _FREE.match(raw)
        if m:
            cur.free = int(m.group(1))
            continue
        m = _FIELD.match(raw)
        attr = _ATTRS.get(m.group(1)) if m else None  # "boost": not kept
        if attr is not None and getattr(cur, attr) is None:
            setattr(cur, attr, int(m.group(2)))
    if not zones and text.strip():
        problems.append("no 'Node N, zone X' header found")
    for z in zones:
        why = impossible(z)
        if why:  # an overflowed or hand-made watermark must never stand for the node's
            return ZoneInfo((), (f"impossible value: node {z.node} zone {z.name}: {why}; the file is unreadable",
                                 *problems))
    return ZoneInfo(tuple(zones), tuple(problems))


def impossible(z: Zone) -> str:
    """Why a zone's numbers cannot come from a kernel ("" when they can).

    Watermarks are ordered (min <= low <= high) and set aside from the zone's managed pages, which
    are part of its present pages; free pages are present pages. An empty zone (managed 0) still
    prints token watermarks, so only a zone with managed pages is held to them.
    """
    vals = {k: getattr(z, k) for k in ("free", "min", "low", "high", "managed", "present")}
    for k, v in vals.items():
        if v is not None and not plausible.count(v):
            return f"{k} {str(v)[:24]}{'…' if len(str(v)) > 24 else ''} pages is beyond any node"
    pairs = [("min", "low"), ("low", "high"), ("managed", "present"), ("free", "present")]
    if vals["managed"]:
        pairs.append(("min", "managed"))
    for a, b in pairs:
        if vals[a] is not None and vals[b] is not None and vals[a] > vals[b] and (b != "present" or vals[b] > 0):
            return f"{a} ({vals[a]} pages) above {b} ({vals[b]} pages)"
    return ""
