"""Pressure stall information: /proc/pressure/{memory,io,cpu} and cgroup v2 `*.pressure`.

    some avg10=1.85 avg60=2.46 avg300=1.81 total=9965409
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0

`some`: share of wall time in which at least one task stalled on the resource;
`full`: share in which every non-idle task stalled at once (the machine did no
useful work). avg* are percentages over 10/60/300 s, total is cumulative
microseconds. Memory `full` is the thrash signal oomd and systemd-oomd act on.
"""

from __future__ import annotations

from msgspec import Struct

from gpuwarden.parsers import plausible


class PressureLine(Struct, frozen=True):
    """One line (some or full) of a PSI file."""
    avg10: float
    avg60: float
    avg300: float
    total_us: int | None = None

    def __str__(self) -> str:
        tot = f" total={self.total_us}" if self.total_us is not None else ""
        return f"avg10={self.avg10:.2f} avg60={self.avg60:.2f} avg300={self.avg300:.2f}{tot}"


class Pressure(Struct, frozen=True):
    """A PSI file (/proc/pressure/* or a cgroup's *.pressure)."""
    some: PressureLine | None = None
    full: PressureLine | None = None
    problems: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return self.some is None and self.full is None

    def quote(self) -> str:
        parts = []
        if self.some:
            parts.append(f"some {self.some}")
        if self.full:
            parts.append(f"full {self.full}")
        return "; ".join(parts) or "(no data)"


def _line(fields: list[str]) -> PressureLine | None:
    kv = {}
    for f in fields:
        k, sep, v = f.partition("=")
        if sep:
            kv[k] = v
    try:
        avg = [float(kv["avg10"]), float(kv["avg60"]), float(kv["avg300"])]
    except (KeyError, ValueError):
        return None
    if any(a < 0 or a != a for a in avg):  # negative or NaN
        return None
    total = kv.get("total")
    return PressureLine(*avg, total_us=int(total) if total and plausible.decimal(total) else None)


def parse(text: str) -> Pressure:
    """Parse a PSI file; never raises. A cut final line is dropped."""
    if not isinstance(text, str):
        return Pressure(problems=("not text",))
    some = full = None
    problems: list[str] = []
    lines = text.splitlines()
    truncated = bool(text) and not text.endswith("\n")
    for i, raw in enumerate(lines):
        fields = raw.split()
        if not fields:
            continue
        if truncated and i == len(lines) - 1 and not plausible.decimal(raw.rstrip().split("=")[-1]):
            problems.append(f"line {i + 1}: cut short; dropped")
            continue
        kind = fields[0]
        if kind not in ("some", "full"):
            problems.append(f"line {i + 1}: unknown line {raw[:40]!r}")
            continue
        pl = _line(fields[1:])
        if pl is None:
            problems.append(f"line {i + 1}: unparsable {raw[:60]!r}")
            continue
        if kind == "some":
            some = some or pl
        else:
            full = full or pl
    return Pressure(some, full, tuple(problems))
