"""Line decoders for the log scanner: one raw line of a given format -> `Decoded`.

Each factory closes over what turning a wall-clock time into epoch seconds needs: the
reference time (for the year klog and BSD syslog leave out) and the node's time zone.
Formats:
- "klog": klog text, bare or behind a syslog prefix (`journalctl -u kubelet` short output,
  /var/log/messages), or kubelet's `--logging-format=json`;
- "journal-json": `journalctl -o json`, whose MESSAGE is itself decoded as klog;
- "cri": container log files (/var/log/pods), the message decoded as klog when it is one;
- "kernel": /dev/kmsg records and dmesg/syslog kernel text.
"""

from __future__ import annotations

import datetime as dt
import re

from gpuwarden.logs.scan import Decoded, Decoder
from gpuwarden.parsers import cri_log, journal_export, klog, kmsg, lazyre, syslog, wallclock

FORMATS = ("klog", "journal-json", "cri", "kernel")

#: containerd / logrus text: time="2025-08-05T08:40:16.431856123+08:00" level=error msg="…"
_LOGRUS = lazyre.compile(r'time="(?P<ts>[^"]+)" level=(?P<lvl>\w+) msg="(?P<msg>(?:[^"\\]|\\.)*)"?', re.ASCII)
_LOGRUS_SEV = {"error": "E", "fatal": "F", "panic": "F", "warning": "W", "warn": "W"}


def _logrus(text: str) -> Decoded | None:
    m = _LOGRUS.match(text)
    if not m:
        return None
    return Decoded(klog.unquote_go(m.group("msg")) + text[m.end():], wallclock.rfc3339_epoch(m.group("ts")),
                   None, _LOGRUS_SEV.get(m.group("lvl"), "I"))


def _from_klog(k: klog.KlogLine, ref: float, tz: dt.tzinfo) -> Decoded:
    return Decoded(k.text, k.time(ref, tz), k.thread or None, k.severity, k.fields())


def _klog_or_text(text: str, ref: float, tz: dt.tzinfo, time: float | None, pid: int | None,
                  severity: str = "") -> Decoded:
    """A message that may itself be a klog line: keep the outer time and pid, take its fields."""
    k = klog.parse_line(text)
    if k is None:
        lr = _logrus(text) if text.startswith("time=") else None
        if lr is not None:
            return Decoded(lr.message, time if time is not None else lr.time, pid, lr.severity or severity)
        return Decoded(text, time, pid, severity)
    return Decoded(k.text, time if time is not None else k.time(ref, tz),
                   pid if pid is not None else (k.thread or None), k.severity or severity, k.fields())


def klog_decoder(ref: float, tz: dt.tzinfo) -> Decoder:
    def decode(line: str) -> Decoded | None:
        line = line.rstrip("\r\n")
        k = klog.parse_line(line)
        if k is not None:
            return _from_klog(k, ref, tz)
        if line.startswith("time="):
            return _logrus(line)
        s = syslog.parse(line)
        if s is None:
            return None
        inner = klog.parse_line(s.rest)
        if inner is not None:
            d = _from_klog(inner, ref, tz)
            return Decoded(d.message, d.time if d.time is not None else s.time(ref, tz),
                           s.pid or d.pid, d.severity, d.fields)
        lr = _logrus(s.rest)
        if lr is not None:
            return Decoded(lr.message, lr.time if lr.time is not None else s.time(ref, tz), s.pid, lr.severity)
        return Decoded(s.rest, s.time(ref, tz), s.pid)

    return decode


def journal_json_decoder(ref: float, tz: dt.tzinfo) -> Decoder:
    def decode(line: str) -> Decoded | None:
        e = journal_export.parse_json(line)
        if e is None:
            return None
        sev = ""
        if e.priority is not None:
            sev = "E" if e.priority <= 3 else "W" if e.priority == 4 else "I"
        return _klog_or_text(e.message, ref, tz, e.realtime, e.pid, sev)

    return decode


def cri_decoder(ref: float, tz: dt.tzinfo) -> Decoder:
    def decode(line: str) -> Decoded | None:
        c = cri_log.parse_line(line)
        if c is None:
            return None
        return _klog_or_text(c.message, ref, tz, c.time, None)

    return decode


def kernel_decoder(ref: float, tz: dt.tzinfo, boot_time: float | None = None) -> Decoder:
    def decode(line: str) -> Decoded | None:
        r = kmsg.parse_line(line, boot_time=boot_time, ref_epoch=ref, tz=tz)
        if r is None:
            return None
        return Decoded(r.message, r.wall, None, r.level_name)

    return decode


def decoder(fmt: str, ref: float, tz: dt.tzinfo, boot_time: float | None = None) -> Decoder:
    """The decoder of a format name (see FORMATS)."""
    if fmt == "journal-json":
        return journal_json_decoder(ref, tz)
    if fmt == "cri":
        return cri_decoder(ref, tz)
    if fmt == "kernel":
        return kernel_decoder(ref, tz, boot_time)
    return klog_decoder(ref, tz)
