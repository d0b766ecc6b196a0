"""systemd journal entries, from `journalctl -o export` and `journalctl -o json`.

Export format (systemd's JOURNAL_EXPORT_FORMATS): one field per line, `KEY=value\\n`; a field
whose value is binary or holds a newline is written `KEY\\n` + its size as a little-endian
64-bit integer + the raw bytes + `\\n`; a blank line ends an entry. Field names are
upper-case letters, digits and underscores.

JSON format: one object per line; a value is a string, an array of byte values (binary
data), null (over the size limit) or an array of those (a field present several times).
`__REALTIME_TIMESTAMP` is microseconds since the epoch, as a string.

Both readers stream (export from arbitrary byte chunks, JSON line by line) and skip what they
cannot read instead of raising.
"""

from __future__ import annotations

import json
import struct
from typing import Iterable, Iterator

from msgspec import Struct, field

from gpuwarden.parsers import lazyre, plausible

_NAME = lazyre.compile(rb"[A-Z0-9_]+\Z")
#: a binary field larger than this is taken as corruption, not data
MAX_FIELD = 64 << 20
_COMPACT = 1 << 20


class JournalEntry(Struct, frozen=True):
    """One journal entry: every field as text (first value when repeated), binary ones also raw."""

    fields: dict[str, str]
    binary: dict[str, bytes] = field(default_factory=dict)

    def get(self, key: str, default: str = "") -> str:
        return self.fields.get(key, default)

    @property
    def message(self) -> str:
        return self.fields.get("MESSAGE", "")

    @property
    def realtime(self) -> float | None:
        """Epoch seconds of `__REALTIME_TIMESTAMP` (µs); None when absent or garbage."""
        v = self.fields.get("__REALTIME_TIMESTAMP", "")
        return int(v) / 1e6 if plausible.decimal(v) else None

    @property
    def pid(self) -> int | None:
        v = self.fields.get("_PID") or self.fields.get("SYSLOG_PID", "")
        return int(v) if plausible.decimal(v) else None

    @property
    def unit(self) -> str:
        return self.fields.get("_SYSTEMD_UNIT", "")

    @property
    def identifier(self) -> str:
        return self.fields.get("SYSLOG_IDENTIFIER", "") or self.fields.get("_COMM", "")

    @property
    def priority(self) -> int | None:
        v = self.fields.get("PRIORITY", "")
        return int(v) if plausible.decimal(v) else None


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


class _Buffer:
    """Bytes pulled from an iterator of chunks, consumed from the front."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.it = iter(chunks)
        self.buf = bytearray()
        self.pos = 0
        self.eof = False

    def fill(self) -> bool:
        if self.eof:
            return False
        for chunk in self.it:
            if chunk:
                if self.pos > _COMPACT:
                    del self.buf[:self.pos]
                    self.pos = 0
                self.buf += chunk
                return True
        self.eof = True
        return False

    def line(self) -> bytes | None:
        """The next line without its newline; None at the end."""
        while True:
            nl = self.buf.find(b"\n", self.pos)
            if nl >= 0:
                out = bytes(self.buf[self.pos:nl])
                self.pos = nl + 1
                return out
            if not self.fill():
                if self.pos < len(self.buf):
                    out = bytes(self.buf[self.pos:])
                    self.pos = len(self.buf)
                    return out
                return None

    def take(self, n: int) -> bytes | None:
        while len(self.buf) - self.pos < n:
            if not self.fill():
                return None
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out

    def peek(self) -> int | None:
        while self.pos >= len(self.buf):
            if not self.fill():
                return None
        return self.buf[self.pos]


def iter_export(chunks: Iterable[bytes]) -> Iterator[JournalEntry]:
    """Entries of `journalctl -o export` output given as byte chunks (lines or blocks)."""
    buf = _Buffer(chunks)
    fields: dict[str, str] = {}
    binary: dict[str, bytes] = {}
    skipping = False  # after corruption: drop lines until the next blank one
    while True:
        line = buf.line()
        if line is None:
            break
        if not line:
            if fields and not skipping:
                yield JournalEntry(fields, binary)
            fields, binary, skipping = {}, {}, False
            continue
        if skipping:
            continue
        eq = line.find(b"=")
        if eq > 0 and _NAME.match(line[:eq]):
            fields.setdefault(_text(line[:eq]), _text(line[eq + 1:]))
            continue
        if _NAME.match(line):
            raw = buf.take(8)
            size = struct.unpack("<Q", raw)[0] if raw is not None and len(raw) == 8 else None
            if size is None or size > MAX_FIELD:
                skipping = True
                continue
            data = buf.take(size)
            if data is None:
                break  # truncated at the end
            if buf.peek() == 0x0A:
                buf.pos += 1
            else:
                skipping = True
                continue
            key = _text(line)
            binary.setdefault(key, data)
            fields.setdefault(key, _text(data))
            continue
        skipping = True  # neither KEY=value nor KEY: garbage inside an entry
    if fields and not skipping:
        yield JournalEntry(fields, binary)


def _json_value(v: object) -> tuple[str, bytes | None] | None:
    if isinstance(v, str):
        return v, None
    if isinstance(v, list) and v and all(isinstance(x, int) and 0 <= x < 256 for x in v):
        raw = bytes(v)
        return _text(raw), raw
    if isinstance(v, list) and v:  # repeated field: the first value
        return _json_value(v[0])
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v), None
    return None


def parse_json(line: str | bytes) -> JournalEntry | None:
    """One line of `journalctl -o json`; None when it is not a JSON object."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict):
        return None
    fields: dict[str, str] = {}
    binary: dict[str, bytes] = {}
    for k, v in obj.items():
        got = _json_value(v)
        if got is None:
            continue
        fields[str(k)] = got[0]
        if got[1] is not None:
            binary[str(k)] = got[1]
    return JournalEntry(fields, binary)


def iter_json(lines: Iterable[str | bytes]) -> Iterator[JournalEntry]:
    """Entries of `journalctl -o json` output, skipping lines that are not JSON objects."""
    for line in lines:
        if not line or not line.strip():
            continue
        e = parse_json(line)
        if e is not None:
            yield e
