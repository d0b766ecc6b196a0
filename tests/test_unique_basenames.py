"""pytest imports test modules by basename (rootdir-relative, no packages under tests/): two modules
of one name stop the whole collection ("import file mismatch"), so the README's test command fails.
A folder with an `__init__.py` (tests/security) is a package: its modules are named with it."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_test_module_has_a_basename_of_its_own() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for p in TESTS.rglob("test_*.py"):
        if "fixtures" not in p.relative_to(TESTS).parts and not (p.parent / "__init__.py").exists():
            by_name[p.name].append(str(p.relative_to(TESTS)))
    assert {n: ps for n, ps in by_name.items() if len(ps) > 1} == {}
