"""/proc/meminfo: `Key:  value kB` lines, converted to bytes.

The field set changes with the kernel (KReclaimable 4.20, Percpu 4.16,
SecPageTables 6.1, Unaccepted 6.5, Balloon 6.12 …), so nothing here assumes a
field exists: a consumer asks with `get()` and decides what a missing field
means. A file cut short is detected (no final newline, or a final number
without its unit) and its last, possibly partial, line is dropped rather than
read as a smaller number.
"""

from __future__ import annotations

import re

from msgspec import Struct, field

from gpuwarden.parsers import plausible

_LINE = re.compile(r"^\s*([A-Za-z0-9_()]+)\s*:\s*(-?[0-9]+)\s*(\S+)?\s*$")

#: fields printed without a unit: page counts of the default hugepage pool
UNITLESS = frozenset({"HugePages_Total", "HugePages_Free", "HugePages_Rsvd", "HugePages_Surp"})

_UNITS = {"kb": 1024, "mb": 1024 * 1024, "gb": 1024 ** 3, "b": 1}


class MemInfo(Struct, frozen=True):
    """Parsed /proc/meminfo: sizes in bytes, HugePages_* as page counts."""

    values: dict[str, int] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    truncated: bool = False

    def get(self, key: str, default: int | None = None) -> int | None:
        return self.values.get(key, default)

    def kb(self, key: str) -> int | None:
        """The value as the kernel printed it (kB), for quoting in evidence."""
        v = self.values.get(key)
        if v is None:
            return None
        return v if key in UNITLESS else v // 1024

    def quote(self, *keys: str) -> str:
        """`MemTotal 63596320 kB; MemFree 433348 kB` for the keys present, in kernel units."""
        parts = []
        for k in keys:
            v = self.kb(k)
            if v is not None:
                parts.append(f"{k} {v}" if k in UNITLESS else f"{k} {v} kB")
        return "; ".join(parts)

    def __contains__(self, key: object) -> bool:
        return key in self.values


def parse(text: str) -> MemInfo:
    """Parse meminfo text; never raises. Unparsable lines are reported in `problems`."""
    values: dict[str, int] = {}
    problems: list[str] = []
    if not isinstance(text, str):
        return MemInfo({}, ("not text",), False)
    lines = text.splitlines()
    truncated = bool(text) and not text.endswith("\n")
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        last = i == len(lines) - 1
        m = _LINE.match(raw)
        if not m:
            problems.append(f"line {i + 1}: unparsable {raw[:60]!r}")
            continue
        key, num, unit = m.group(1), int(m.group(2)), (m.group(3) or "")
        if num < 0:
            problems.append(f"line {i + 1}: negative value for {key}")
            continue
        if unit:
            mult = _UNITS.get(unit.lower())
            if mult is None:
                problems.append(f"line {i + 1}: unknown unit {unit!r} for {key}")
                continue
        elif key in UNITLESS:
            mult = 1
        else:
            # a sized field without its unit: a line cut in the middle of the number, or a format we do not know
            if last and truncated:
                problems.append(f"line {i + 1}: {key} cut short (no unit); dropped")
                continue
            mult = 1024  # meminfo prints kB for every sized field
            problems.append(f"line {i + 1}: {key} has no unit; read as kB")
        if last and truncated and not unit:
            problems.append(f"line {i + 1}: {key} may be cut short; dropped")
            continue
        if key in values:
            problems.append(f"line {i + 1}: {key} repeated; first value kept")
            continue
        values[key] = num * mult
    if truncated:
        problems.append("no final newline: the file was cut short")
    why = impossible(values)
    if why:  # damage, not a node: nothing of it may be read as a fact
        return MemInfo({}, (f"impossible value: {why}; the file is unreadable", *problems), truncated)
    return MemInfo(values, tuple(problems), truncated)


#: parts of MemTotal: none can exceed it (VmallocTotal, Committed_AS, SwapTotal legitimately can)
_PARTS_OF_TOTAL = ("MemFree", "MemAvailable", "Buffers", "Cached", "Active", "Inactive", "AnonPages", "Mapped",
                   "Shmem", "Slab", "SReclaimable", "SUnreclaim", "KernelStack", "PageTables", "Unevictable")


def impossible(values: dict[str, int]) -> str:
    """Why these meminfo values cannot come from a kernel ("" when they can)."""
    for k, v in values.items():
        if not (plausible.count(v) if k in UNITLESS else plausible.size(v)):
            return f"{k} = {str(v)[:24]}{'…' if len(str(v)) > 24 else ''} is beyond any node"
    total = values.get("MemTotal")
    if total is not None:
        if total == 0:
            return "MemTotal is 0"
        for k in _PARTS_OF_TOTAL:
            if values.get(k, 0) > total:
                return f"{k} ({values[k] >> 10} kB) exceeds MemTotal ({total >> 10} kB)"
    return ""
