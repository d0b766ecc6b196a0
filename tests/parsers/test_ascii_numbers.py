"""Numbers are read with ASCII-only patterns (issue 30): `\\d` and str.isdigit() also take "５", "٣"
and "²", which int() reads as numbers no kernel writes (or refuses with a traceback)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuwarden.logs import signatures
from gpuwarden.parsers import nvidia_version, plausible, proc_modules

SRC = Path(__file__).resolve().parents[2] / "src/gpuwarden"
SOURCES = sorted([*SRC.glob("parsers/*.py"), *SRC.glob("logs/*.py")])


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_unicode_digit_classes(path: Path) -> None:
    text = path.read_text()
    assert "\\d" not in text, f"{path.name}: use [0-9] (\\d matches every Unicode digit)"
    if path.name != "plausible.py":
        assert ".isdigit()" not in text, f"{path.name}: use plausible.decimal() (str.isdigit takes '５' and '²')"


def test_signature_patterns_are_ascii() -> None:
    table = signatures.all_signatures()
    assert table and all(s.regex is None or s.regex.flags & re.ASCII for s in table.values())


@pytest.mark.parametrize("text", ["５８０", "٥٨٠", "²", "1²", "", " 1", "-1"])
def test_decimal_refuses_what_is_not_ascii_digits(text: str) -> None:
    assert not plausible.decimal(text)


def test_non_ascii_digits_are_no_version_and_no_module() -> None:
    line = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  ５８０.159.04  Release Build"
    assert nvidia_version.parse(line) is None
    assert nvidia_version.library_version("libnvidia-ml.so.５８０.159.04") is None
    assert nvidia_version.library_version("libnvidia-ml.so.580.159.04") == "580.159.04"
    assert nvidia_version.library_version("libnvidia-ml.so.1") is None
    assert not plausible.driver_version("580.159.04\n") and plausible.driver_version("580.159.04")
    assert proc_modules.parse("nvidia_uvm １８３０９１２ 0 - Live 0xffffffffc080c000 (O)\n") == {}
