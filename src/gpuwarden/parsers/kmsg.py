"""Kernel log records: `/dev/kmsg` and the text forms of `dmesg` and syslog.

/dev/kmsg (Documentation/ABI/testing/dev-kmsg): `pri,seq,usec,flags[,…];message`, followed by
optional dictionary lines that start with a space (` SUBSYSTEM=pci`). pri = facility*8 + level;
usec is microseconds since boot; non-printable bytes in the message are escaped as `\\xNN`.

dmesg text:
    [  123.456789] msg                           plain (seconds since boot)
    <6>[  123.456789] msg                        dmesg -r (raw level)
    kern  :info  : [  123.456789] msg            dmesg -x
    [Tue Jul 29 17:54:57 2025] msg               dmesg -T (local wall clock, with year)
    2025-07-29T17:54:57,681608+08:00 msg         dmesg --time-format iso
    Jul 29 17:54:57 host kernel: [341115.681608] msg     syslog / journalctl -k

A line with none of these is kept as a bare message: the kernel log is read for signatures,
and a signature in an odd format is still worth finding.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Iterable, Iterator

from msgspec import Struct, field

from gpuwarden.parsers import lazyre, syslog, wallclock

LEVELS = ("emerg", "alert", "crit", "err", "warning", "notice", "info", "debug")

_KMSG = lazyre.compile(r"(?P<pri>[0-9]+),(?P<seq>[0-9]+),(?P<usec>[0-9]+),(?P<flags>[^,;]*)(?:,[^;]*)?;")
_MONO = lazyre.compile(r"\[\s*(?P<sec>[0-9]+)\.(?P<frac>[0-9]+)\]\s?")
_RAW_LEVEL = lazyre.compile(r"<(?P<pri>[0-9]+)>")
_DECODED = lazyre.compile(r"(?P<fac>[a-z]+)\s*:(?P<lvl>[a-z]+)\s*: ")
_HUMAN = lazyre.compile(
    r"\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?P<mon>[A-Z][a-z]{2}) {1,2}(?P<day>[0-9]{1,2}) "
    r"(?P<h>[0-9][0-9]):(?P<m>[0-9][0-9]):(?P<s>[0-9][0-9])(?:\.[0-9]+)? (?P<year>[0-9]{4})\]\s?"
)
_ISO = lazyre.compile(r"(?P<iso>[0-9]{4}-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9](?:[.,][0-9]{1,9})?(?:Z|[+-][0-9][0-9]:?[0-9][0-9])?) ")
_HEX = lazyre.compile(r"\\x([0-9a-fA-F]{2})")


class KernelRecord(Struct, frozen=True):
    """One kernel log record (dmesg, /dev/kmsg, journal or syslog)."""
    message: str
    level: int | None = None  # 0 (emerg) … 7 (debug)
    facility: int | None = None
    seq: int | None = None
    monotonic: float | None = None  # seconds since boot
    wall: float | None = None  # epoch seconds, when the line or a boot time gave one
    host: str = ""
    fields: dict[str, str] = field(default_factory=dict)  # /dev/kmsg dictionary lines

    @property
    def level_name(self) -> str:
        return LEVELS[self.level] if self.level is not None and 0 <= self.level < 8 else ""


def _unescape(msg: str) -> str:
    if "\\x" not in msg:
        return msg
    return _HEX.sub(lambda m: chr(int(m.group(1), 16)), msg)


def _mono(m: re.Match[str]) -> float:
    return int(m.group("sec")) + float("0." + m.group("frac"))


def parse_kmsg(line: str, boot_time: float | None = None) -> KernelRecord | None:
    """One /dev/kmsg record line (`6,1234,5678901,-;msg`), or None."""
    m = _KMSG.match(line)
    if not m:
        return None
    pri = int(m.group("pri"))
    mono = int(m.group("usec")) / 1e6
    return KernelRecord(
        _unescape(line[m.end():].rstrip("\r\n")), level=pri & 7, facility=pri >> 3,
        seq=int(m.group("seq")), monotonic=mono,
        wall=boot_time + mono if boot_time is not None else None,
    )


def parse_dmesg(line: str, *, boot_time: float | None = None, ref_epoch: float | None = None,
                tz: dt.tzinfo = dt.timezone.utc) -> KernelRecord | None:
    """One line of dmesg/syslog kernel text; a bare message when no prefix is recognised.

    None only for empty lines.
    """
    text = line.rstrip("\r\n")
    if not text.strip():
        return None
    host = ""
    wall: float | None = None
    level: int | None = None
    facility: int | None = None
    sl = syslog.parse(text)
    if sl is not None:
        host = sl.host
        wall = sl.time(ref_epoch, tz) if ref_epoch is not None else sl.epoch
        text = sl.rest
    m = _RAW_LEVEL.match(text)
    if m:
        pri = int(m.group("pri"))
        level, facility = pri & 7, pri >> 3
        text = text[m.end():]
    m = _DECODED.match(text)
    if m and m.group("lvl") in LEVELS:
        level = LEVELS.index(m.group("lvl"))
        text = text[m.end():]
    mono: float | None = None
    m = _MONO.match(text)
    if m:
        mono = _mono(m)
        text = text[m.end():]
    else:
        m = _HUMAN.match(text)
        if m:
            wall = wallclock.local_epoch(int(m.group("year")), wallclock.MONTHS.get(m.group("mon"), 0),
                                         int(m.group("day")), int(m.group("h")), int(m.group("m")),
                                         int(m.group("s")), 0, tz)
            text = text[m.end():]
        else:
            m = _ISO.match(text)
            if m:
                wall = wallclock.rfc3339_epoch(m.group("iso"), tz)
                text = text[m.end():]
    if wall is None and mono is not None and boot_time is not None:
        wall = boot_time + mono
    return KernelRecord(text, level=level, facility=facility, monotonic=mono, wall=wall, host=host)


def parse_line(line: str, *, boot_time: float | None = None, ref_epoch: float | None = None,
               tz: dt.tzinfo = dt.timezone.utc) -> KernelRecord | None:
    """Either format, /dev/kmsg first (its prefix is unambiguous)."""
    return parse_kmsg(line, boot_time) or parse_dmesg(line, boot_time=boot_time, ref_epoch=ref_epoch, tz=tz)


def iter_records(lines: Iterable[str | bytes], *, boot_time: float | None = None,
                 ref_epoch: float | None = None, tz: dt.tzinfo = dt.timezone.utc) -> Iterator[KernelRecord]:
    """Records of a kernel log in any of the formats above, kmsg dictionary lines attached."""
    pending: KernelRecord | None = None
    for raw in lines:
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if pending is not None and line.startswith(" ") and "=" in line and pending.seq is not None:
            k, _, v = line.strip().partition("=")
            pending.fields[k] = _unescape(v)
            continue
        rec = parse_line(line, boot_time=boot_time, ref_epoch=ref_epoch, tz=tz)
        if rec is None:
            continue
        if pending is not None:
            yield pending
        pending = rec
    if pending is not None:
        yield pending
