"""Durations as operators type them, for every command, config file and flag.

One grammar everywhere, so `check --log-window 1d`, `fleet --since 1d`, the agent's
`interval: 90s` and the controller's `resync: 500ms` are read alike: a number of seconds
(`90`, `1.5`) or numbers with units, alone or in sequence (`500ms`, `90s`, `15m`, `2h`, `1d`,
`1w`, `1h30m`). Pure function of its input; a `DurationError` (a ValueError) says what was wrong.
"""

from __future__ import annotations

import math
import re

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}

_PART = re.compile(r"([0-9]*\.?[0-9]+)(ms|s|m|h|d|w)")
_NUMBER = re.compile(r"[0-9]*\.?[0-9]+")
EXAMPLES = "e.g. 30, 30s, 500ms, 5m, 1h30m, 1d"


class DurationError(ValueError):
    """Not a duration this grammar accepts."""


def parse_duration(value: object, *, positive: bool = False) -> float:
    """Seconds of `value`: a finite, non-negative number (positive if asked) or DurationError."""
    if isinstance(value, bool):
        raise DurationError(f"not a duration: {value!r} ({EXAMPLES})")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_text(value)
    else:
        raise DurationError(f"not a duration: {value!r} ({EXAMPLES})")
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        need = "positive" if positive else "non-negative"
        raise DurationError(f"not a duration: {value!r} (a finite, {need} time, {EXAMPLES})")
    return seconds


def _parse_text(value: str) -> float:
    text = value.strip().lower().replace(" ", "")
    if _NUMBER.fullmatch(text):
        return float(text)
    total, pos = 0.0, 0
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise DurationError(f"not a duration: {value!r} ({EXAMPLES})")
    return total


def format_duration(seconds: float) -> str:
    """The shortest exact spelling of whole hours, minutes or seconds: 3600 -> '1h', 90 -> '90s'."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:.15g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:.15g}m"
    return f"{seconds:.15g}s"
