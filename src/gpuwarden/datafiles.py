"""The YAML tables shipped in `gpuwarden/data/`: reading one and checking its schema.

Each table's module parses its document (`load(text)`, which tests also call with other text)
and caches the result of loading the shipped file (`load(read_text(name))`).
"""

from __future__ import annotations

from importlib import resources
from typing import Any, Callable, Iterable, TypeVar

import yaml

# libyaml's parser when PyYAML has it: the same safe constructor, ~10x faster (docs/performance.md)
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_text(name: str) -> str:
    """The text of the shipped data file `name` (e.g. "xid.yaml")."""
    return resources.files("gpuwarden").joinpath(f"data/{name}").read_text(encoding="utf-8")


def parse(text: str, schema: str, what: str) -> dict[str, Any]:
    """A YAML mapping whose `schema:` is `schema`; else ValueError "`what`: expected schema ..."."""
    doc = yaml.load(text, Loader=_LOADER)  # noqa: S506
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        raise ValueError(f"{what}: expected schema {schema}")
    return doc


T = TypeVar("T")


def by_id(raws: Iterable[Any], build: Callable[[Any], T], what: str) -> dict[str, T]:
    """Build each entry of a shipped table and index it by its `.id`; a duplicate id is a ValueError."""
    out: dict[str, T] = {}
    for raw in raws:
        item = build(raw)
        key = item.id  # type: ignore[attr-defined]
        if key in out:
            raise ValueError(f"{what}: duplicate id {key}")
        out[key] = item
    return out

