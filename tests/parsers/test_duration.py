"""The one duration grammar every command, config file and flag reads."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from gpuwarden.parsers.duration import DurationError, format_duration, parse_duration
from gpuwarden.parsers.wallclock import format_rfc3339, rfc3339_epoch


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90.0), (90, 90.0), (1.5, 1.5), ("1.5", 1.5), ("500ms", 0.5), ("90s", 90.0),
    ("15m", 900.0), ("2h", 7200.0), ("1d", 86400.0), ("1w", 604800.0), ("1h30m", 5400.0),
    (" 5M ", 300.0), ("1h 30m", 5400.0), ("0", 0.0), (".5s", 0.5),
])
def test_accepts(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", [
    "", "s", "-5s", "5x", "5 s x", "1h-30m", "nan", "inf", True, None, [], float("nan"),
    float("inf"), -1, "1e3s", "m5",
])
def test_refuses(bad: object) -> None:
    with pytest.raises(DurationError):
        parse_duration(bad)


def test_positive_refuses_zero() -> None:
    with pytest.raises(DurationError, match="positive"):
        parse_duration("0s", positive=True)
    assert parse_duration("0s") == 0.0


@given(st.integers(min_value=0, max_value=10**7))
def test_format_round_trips(n: int) -> None:
    assert parse_duration(format_duration(n)) == n


@given(st.text(max_size=20))
def test_garbage_is_a_duration_error_or_a_number(text: str) -> None:
    try:
        v = parse_duration(text)
    except DurationError:
        return
    assert v >= 0


@pytest.mark.parametrize(("digits", "text"), [
    (0, "2026-11-24T13:05:00Z"), (3, "2026-11-24T13:05:00.250Z"), (6, "2026-11-24T13:05:00.250000Z"),
])
def test_rfc3339(digits: int, text: str) -> None:
    t = 1795525500.25
    assert format_rfc3339(t, digits) == text
    assert rfc3339_epoch(text) == pytest.approx(t if digits else 1795525500.0)


def _rfc3339_by_timegm(y: int, mo: int, d: int, h: int, mi: int, s: int, micro: int, offset: int) -> float | None:
    """rfc3339_epoch as written before (calendar.timegm, then a range check): the reference."""
    import calendar
    import datetime as dt

    try:
        base = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
        dt.datetime(y, mo, d, h, mi, s)
    except (ValueError, OverflowError):
        return None
    return base - offset + micro / 1e6


@given(st.integers(0, 9999), st.integers(0, 19), st.integers(0, 39), st.integers(0, 29), st.integers(0, 69),
       st.integers(0, 69), st.sampled_from(["", ".5", ".021509123", ",25"]),
       st.sampled_from(["Z", "z", "+08:00", "-0530", "+00:00", "-23:59"]))
def test_rfc3339_epoch_counts_the_seconds_calendar_timegm_counts(y, mo, d, h, mi, s, frac, zone) -> None:
    """Whole seconds from datetime, not calendar (whose import loads locale in every check): the same
    number, also for days and times out of range (None)."""
    text = f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{frac}{zone}"
    micro = int((frac[1:] + "000000")[:6]) if frac else 0
    sign = -1 if zone[0] == "-" else 1
    offset = 0 if zone in ("Z", "z") else sign * (int(zone[1:3]) * 3600 + int(zone[-2:]) * 60)
    assert rfc3339_epoch(text) == _rfc3339_by_timegm(y, mo, d, h, mi, s, micro, offset)
