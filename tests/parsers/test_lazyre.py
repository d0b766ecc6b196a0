"""Patterns compiled on first use (parsers/lazyre.py): the same answers as `re.compile`'s, every lazy
pattern of the package compiles, and importing a module compiles none of its lazy patterns."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.parsers import lazyre

SRC = Path(__file__).resolve().parents[2] / "src"


def _lazy_modules() -> list[str]:
    """Every gpuwarden module that builds a lazy pattern (by its source)."""
    out = []
    for p in sorted((SRC / "gpuwarden").rglob("*.py")):
        if "lazyre.compile(" in p.read_text(encoding="utf-8") and p.name != "lazyre.py":
            out.append(".".join(p.relative_to(SRC).with_suffix("").parts))
    return out


def test_every_lazy_pattern_of_the_package_compiles_as_re_compile_would() -> None:
    mods = _lazy_modules()
    assert "gpuwarden.parsers.kmsg" in mods and "gpuwarden.xid" in mods
    for m in mods:
        importlib.import_module(m)
    assert len(lazyre._ALL) >= 40
    for p in list(lazyre._ALL):
        want = re.compile(*p._source)
        assert (p.pattern, p.flags, p.groups, p.groupindex) == (want.pattern, want.flags, want.groups, want.groupindex)


def test_importing_a_module_compiles_none_of_its_lazy_patterns() -> None:
    code = ("import importlib, sys\nfrom gpuwarden.parsers import lazyre\n"
            "for m in sys.argv[1:]:\n    importlib.import_module(m)\n"
            "print(len(lazyre._ALL), sum(set(vars(p)) != {'_source'} for p in lazyre._ALL))\n")
    out = subprocess.run([sys.executable, "-c", code, *_lazy_modules()], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(SRC)))
    built, compiled = map(int, out.stdout.split())
    assert built >= 40 and compiled == 0, out.stderr


@pytest.mark.parametrize("pattern, flags, text", [
    (r"(?P<a>[0-9]+)-(?P<b>\w+)", 0, "x 12-ab 7-c"),
    (r"gpu is lost", re.I, "NVRM: GPU IS LOST"),
    (r"\d+", re.ASCII, "٣ and 3"),
    (rb"[A-Z_]+\Z", 0, b"MESSAGE"),
])
def test_a_lazy_pattern_answers_as_the_compiled_one(pattern, flags, text) -> None:
    lazy, real = lazyre.compile(pattern, flags), re.compile(pattern, flags)
    assert not isinstance(lazy, re.Pattern) and set(vars(lazy)) == {"_source"}

    def m(x: re.Match | None) -> tuple | None:
        return None if x is None else (x.span(), x.groups(), x.groupdict())

    assert m(lazy.search(text)) == m(real.search(text)) and m(lazy.match(text)) == m(real.match(text))
    assert m(lazy.fullmatch(text)) == m(real.fullmatch(text))
    assert lazy.findall(text) == real.findall(text) and lazy.split(text) == real.split(text)
    assert [m(x) for x in lazy.finditer(text)] == [m(x) for x in real.finditer(text)]
    sub = b"<>" if isinstance(text, bytes) else "<>"
    assert lazy.sub(sub, text) == real.sub(sub, text) and lazy.subn(sub, text) == real.subn(sub, text)
    assert (lazy.pattern, lazy.flags, lazy.groupindex) == (real.pattern, real.flags, real.groupindex)
    assert "search" in vars(lazy)  # served from the object itself from now on


def test_a_bad_pattern_raises_at_first_use_and_private_names_are_not_forwarded() -> None:
    bad = lazyre.compile(r"(unclosed")
    with pytest.raises(re.error):
        bad.search("x")
    with pytest.raises(AttributeError):
        bad.__wrapped__  # noqa: B018 - a dunder is not looked up on the pattern (nor compiles it)
    with pytest.raises(AttributeError):
        bad._compiled  # noqa: B018


def test_a_lazy_pattern_copies_pickles_and_compares_as_an_immutable_value() -> None:
    import copy
    import pickle

    p = lazyre.compile(r"(?P<n>[0-9]+)", re.ASCII)
    assert p.search("x42")  # compiled and cached: the copies below must not carry the cache along
    assert copy.copy(p) is p and copy.deepcopy({"k": [p]})["k"][0] is p
    q = pickle.loads(pickle.dumps(p))
    assert q == p and hash(q) == hash(p) and q is not p and set(vars(q)) == {"_source"}
    assert q.search("x7").group("n") == "7" and p != lazyre.compile(r"(?P<n>[0-9]+)")
