"""Times, durations and quoted lines as rule summaries and evidence print them (UTC, compact)."""

from __future__ import annotations

import datetime as dt


def ts(t: float | None) -> str:
    """Epoch seconds -> '2025-07-30 12:39:03Z'."""
    if t is None:
        return "an unknown time"
    try:
        return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    except (ValueError, OverflowError, OSError):
        return "an unknown time"


def dur(s: float | None) -> str:
    """Seconds -> '1h23m', '4m05s', '12s'."""
    if s is None:
        return "an unknown time"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{sec:02d}s"
    return f"{sec}s"


def line_with(text: str, needle: str) -> str:
    """The (stripped) line of `text` containing `needle`, or ""; linear, unlike a `[^\\n]*` regex."""
    i = text.find(needle)
    if i < 0:
        return ""
    start = text.rfind("\n", 0, i) + 1
    end = text.find("\n", i)
    return text[start:end if end >= 0 else len(text)].strip()
