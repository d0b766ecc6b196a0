"""Log timestamps to epoch seconds: the year and zone that log lines leave out.

klog (`I0730 20:39:03.753013`) and BSD syslog (`Jul 30 20:39:03`) print local wall-clock time
with neither year nor zone. The year is inferred from a reference time (the bundle's capture
time, or now): a date later than the reference belongs to the year before, which handles a log
that runs across New Year (Dec 31 lines read on Jan 1). The zone is whatever the node used; the
caller passes it (see `gpuwarden.facts.logs`), UTC when unknown.
"""

from __future__ import annotations

import datetime as dt
import re

from gpuwarden.parsers import lazyre

MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)}

#: a line dated up to this much after the reference is clock skew, not last year
FUTURE_SLACK = dt.timedelta(days=2)

_RFC3339 = lazyre.compile(
    r"([0-9]{4})-([0-9][0-9])-([0-9][0-9])[T ]([0-9][0-9]):([0-9][0-9]):([0-9][0-9])(?:[.,]([0-9]{1,9}))?\s*(Z|z|[+-][0-9][0-9]:?[0-9][0-9])?"
)


def infer_year(month: int, day: int, ref: dt.datetime) -> int:
    """The year of a `month day` seen in a log read at `ref` (a local, zone-aware time)."""
    year = ref.year
    try:
        cand = dt.datetime(year, month, day, tzinfo=ref.tzinfo)
    except ValueError:  # Feb 29 in a non-leap reference year: the latest leap year before it
        for back in range(1, 8):
            if _valid(year - back, month, day):
                return year - back
        return year
    if cand > ref + FUTURE_SLACK:
        return year - 1
    return year


def _valid(year: int, month: int, day: int) -> bool:
    try:
        dt.date(year, month, day)
    except ValueError:
        return False
    return True


def local_epoch(year: int, month: int, day: int, hour: int, minute: int, second: int,
                micro: int, tz: dt.tzinfo) -> float | None:
    """Epoch seconds of a wall-clock time in `tz`; None when the fields are not a real time."""
    try:
        return dt.datetime(year, month, day, hour, minute, second, micro, tzinfo=tz).timestamp()
    except (ValueError, OverflowError):
        return None


def wall_epoch(month: int, day: int, hour: int, minute: int, second: int, micro: int,
               ref_epoch: float, tz: dt.tzinfo) -> float | None:
    """A year-less wall-clock time to epoch seconds, the year inferred from `ref_epoch`."""
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    try:
        ref = dt.datetime.fromtimestamp(ref_epoch, tz)
    except (ValueError, OverflowError, OSError):
        return None
    return local_epoch(infer_year(month, day, ref), month, day, hour, minute, second, micro, tz)


def frac_to_micro(frac: str | None) -> int:
    """'753013' -> 753013, '7' -> 700000, '123456789' -> 123456 (nanoseconds truncated)."""
    if not frac:
        return 0
    return int((frac + "000000")[:6])


def rfc3339_epoch(text: str, default_tz: dt.tzinfo = dt.timezone.utc) -> float | None:
    """'2025-08-05T08:40:16.021509123+08:00' (nanoseconds allowed) to epoch seconds."""
    m = _RFC3339.match(text.strip())
    if not m:
        return None
    y, mo, d, h, mi, s = (int(m.group(i)) for i in range(1, 7))
    micro = frac_to_micro(m.group(7))
    zone = m.group(8)
    if zone is None:
        return local_epoch(y, mo, d, h, mi, s, micro, default_tz)
    if zone in ("Z", "z"):
        offset = 0
    else:
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)
    try:
        # calendar.timegm's seconds (exact: whole seconds), with the range check timegm leaves out (it
        # accepts day 31 of any month); `calendar` would import `locale` in every check
        base = dt.datetime(y, mo, d, h, mi, s, tzinfo=dt.timezone.utc).timestamp()
    except (ValueError, OverflowError):
        return None
    return base - offset + micro / 1e6


def format_rfc3339(t: float, digits: int = 0) -> str:
    """Epoch seconds as the UTC RFC 3339 text the Kubernetes API writes: 0 digits for a Time
    ('2026-11-24T13:05:00Z'), 3 for a log line, 6 for a MicroTime (Lease renewTime)."""
    stamp = dt.datetime.fromtimestamp(t, dt.timezone.utc)
    if digits <= 0:
        return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%f")[: 20 + min(digits, 6)] + "Z"


def zone(name_or_offset: str | int | float | None) -> dt.tzinfo:
    """A tzinfo from an IANA name ('Asia/Shanghai'), '+08:00', or seconds east of UTC; UTC otherwise."""
    if name_or_offset is None:
        return dt.timezone.utc
    if isinstance(name_or_offset, (int, float)):
        try:
            return dt.timezone(dt.timedelta(seconds=int(name_or_offset)))
        except ValueError:
            return dt.timezone.utc
    text = name_or_offset.strip()
    m = re.fullmatch(r"(?:UTC|GMT)?([+-])([0-9][0-9]):?([0-9][0-9])", text)
    if m:
        sign = -1 if m.group(1) == "-" else 1
        return dt.timezone(sign * dt.timedelta(hours=int(m.group(2)), minutes=int(m.group(3))))
    if text in ("UTC", "Etc/UTC", "GMT", "Z", ""):
        return dt.timezone.utc
    try:
        from zoneinfo import ZoneInfo

        return ZoneInfo(text)
    except Exception:  # unknown name, no tz database: UTC, and the caller notes it
        return dt.timezone.utc
