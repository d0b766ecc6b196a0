"""Strings from a node, made safe to print on a terminal: one mechanism for every text output.

A claim name, a pod name, a log line or an Event message is whatever the node's files (or its
agent) say. Printed raw, an ESC or a C1 CSI in one would drive the operator's terminal (clear the
screen, retitle the window, recolour or overwrite the finding above), a newline would forge a line
of the report, and a bidi override would reorder what is read. Every text renderer passes what it
prints through `tree` (a whole report or view, once, before it adds its own colours) or `safe`
(one line); such characters come out as visible escapes (`\\x1b`, `\\u202e`), everything else
(tabs, CJK, accents) as it was. JSON output needs none of this: the encoder escapes them itself.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from msgspec import Struct

#: C0 controls but tab, DEL, C1 controls (0x9b is CSI on an 8-bit terminal), the Unicode line and
#: paragraph separators, and the bidi marks, embeddings, overrides and isolates
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_UNSAFE_KEEP_NL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    c = m[0]
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def safe(text: str, newlines: bool = False) -> str:
    """`text` with every terminal control shown as an escape; `newlines`: keep line breaks (a
    multi-line text of our own, such as a rule's fix, with node names filled in)."""
    return (_UNSAFE_KEEP_NL if newlines else _UNSAFE).sub(_escape, text)


def tree(value: Any, multiline: Iterable[str] = ()) -> Any:
    """A copy of `value` (a Struct such as a Report, or dicts and lists of a view) with every string
    in it, keys too, made `safe`; fields named in `multiline` keep their line breaks. Other values
    (numbers, enums) are kept as they are."""
    keep = frozenset(multiline)

    def walk(v: Any, nl: bool = False) -> Any:
        if type(v) is str:
            return safe(v, nl)
        if isinstance(v, Struct):
            return type(v)(**{f: walk(getattr(v, f), f in keep) for f in v.__struct_fields__})
        if isinstance(v, dict):
            return {walk(k): walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, tuple):
            items = [walk(x) for x in v]
            return type(v)(*items) if hasattr(v, "_fields") else tuple(items)
        return v

    return walk(value)
