"""Object times are read and written by parsers.wallclock alone: these are the edge cases checked
before the controller's own RFC 3339 parser was removed (model.parse_time now wraps rfc3339_epoch)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwarden.controller.model import parse_time
from gpuwarden.parsers.wallclock import format_rfc3339

T = 1795341600.0  # 2026-11-22T10:00:00Z


@pytest.mark.parametrize("text,epoch", [
    ("2026-11-22T10:00:00Z", T),  # a Time
    ("2026-11-22T10:00:00.123456Z", T + 0.123456),  # a MicroTime
    ("2026-11-22T10:00:00.5Z", T + 0.5),
    ("2026-11-22T10:00:00+02:00", T - 7200),
    ("2026-11-22T10:00:00-05:30", T + 19800),
    (" 2026-11-22T10:00:00Z ", T),
    ("9999-12-31T23:59:59Z", 253402300799.0),
])
def test_times_the_api_writes(text, epoch):
    assert parse_time(text) == pytest.approx(epoch, abs=1e-6)


def test_nanoseconds_are_truncated_to_microseconds():
    assert parse_time("2026-11-22T10:00:00.123456789Z") == pytest.approx(T + 0.123456, abs=1e-7)


@pytest.mark.parametrize("value", [None, "", "x", 7, ["2026-11-22T10:00:00Z"], "2026-02-30T10:00:00Z",
                                   "2026-11-22T25:00:00Z", "2026-11-22T10:00:60Z"])
def test_not_a_time(value):
    assert parse_time(value) is None


@given(st.integers(min_value=0, max_value=4102444800), st.integers(min_value=0, max_value=999_999))
def test_round_trip(seconds, micros):
    t = seconds + micros / 1e6
    assert parse_time(format_rfc3339(t)) == seconds  # a Time keeps whole seconds
    assert parse_time(format_rfc3339(t, 6)) == pytest.approx(t, abs=1e-6)  # a MicroTime keeps µs


def test_the_three_widths_are_the_api_s():
    assert format_rfc3339(T) == "2026-11-22T10:00:00Z"
    assert format_rfc3339(T + 0.5, 6) == "2026-11-22T10:00:00.500000Z"
    assert format_rfc3339(T + 0.1239, 3) == "2026-11-22T10:00:00.123Z"
