"""Options dataclasses turned into command-line flags (shared by the agent and the controller).

A field made with `option(default, help, **meta)` is one flag, `--kebab-case` of its name; a
duration (`duration=True`) drops its `_s` (it takes units: 90s, 5m). Other metadata: `choices`
(argparse choices) and `auto` (the default is computed at run time, shown as `(auto)`).
Each flag defaults to None, so that a caller can tell an unset flag from one set to the default.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import field
from typing import Any


def option(default: Any, help: str, **meta: Any) -> Any:
    """A dataclass field with its help text and metadata (lists and dicts are copied per instance)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **meta})
    return field(default=default, metadata={"help": help, **meta})


def kind(f: dataclasses.Field) -> str:
    """The field's type name (`bool`, `int`, `float`, `str`, `list`), annotations postponed or not."""
    return f.type if isinstance(f.type, str) else f.type.__name__


def public_name(f: dataclasses.Field) -> str:
    """The YAML key / flag stem of a field: durations drop their `_s`."""
    return f.name.removesuffix("_s") if f.metadata.get("duration") else f.name


def flag(f: dataclasses.Field) -> str:
    return "--" + public_name(f).replace("_", "-")


def show_default(v: Any, duration: bool = False) -> str:
    """A default as `--help` (and the docs) print it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return ",".join(v) or "(none)"
    if v == "":
        return "(none)"
    if duration:
        return f"{v:g}s"
    return str(v)


def add_flags(p: argparse.ArgumentParser, cls: type) -> None:
    """One flag per field of the dataclass `cls`, its help ending in `[default: ...]`."""
    defaults = cls()
    for f in dataclasses.fields(cls):
        k, duration = kind(f), bool(f.metadata.get("duration"))
        shown = "(auto)" if f.metadata.get("auto") else show_default(getattr(defaults, f.name), duration)
        help_text = f"{f.metadata['help']} [default: {shown}]"
        if k == "bool":
            p.add_argument(flag(f), dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif k == "list":
            p.add_argument(flag(f), dest=f.name, action="append", default=None, metavar="VALUE", help=help_text)
        else:
            metavar = None if f.metadata.get("choices") else "DURATION" if duration else \
                {"int": "N", "float": "X"}.get(k, "VALUE")
            p.add_argument(flag(f), dest=f.name, default=None, metavar=metavar, choices=f.metadata.get("choices"),
                           help=help_text)
