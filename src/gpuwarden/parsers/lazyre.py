"""Regular expressions compiled on first use.

A module-level `re.compile` runs in every process that imports the module, also when the pattern is
never used: the syslog and klog formats on a node whose logs are kmsg, the Xid text forms on a node
without Xids. Compiling is Python code in `re` (~0.1-0.9 ms a pattern here); a healthy example check
compiled ~50 patterns it never used (docs/performance.md §10). `compile` returns an object that
compiles at its first attribute use and then serves that attribute from its own `__dict__`, so a
later `p.match(...)` costs what it costs on the compiled pattern.

It is not a `re.Pattern` (no `isinstance`, not accepted by `re.sub(p, ...)`): use its methods and
attributes (`match`, `search`, `fullmatch`, `finditer`, `sub`, `pattern`, `groupindex`...). A bad
pattern raises `re.error` at first use: tests/parsers/test_lazyre.py compiles every lazy pattern of
the package.
"""

from __future__ import annotations

import re
from typing import Any, AnyStr

#: every LazyPattern built, so a test can compile them all (patterns are module constants: bounded)
_ALL: list[LazyPattern] = []


class LazyPattern:
    """`re.compile(pattern, flags)`, done when an attribute is first read."""

    def __init__(self, pattern: str | bytes, flags: int = 0) -> None:
        self._source = (pattern, flags)
        _ALL.append(self)

    def __getattr__(self, name: str) -> Any:
        # only public attributes of a Pattern: dunders and private names (copy, pickle) stay this object's
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(re.compile(*self._source), name)
        self.__dict__[name] = value
        return value

    # immutable, as a compiled pattern is: copies are itself, equality and pickling go by the source
    def __copy__(self) -> LazyPattern:
        return self

    def __deepcopy__(self, memo: dict) -> LazyPattern:
        return self

    def __reduce__(self) -> tuple:
        return compile, self._source

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LazyPattern) and other._source == self._source

    def __hash__(self) -> int:
        return hash(self._source)

    def __repr__(self) -> str:
        return f"lazyre.compile{self._source!r}"


def compile(pattern: AnyStr, flags: int = 0) -> re.Pattern[AnyStr]:  # noqa: A001 - re.compile's name, on purpose
    """A pattern compiled on first use; typed as the `re.Pattern` whose methods it serves."""
    return LazyPattern(pattern, flags)  # type: ignore[return-value]
