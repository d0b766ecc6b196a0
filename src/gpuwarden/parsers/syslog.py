"""Syslog line prefixes: what rsyslog, `/var/log/messages` and `journalctl -o short*` put
in front of a program's own line.

    Jul 30 20:39:03 ai-app-8-1-msxf kubelet[45878]: I0730 20:39:03.753013 ...   (BSD / short)
    Jul 30 20:39:03.753013 host kubelet[45878]: ...                               (short-precise)
    2025-07-30T20:39:03.753013+08:00 host kubelet[45878]: ...                     (RFC 3339 / short-iso)

The BSD form has neither year nor zone; `time()` infers them (see `wallclock`).
"""

from __future__ import annotations

import datetime as dt

from msgspec import Struct

from gpuwarden.parsers import lazyre, wallclock

_BSD = lazyre.compile(
    r"(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) {1,2}(?P<day>[0-9]{1,2}) "
    r"(?P<h>[0-9][0-9]):(?P<m>[0-9][0-9]):(?P<s>[0-9][0-9])(?:\.(?P<frac>[0-9]{1,9}))? "
    r"(?P<host>\S+) (?P<ident>[^\s\[\]:]+)(?:\[(?P<pid>[0-9]+)\])?: ?"
)
_ISO = lazyre.compile(
    r"(?P<iso>[0-9]{4}-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9](?:[.,][0-9]{1,9})?(?:Z|[+-][0-9][0-9]:?[0-9][0-9])?) "
    r"(?P<host>\S+) (?P<ident>[^\s\[\]:]+)(?:\[(?P<pid>[0-9]+)\])?: ?"
)


class SyslogLine(Struct, frozen=True):
    """One syslog line of a kernel or daemon log file."""
    host: str
    ident: str  # the program ("kubelet", "kernel", "containerd")
    pid: int | None
    rest: str  # the program's own text
    #: BSD form: month, day, h, m, s, micro (no year, local zone)
    wall: tuple[int, int, int, int, int, int] | None = None
    #: RFC 3339 form: exact epoch seconds
    epoch: float | None = None

    def time(self, ref_epoch: float, tz: dt.tzinfo) -> float | None:
        """Epoch seconds; the BSD form's year comes from `ref_epoch`, its zone is `tz`."""
        if self.epoch is not None:
            return self.epoch
        if self.wall is None:
            return None
        return wallclock.wall_epoch(*self.wall, ref_epoch=ref_epoch, tz=tz)


def parse(line: str) -> SyslogLine | None:
    """The prefix of one syslog line, or None when the line has none."""
    m = _BSD.match(line)
    if m:
        wall = (wallclock.MONTHS[m.group("mon")], int(m.group("day")), int(m.group("h")),
                int(m.group("m")), int(m.group("s")), wallclock.frac_to_micro(m.group("frac")))
        pid = m.group("pid")
        return SyslogLine(m.group("host"), m.group("ident"), int(pid) if pid else None,
                          line[m.end():].rstrip("\r\n"), wall=wall)
    m = _ISO.match(line)
    if m:
        pid = m.group("pid")
        return SyslogLine(m.group("host"), m.group("ident"), int(pid) if pid else None,
                          line[m.end():].rstrip("\r\n"), epoch=wallclock.rfc3339_epoch(m.group("iso")))
    return None
