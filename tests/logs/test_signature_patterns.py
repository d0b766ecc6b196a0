"""The shipped signature table compiles each regex on first use (logs/signatures.LazyPattern): every
pattern still compiles, and a lazy pattern matches exactly as the compiled one on the examples' logs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuwarden import datafiles
from gpuwarden.logs import signatures

EXAMPLES = Path(signatures.__file__).resolve().parents[1] / "examples"


def test_every_shipped_pattern_compiles_and_compares_equal_to_its_compiled_form() -> None:
    shipped = signatures.all_signatures()
    eager = signatures.load(datafiles.read_text("log_signatures.yaml"))
    assert shipped.keys() >= eager.keys()
    for sid, s in eager.items():
        lazy = shipped[sid].regex
        if s.regex is None:
            assert lazy is None
            continue
        assert isinstance(lazy, signatures.LazyPattern)
        assert lazy.compiled().pattern == s.regex.pattern and lazy.groupindex == s.regex.groupindex
        assert lazy == s.regex and shipped[sid] == s and hash(lazy) == hash(signatures.LazyPattern(s.regex.pattern))


def test_lazy_patterns_match_as_compiled_ones_on_the_examples_logs() -> None:
    eager = signatures.load(datafiles.read_text("log_signatures.yaml"))
    lazy = signatures.load(datafiles.read_text("log_signatures.yaml"), lazy=True)
    lines = [ln for f in EXAMPLES.rglob("*.log") for ln in f.read_text(errors="replace").splitlines()]
    lines += [ln for f in EXAMPLES.rglob("kmsg.txt") for ln in f.read_text(errors="replace").splitlines()]
    compared = 0
    for sid, s in eager.items():
        anchor = s.anchor.decode()
        for ln in (x for x in lines if anchor in x):
            assert lazy[sid].match(ln) == s.match(ln), (sid, ln)
            compared += 1
    assert compared > 20  # the examples exercise the table, not an empty loop


def test_a_bad_regex_raises_at_once_when_eager_and_at_first_use_when_lazy() -> None:
    raw = {"id": "x.bad", "anchor": "boom", "logs": ["kubelet"], "regex": "boom(("}
    with pytest.raises(ValueError, match="bad regex"):
        signatures.from_mapping(raw)
    s = signatures.from_mapping(raw, lazy=True)
    with pytest.raises(re.error):
        s.match("boom here")


def test_a_pattern_not_searched_is_not_compiled() -> None:
    p = signatures.LazyPattern(r"never(?P<x>\d+)")
    assert p._compiled is None
    assert p.search("never42").group("x") == "42" and p._compiled is not None
