"""Built-in example nodes: captured bundles shipped in the package.

They let a user without a GPU see gpuwarden work, and they are the fixtures of
the rule tests. Each directory is a bundle (see docs/architecture.md) with an
ORIGIN.md saying where every file came from; an example may overlay another
(`"base"` in its meta.json) so the healthy node is written once.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from gpuwarden.root import BundleRoot

if TYPE_CHECKING:
    from pathlib import Path

#: this directory as a string (a check does not import pathlib: datafiles says why); `HERE` is it as
#: a `pathlib.Path`, built when asked for
_HERE = os.path.dirname(__file__)


def __getattr__(name: str) -> Path:
    if name == "HERE":
        from pathlib import Path

        return Path(_HERE)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def names() -> list[str]:
    return sorted(n for n in os.listdir(_HERE) if os.path.isfile(os.path.join(_HERE, n, "meta.json")))


def describe(name: str) -> str:
    with open(os.path.join(_HERE, name, "meta.json")) as f:
        meta = json.loads(f.read())
    return str(meta.get("description", ""))


class UnknownExample(KeyError):
    """No built-in example of that name: a KeyError that prints as its message (KeyError's str() quotes it)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def open_example(name: str) -> BundleRoot:
    if name not in names():
        raise UnknownExample(f"no example node {name!r}; known: {', '.join(names())}")
    return open_bundle_dir(os.path.join(_HERE, name), label=f"example:{name}")


def base_of(meta: object) -> str | None:
    """The example a bundle overlays (its meta.json "base"), or None.

    Only the name of a shipped example counts: a path (absolute, `../`) or anything not a
    string would make a bundle's lower layer whatever directory its sender names.
    """
    base = meta.get("base") if isinstance(meta, dict) else None
    return base if isinstance(base, str) and base in names() else None


def open_bundle_dir(path: str | os.PathLike[str], label: str | None = None, _depth: int = 0) -> BundleRoot:
    """Open a bundle directory, resolving its `base` chain of examples (read from the meta.json the
    bundle itself read, beneath its directory)."""
    top = BundleRoot(path, label=label)
    base = base_of(top.meta)
    if base and _depth < 4:
        top.overlay(open_bundle_dir(os.path.join(_HERE, base), label=f"example:{base}", _depth=_depth + 1))
    return top
