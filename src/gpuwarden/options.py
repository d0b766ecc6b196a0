"""Options dataclasses turned into click options (shared by the agent and the controller).

A field made with `option(default, help, **meta)` is one flag, `--kebab-case` of its name; a
duration (`duration=True`) drops its `_s` (it takes units: 90s, 5m). Other metadata: `choices`
and `auto` (the default is computed at run time, shown as `(auto)`). Each flag defaults to None
(a list flag to empty), so that the caller can tell an unset flag from one set to the default and
apply its precedence (defaults < environment < config file < flags); the values stay text, for the
config module to coerce and validate as it does a YAML file's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any, Sequence


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
