"""klog lines, as kubelet and most Kubernetes components write them.

Header (k8s.io/klog/v2 `formatHeader`): `Lmmdd hh:mm:ss.uuuuuu threadid file:line] msg`, where
L is I/W/E/F, threadid is the process id padded to 7 columns, and there is no year and no zone.

Structured lines (`klog.InfoS`) continue with a Go-quoted message and key/value pairs:

    "Issuing a GetPreferredAllocation call for container" containerName="neal-0729-6" podUID="69e0…"
    "SyncLoop ADD" source="api" pods=[mck-test/neal-0729-6-8686d45f8c-rgsr9]
    "Looking for needed resources" needed=12 resourceName="cpu"

Strings are quoted (strconv.Quote), other values are printed bare with %+v (slices as
`[a b]`, structs as `{…}` or `&{…}`), multi-line strings as `key=<` followed by indented lines
(only the first line is on this line). `--logging-format=json` lines are handled by
`parse_json_line`. Nothing here raises on garbage: a line that is not klog gives None, a value
that cannot be read ends the key/value list.
"""

from __future__ import annotations

import datetime as dt
import json
import re

from msgspec import Struct

from gpuwarden.parsers import lazyre, plausible, wallclock

_HEADER = lazyre.compile(
    r"(?P<sev>[IWEF])(?P<mon>[0-9][0-9])(?P<day>[0-9][0-9]) (?P<h>[0-9][0-9]):(?P<m>[0-9][0-9]):(?P<s>[0-9][0-9])(?:\.(?P<frac>[0-9]{1,9}))?"
    r"\s+(?P<tid>[0-9]+) (?P<file>[^\s:\]]+):(?P<line>[0-9]+)\] ?"
)
_KEY = lazyre.compile(r"[A-Za-z_][\w.\-/]*=")
_ESC = lazyre.compile(r'\\(["\\abfnrtv\']|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3})')
_SIMPLE = {'"': '"', "\\": "\\", "'": "'", "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r",
           "t": "\t", "v": "\v"}

SEVERITIES = {"I": "info", "W": "warning", "E": "error", "F": "fatal"}


class KlogLine(Struct, frozen=True):
    """One klog header line (glog format) of the kubelet's log."""
    severity: str  # "I" | "W" | "E" | "F"
    month: int
    day: int
    hour: int
    minute: int
    second: int
    micro: int
    thread: int  # klog prints the process id here
    file: str
    lineno: int
    text: str  # everything after "] "
    #: exact epoch seconds, when the line carried one (JSON format); header times have none
    epoch: float | None = None
    json_fields: dict[str, str] | None = None

    def time(self, ref_epoch: float, tz: dt.tzinfo) -> float | None:
        """Epoch seconds: the year inferred from `ref_epoch`, the wall clock read in `tz`."""
        if self.epoch is not None:
            return self.epoch
        return wallclock.wall_epoch(self.month, self.day, self.hour, self.minute, self.second,
                                    self.micro, ref_epoch, tz)

    @property
    def structured(self) -> bool:
        return self.json_fields is not None or self.text.startswith('"')

    def message(self) -> str:
        """The message alone: the quoted InfoS message, else the whole text."""
        if self.json_fields is not None:
            return self.json_fields.get("msg", self.text)
        if self.text.startswith('"'):
            msg, _ = parse_structured(self.text)
            return msg
        return self.text

    def fields(self) -> dict[str, str]:
        """Key/value pairs of a structured line ({} for printf-style lines)."""
        if self.json_fields is not None:
            return dict(self.json_fields)
        if self.text.startswith('"'):
            return parse_structured(self.text)[1]
        return {}


def parse_line(line: str) -> KlogLine | None:
    """A klog line (header at the start), or None."""
    m = _HEADER.match(line)
    if not m:
        return parse_json_line(line) if line.startswith("{") else None
    mon, day = int(m.group("mon")), int(m.group("day"))
    h, mi, s = int(m.group("h")), int(m.group("m")), int(m.group("s"))
    if not (1 <= mon <= 12 and 1 <= day <= 31 and h < 24 and mi < 60 and s < 61):
        return None
    return KlogLine(m.group("sev"), mon, day, h, mi, s, wallclock.frac_to_micro(m.group("frac")),
                    int(m.group("tid")), m.group("file"), int(m.group("line")),
                    line[m.end():].rstrip("\r\n"))


def unquote_go(body: str) -> str:
    """The inside of a Go-quoted string (without its quotes) with escapes decoded."""
    if "\\" not in body:
        return body

    def repl(m: re.Match[str]) -> str:
        e = m.group(1)
        if e in _SIMPLE:
            return _SIMPLE[e]
        try:
            if e[0] in "xuU":
                return chr(int(e[1:], 16))
            return chr(int(e, 8))
        except ValueError:
            return m.group(0)

    return _ESC.sub(repl, body)


def _quoted(text: str, i: int) -> tuple[str, int] | None:
    """Read a Go-quoted string starting at text[i] == '"'; (value, index after it) or None."""
    j = i + 1
    n = len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return unquote_go(text[i + 1:j]), j + 1
        j += 1
    return None  # unterminated: a truncated line


def _balanced(text: str, i: int, open_c: str, close_c: str) -> tuple[str, int] | None:
    depth = 0
    j = i
    n = len(text)
    in_str = False
    while j < n:
        c = text[j]
        if in_str:
            if c == "\\":
                j += 2
                continue
            if c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == open_c:
            depth += 1
        elif c == close_c:
            depth -= 1
            if depth == 0:
                return text[i:j + 1], j + 1
        j += 1
    return None


def parse_structured(text: str) -> tuple[str, dict[str, str]]:
    """('message', {key: value}) of an InfoS/ErrorS line body; values as text, unquoted."""
    if not text.startswith('"'):
        return text, {}
    q = _quoted(text, 0)
    if q is None:
        return text, {}
    msg, i = q
    out: dict[str, str] = {}
    n = len(text)
    while i < n:
        while i < n and text[i] == " ":
            i += 1
        m = _KEY.match(text, i)
        if not m:
            break
        key = m.group()[:-1]
        i = m.end()
        if i >= n:
            out[key] = ""
            break
        c = text[i]
        if c == '"':
            q = _quoted(text, i)
            if q is None:
                out[key] = text[i + 1:]  # truncated value: keep what is there
                break
            out[key], i = q
        elif c == "[":
            b = _balanced(text, i, "[", "]")
            if b is None:
                out[key] = text[i:]
                break
            out[key], i = b
        elif c == "{" or (c == "&" and text.startswith("&{", i)):
            b = _balanced(text, i + (1 if c == "&" else 0), "{", "}")
            if b is None:
                out[key] = text[i:]
                break
            out[key], i = (("&" if c == "&" else "") + b[0]), b[1]
        elif c == "<" and text[i:].rstrip() == "<":
            out[key] = "<multiline>"  # the value continues on the following lines
            break
        else:
            j = text.find(" ", i)
            j = n if j < 0 else j
            out[key] = text[i:j]
            i = j
    return msg, out


def split_list(value: str) -> list[str]:
    """`[a b c]` (a %+v slice, e.g. KObjSlice) -> ['a', 'b', 'c']."""
    v = value.strip()
    if v.startswith("[") and v.endswith("]"):
        v = v[1:-1]
    return [x for x in v.replace(",", " ").split() if x]


def parse_json_line(line: str) -> KlogLine | None:
    """A `--logging-format=json` line: {"ts":1722343143.753,"caller":"file.go:956","msg":…,"v":4,…}."""
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or "msg" not in obj or "ts" not in obj:
        return None
    ts = obj.get("ts")
    if not isinstance(ts, (int, float)):
        return None
    # ts is epoch seconds (float) in component-base's JSON logger; milliseconds in some forks
    epoch = float(ts) / 1000.0 if ts > 1e11 else float(ts)
    try:
        t = dt.datetime.fromtimestamp(epoch, dt.timezone.utc)
    except (ValueError, OverflowError, OSError):
        return None
    caller = str(obj.get("caller", ""))
    file, _, lineno = caller.rpartition(":")
    sev = "E" if "err" in obj and obj.get("v") is None else "I"
    fields = {str(k): (v if isinstance(v, str) else json.dumps(v)) for k, v in obj.items()}
    return KlogLine(sev, t.month, t.day, t.hour, t.minute, t.second, t.microsecond, 0,
                    file or caller, int(lineno) if plausible.decimal(lineno) else 0, str(obj.get("msg", "")),
                    epoch=epoch, json_fields=fields)
