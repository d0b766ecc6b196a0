"""YAML from anyone (a config file, a kubeconfig, a node's kubelet config or CDI spec), loaded safely.

PyYAML's safe loader builds no objects, but it is not bounded: nine levels of ten aliases expand to
10^9 nodes for whoever walks the result (1.48 GB for one agent config), a scanner is quadratic in
flow nesting, and a bad scalar raises what YAMLError does not cover (`2020-13-45` and `!!int abc`
a ValueError, `!!bool maybe` a KeyError, `!!timestamp x` an AttributeError, a 5,000-digit integer
a ValueError). `load` composes the node graph first, refuses it when it is recursive or its
expanded size (aliases counted as often as they are used) passes `max_nodes`, and turns every
failure into one `YamlError` line.
"""

from __future__ import annotations

from typing import Any

#: an option file or a kubeconfig holds hundreds of nodes, a node's CDI spec a few thousand
MAX_NODES = 100_000
#: no config nests deeper than this; PyYAML's scanner is quadratic in flow depth (5,000 "[" take 4 s)
MAX_DEPTH = 64


class YamlError(ValueError):
    """Not YAML, or YAML no config is: one line, the reason."""


def flow_depth(raw: bytes | str) -> int:
    """The deepest [ / { nesting in raw (quotes ignored: an over-estimate only refuses sooner)."""
    data = raw.encode("utf-8", "replace") if isinstance(raw, str) else raw
    depth = deepest = 0
    for b in data.replace(b"\x00", b""):
        if b in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif b in (0x5D, 0x7D) and depth:
            depth -= 1
    return deepest


def _expanded_size(root: Any, limit: int) -> int:
    """Nodes of the document with every alias expanded (a DAG counted by memo), up to limit + 1.

    YamlError when an alias refers to a node that contains it (a recursive document)."""
    import yaml

    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node, yaml)
            size[key] = min(limit + 1, 1 + sum(size[id(c)] for c in children))
            continue
        if key in size:
            continue
        if key in on_path:
            raise YamlError("an alias refers to a node that contains it (a recursive document)")
        on_path.add(key)
        stack.append((node, True))
        for c in _children(node, yaml):
            if id(c) in on_path:
                raise YamlError("an alias refers to a node that contains it (a recursive document)")
            if id(c) not in size:
                stack.append((c, False))
    return size[id(root)]


def _children(node: Any, yaml: Any) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    return []


def _loader() -> Any:
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_all(raw: bytes | str, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> list[Any]:
    """Every document of raw (bytes: YAML's own encoding detection), or YamlError."""
    import yaml

    if flow_depth(raw) > max_depth:
        raise YamlError(f"nested deeper than {max_depth} levels")
    loader = _loader()(raw)
    docs = []
    total = 0
    try:
        while loader.check_node():
            node = loader.get_node()
            total += _expanded_size(node, max_nodes)
            if total > max_nodes:
                raise YamlError(f"more than {max_nodes:,} nodes once its aliases are expanded")
            docs.append(loader.construct_document(node))
    except YamlError:
        raise
    except yaml.YAMLError as exc:
        raise YamlError(" ".join(str(exc).split())[:200]) from None
    except RecursionError:
        raise YamlError("nested too deeply") from None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, IndexError, UnicodeError) as exc:
        # a scalar its tag cannot build: !!int abc, 2020-13-45, !!bool maybe, !!timestamp x, 5,000 digits
        raise YamlError(f"a value YAML cannot read ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})") \
            from None
    finally:
        loader.dispose()
    return docs


def load(raw: bytes | str, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> Any:
    """The single document of raw (None when empty), or YamlError.

    A document that `plain` reads for certain (JSON, or the plain block mappings kubelet configs are
    made of) is not handed to PyYAML, whose import alone was ~19% of a healthy example check."""
    doc = plain(raw, max_nodes, max_depth)
    if doc is not None:
        return doc
    docs = load_all(raw, max_nodes, max_depth)
    if len(docs) > 1:
        raise YamlError("more than one document")
    return docs[0] if docs else None


# -- the documents read without PyYAML -----------------------------------------------------------------

class _Unsure(Exception):
    """Outside what `plain` decides for certain: PyYAML decides."""


#: YAML 1.1's booleans and nulls, as PyYAML's resolver reads plain scalars
_BOOL = {**dict.fromkeys(("yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), True),
         **dict.fromkeys(("no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), False)}
_NULL = ("~", "null", "Null", "NULL")
#: what YAML 1.1's implicit ints, floats and timestamps are made of (0x1F, 0b10, 017, 1_000, 1:30, .inf,
#: .NaN, 2001-12-14t21:59:43.10-05:00), with room to spare: a plain scalar that begins with a digit, a
#: sign or a dot and holds only these may be a number or a time; one with any other character is text
_NUMERIC = frozenset("0123456789+-_.: abcdefinotxzABCDEFINOTXZ")
#: what no plain scalar of the subset begins with (YAML's indicators: flow, tags, anchors, aliases, block
#: scalars, directives, reserved; `<<` merge and `=` value keys)
_NOT_FIRST = frozenset("?:,[]{}#&*!|>%@`=<\"'")
#: the longest key decided here (PyYAML and libyaml give up on a simple key after 1,024 characters)
MAX_KEY = 256
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-/")


def plain(raw: bytes | str, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> Any:
    """The document of raw when it is JSON (an object or an array) or a plain block mapping, read
    without PyYAML; None when not certain (then PyYAML decides, through `load`).

    Block subset: printable ASCII lines (no tab, no CR); keys are plain names (letters, digits,
    `_.-/`, none of YAML's booleans or nulls); values are nested block mappings, block sequences of
    scalars (indented or not), `{}`, `[]`, quoted strings without escapes, or plain one-line scalars;
    comments and blank lines. A plain scalar is typed as PyYAML's YAML 1.1 resolver types it (true/yes/on,
    null/~, decimal ints and floats, dotted quads as text); any form that may be another number or a
    time (0x1F, 017, 1_000, 1:30, 1.5e3, .inf, 2001-12-14) is not decided here. Anchors, aliases, tags,
    flow collections, multi-line scalars and several documents are not either. JSON: as `json` reads
    it, less what YAML 1.1 reads otherwise (escapes, a float without a dot or with an unsigned exponent,
    NaN). Within max_nodes (counted as `load_all` counts) and max_depth (also `flow_depth`), so `load`'s
    bounds hold.
    tests/test_safeyaml.py holds this to PyYAML on fixed and Hypothesis-drawn documents."""
    if isinstance(raw, bytes):
        if not raw.isascii():
            return None
        raw = raw.decode("ascii")
    if not raw.isascii() or not raw.replace("\n", "").isprintable():
        return None  # also tabs, CR, NUL, DEL, a BOM: PyYAML's reader and scanner have rules for them
    try:
        doc = _json(raw) if raw.lstrip(" \n")[:1] in ("{", "[") else _block(raw, max_nodes, max_depth)
    except (_Unsure, ValueError, RecursionError):
        return None
    # load_all's bounds, last: a document left to PyYAML is not scanned twice (flow_depth is a Python loop)
    if _nodes(doc, max_nodes) > max_nodes or (("[" in raw or "{" in raw) and flow_depth(raw) > max_depth):
        return None
    return doc


def _nodes(doc: Any, limit: int) -> int:
    """Nodes as `_expanded_size` counts them (keys included), up to limit + 1."""
    n, stack = 0, [doc]
    while stack and n <= limit:
        x = stack.pop()
        n += 1
        if isinstance(x, dict):
            n += len(x)
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return n


def _json_float(text: str) -> float:
    # YAML 1.1 reads 1e5 and 1.5e5 as text, 1.5 and 1.5e+5 as floats
    mantissa, e, exponent = text.lower().partition("e")
    if "." not in mantissa or (e and exponent[:1] not in ("+", "-")):
        raise _Unsure
    return float(text)


def _json_constant(text: str) -> Any:
    raise _Unsure  # NaN, Infinity: not JSON, and text to YAML


def _json(text: str) -> Any:
    import json

    if "\\" in text:
        raise _Unsure  # escapes: YAML's double-quoted ones differ (\/, surrogate pairs, \x, \e...)
    # without escapes, every other piece between quotes is a string: a key must be short and its ":"
    # follow at once (YAML's simple keys are one line, at most 1,024 characters)
    pieces = text.split('"')
    for string, after in zip(pieces[1::2], pieces[2::2]):
        if after.lstrip(" \n")[:1] == ":" and (after[0] != ":" or len(string) > MAX_KEY):
            raise _Unsure
    doc = json.loads(text, parse_float=_json_float, parse_constant=_json_constant)
    if not isinstance(doc, (dict, list)):
        raise _Unsure
    return doc


def _block(text: str, max_nodes: int, max_depth: int) -> dict[str, Any]:
    lines: list[tuple[int, str]] = []
    for line in text.split("\n"):
        body = line.lstrip(" ")
        if body and body[0] != "#":
            lines.append((len(line) - len(body), body.rstrip(" ")))
        if len(lines) > max_nodes:
            raise _Unsure
    if not lines or lines[0][0] != 0:
        raise _Unsure  # empty (no document), or a document that begins indented
    doc, i = _mapping(lines, 0, 0, 1, max_depth)
    if i != len(lines):
        raise _Unsure
    return doc


def _entry(body: str) -> bool:
    return body == "-" or body.startswith("- ")


def _mapping(lines: list[tuple[int, str]], i: int, indent: int, depth: int, max_depth: int) -> tuple[dict, int]:
    if depth > max_depth:
        raise _Unsure
    out: dict[str, Any] = {}
    while i < len(lines):
        ind, body = lines[i]
        if ind < indent:
            break
        if ind > indent or _entry(body):
            raise _Unsure  # a continuation line, or a sequence entry where a key belongs
        key, colon, rest = body.partition(":")
        if not colon or (rest and rest[0] != " ") or not key or len(key) > MAX_KEY or not set(key) <= _KEY_CHARS \
                or not (key[0].isalpha() or key[0] == "_") or key in _BOOL or key in _NULL:
            raise _Unsure  # YAML's scanners also end a simple key after 1,024 characters
        rest = rest.lstrip(" ")
        i += 1
        if rest and rest[0] != "#":
            out[key] = _scalar(rest)
            continue
        nxt = lines[i] if i < len(lines) else (-1, "")
        if nxt[0] > indent:
            out[key], i = (_sequence if _entry(nxt[1]) else _mapping)(lines, i, nxt[0], depth + 1, max_depth)
        elif nxt[0] == indent and _entry(nxt[1]):
            out[key], i = _sequence(lines, i, indent, depth + 1, max_depth)  # YAML's indentless sequence
        else:
            out[key] = None
    return out, i


def _sequence(lines: list[tuple[int, str]], i: int, indent: int, depth: int, max_depth: int) -> tuple[list, int]:
    if depth > max_depth:
        raise _Unsure
    out: list[Any] = []
    while i < len(lines) and lines[i][0] == indent and _entry(lines[i][1]):
        item = lines[i][1][1:].lstrip(" ")
        if not item or item[0] == "#":
            raise _Unsure  # an empty entry, or one whose node is on the lines below
        out.append(_scalar(item))
        i += 1
    if i < len(lines) and lines[i][0] > indent:
        raise _Unsure  # a continuation, or a node below an entry
    return out, i


def _scalar(text: str) -> Any:
    """One value on a `key: ` or `- ` line (the line's trailing spaces already cut)."""
    quote = text[0]
    if quote in ("'", '"'):
        end = text.find(quote, 1)
        tail = text[end + 1:]
        if end < 0 or (quote == '"' and "\\" in text[1:end]) or (tail and not tail.startswith(" #")):
            raise _Unsure  # unclosed (multi-line), an escape, or something after the closing quote
        return text[1:end]
    if text in ("{}", "[]"):
        return {} if text == "{}" else []
    cut = text.find(" #")
    if cut >= 0:
        text = text[:cut].rstrip(" ")
    if text[0] in _NOT_FIRST or (text[0] == "-" and (len(text) == 1 or text[1] == " ")) \
            or ": " in text or text[-1] == ":":
        raise _Unsure
    if text in _BOOL:
        return _BOOL[text]
    if text in _NULL:
        return None
    if text[0] in "0123456789+-." and set(text) <= _NUMERIC:
        return _number(text)
    if text[0] == "~":
        raise _Unsure
    return text


def _number(text: str) -> Any:
    """A plain scalar made only of characters numbers and times are made of: the forms decided here."""
    digits = text[1:] if text[0] in "+-" else text
    if digits.isdigit() and (digits == "0" or digits[0] != "0") and len(digits) <= 100:
        return int(text)
    whole, _, frac = digits.partition(".")
    if whole.isdigit() and frac.isdigit() and len(digits) <= 100:
        return float(text)
    parts = text.split(".")
    if len(parts) >= 3 and all(p.isdigit() for p in parts):
        return text  # 10.96.0.10: no YAML 1.1 number or time has two dots and nothing else
    raise _Unsure
