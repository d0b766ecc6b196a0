"""The one option layer of every command: options dataclasses, their click flags, and the coercion
and checking of their values, shared by the agent, the controller and the click CLI.

A field made with `option(default, help, **meta)` is one flag, `--kebab-case` of its name; a
duration (`duration=True`) drops its `_s` (it takes units: 90s, 5m). Other metadata: `choices`
and `auto` (the default is computed at run time, shown as `(auto)`). Each flag defaults to None
(a list flag to empty), so that the caller can tell an unset flag from one set to the default and
apply its precedence (defaults < environment < config file < flags); the values stay text, and
`coerce` turns a flag's text and a YAML file's value alike into the field's type: durations by
`parsers.duration`, lists by `split_list` (one rule for flags and files), then `check_schema`
checks types and ranges.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any, Sequence

from gpuwarden.parsers.duration import parse_duration

_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")


class ConfigError(ValueError):
    """A bad option value or an unknown key, in a config file or on the command line."""


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


def click_params(cls: type) -> list:
    """One click option per field of the dataclass `cls`, its help ending in `[default: ...]`."""
    import click

    defaults = cls()
    out = []
    for f in dataclasses.fields(cls):
        k, duration = kind(f), bool(f.metadata.get("duration"))
        shown = "(auto)" if f.metadata.get("auto") else show_default(getattr(defaults, f.name), duration)
        help_text = f"{f.metadata['help']}  [default: {shown}]"
        name = public_name(f).replace("_", "-")
        if k == "bool":
            out.append(click.Option([f"--{name}/--no-{name}", f.name], default=None, help=help_text))
            continue
        choices = f.metadata.get("choices")
        metavar = "DURATION" if duration else {"int": "N", "float": "X", "list": "VALUE[,VALUE]"}.get(k, "TEXT")
        out.append(click.Option([flag(f), f.name], default=None, multiple=k == "list", help=help_text,
                                metavar=metavar, type=click.Choice(choices) if choices and k != "list" else None))
    return out


def given(values: dict[str, Any]) -> dict[str, Any]:
    """The flags a command line set: unset ones are None (an unset list flag is empty)."""
    return {k: v for k, v in values.items() if v is not None and v != ()}


def parse(params: list, argv: Sequence[str], prog: str) -> dict[str, Any]:
    """Parse `argv` with these click options as the command would (usage errors exit 2, --help 0)."""
    import click

    try:
        return click.Command(prog, params=params).make_context(prog, list(argv)).params
    except click.exceptions.Exit as e:
        raise SystemExit(e.exit_code) from None
    except click.ClickException as e:
        e.show()
        raise SystemExit(2) from None


def split_list(value: Any) -> list[str]:
    """The one list rule, for flags and config files alike: items split on commas, stripped,
    empties dropped ("a, b,,c" and ["a", "b,c"] -> ["a", "b", "c"]). ConfigError if not text or a list."""
    if isinstance(value, str):
        value = [value]
    elif not isinstance(value, (list, tuple)):
        raise ConfigError(f"expected a list, got {_short(value)}")
    bad = [item for item in value if not isinstance(item, str)]
    if bad:  # a nested list or mapping is no code: never str() it (an alias bomb expands to GBs)
        raise ConfigError(f"expected a list of strings, got an item {_short(bad[0])}")
    return [x.strip() for item in value for x in item.split(",") if x.strip()]


def _short(value: Any) -> str:
    """A value's type and a bounded repr: never the whole of a hostile document."""
    if isinstance(value, (list, tuple, dict)):
        return f"a {type(value).__name__} of {len(value)}"
    return repr(value)[:80]


def coerce(f: dataclasses.Field, value: Any, label: str = "") -> Any:
    """A flag's text or a config file's value as the type field `f` declares; a ConfigError that
    starts with `label` (default: the key as a user writes it) on a value that is not one."""
    kind_ = kind(f)
    try:
        if f.metadata.get("duration"):
            return parse_duration(value)
        if kind_ == "bool":
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in _TRUE or s in _FALSE:
                return s in _TRUE
            raise ConfigError(f"not a boolean: {value!r}")
        if kind_ == "int":
            if isinstance(value, bool) or isinstance(value, float) and not value.is_integer() \
                    or not isinstance(value, (int, float, str)):
                raise ConfigError(f"not an integer: {value!r}")
            return int(value)
        if kind_ == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise ConfigError(f"not a number: {value!r}")
            return float(value)
        if kind_ == "list":
            return split_list(value)
        if value is not None and not isinstance(value, (str, int, float)):
            raise ConfigError(f"expected a string, got {value!r}")
        return "" if value is None else str(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ConfigError(f"{label or public_name(f)}: {exc}") from None


def check_schema(cfg: Any, bounds: dict[str, tuple[float, float]]) -> None:
    """Every field of a config dataclass of the type it declares, finite and within its bounds.

    The one-line ConfigError names the key as a user writes it (YAML key / flag stem).
    """
    for f in dataclasses.fields(cfg):
        v, kind_, key = getattr(cfg, f.name), kind(f), public_name(f)
        if kind_ in ("int", "float"):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind_ == "int" and not isinstance(v, int)):
                raise ConfigError(f"{key}: expected {'an integer' if kind_ == 'int' else 'a number'}, got {v!r}")
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{key}: {v!r} is not a finite number")
            lo, hi = bounds.get(f.name, (-math.inf, math.inf))
            if not lo <= v <= hi:
                raise ConfigError(f"{key}: {v:g} is outside {lo:g} .. {hi:g}")
        elif kind_ == "str" and not (isinstance(v, str) and "\0" not in v):
            raise ConfigError(f"{key}: expected a string, got {v!r}")
        elif kind_ == "list" and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            raise ConfigError(f"{key}: expected a list of strings, got {v!r}")
        elif kind_ == "bool" and not isinstance(v, bool):
            raise ConfigError(f"{key}: expected true or false, got {v!r}")
        choices = f.metadata.get("choices")
        if choices and kind_ == "list":
            bad = [x for x in v if x not in choices]
            if bad:
                raise ConfigError(f"{key}: {bad[0]!r} is not one of {', '.join(choices)}")
        elif choices and v not in choices:
            raise ConfigError(f"{key}: {v!r} is not one of {', '.join(choices)}")
    listen = getattr(cfg, "listen", "")
    if listen:
        host, sep, port = listen.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or len(port) > 5:
            raise ConfigError(f"listen: {listen!r} is not host:port with a port in 0 .. 65535")
