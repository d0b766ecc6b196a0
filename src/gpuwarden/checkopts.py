"""The options of `check` (and the node options `why` shares), as one table, and a parser of them
that needs no CLI framework.

The table is the single definition: `cli` builds the click options from it, and `gpuwarden check`
parses its arguments here first, so that a check does not pay for importing click (a quarter of a
healthy check's instructions with it, docs/performance.md). This parser only accepts: anything it
does not know for certain (help, an unknown or malformed option, a bad value, a positional
argument) returns None and click parses the same arguments, with its own messages. A test holds the
two parsers to the same values on every argument list this one accepts (tests/test_checkopts.py).
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable

from msgspec import Struct

from gpuwarden.parsers.duration import DurationError, parse_duration

SEVERITIES = ("info", "low", "medium", "high", "critical")
#: --probe-timeout's range, the agent's (agent/config.py BOUNDS, tested alike)
PROBE_TIMEOUT_RANGE = (0.01, 3600.0)
STALL_RANGE = (1.0, 7 * 86400.0)


class Opt(Struct, frozen=True):
    """One option. `kind`: "value", "flag" (is_flag), "bool" (--x/--no-x), "multi" (repeatable).
    `type`: "text", "path", "file" (a path that is not a directory), "choice", "duration", "seconds"."""

    dest: str
    decls: tuple[str, ...]
    kind: str = "value"
    type: str = "text"
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] = ()
    bounds: tuple[float, float] = (0.0, 0.0)
    metavar: str | None = None
    show_default: bool = False
    nonempty: bool = False  # "" is a usage error (-o ""), never stdout or a traceback


SOURCE = (
    Opt("root_dir", ("--root",), type="path", help="Filesystem root of the node: / on the node, /host in a pod."),
    Opt("bundle", ("--bundle",), type="path", help="Analyse a captured bundle (gpuwarden collect) offline."),
    Opt("example", ("--example",), metavar="NAME", help="Analyse a built-in example node (see `gpuwarden examples`)."),
    Opt("probes", ("--probes", "--no-probes"), kind="bool", default=True, show_default=True,
        help="Live probes on a live node: NVML, the device plugins' gRPC, bpf(2) reads of cgroup device programs. "
             "--no-probes makes none of these calls; what they would have decided is reported as not evaluated."),
    Opt("probe_timeout", ("--probe-timeout",), type="duration", default="5s", bounds=PROBE_TIMEOUT_RANGE,
        show_default=True, help="Hard deadline of each live probe (5, 5s, 500ms, 1m)."),
    Opt("probe_access", ("--probe-access",), kind="flag", default=False,
        help="Actively open() device nodes from inside each GPU container's cgroup (briefly places a process "
             "in the workload's cgroup)."),
    Opt("kubelet_log", ("--kubelet-log",), type="file", help="kubelet log file (klog text or journalctl -o json)."),
    Opt("stall_seconds", ("--stall-seconds",), type="seconds", bounds=STALL_RANGE,
        help="GPU-K8S-001: a device-plugin call unanswered this long is a hang (default 60)."),
    Opt("log_window", ("--log-window",), metavar="DURATION",
        help="Scan only the last DURATION (900, 15m, 2h) of the kubelet and containerd logs, not whole files; a "
             "device-plugin call older than that is still found (docs/logs.md, Bounded scans)."),
)

CHECK = SOURCE + (
    Opt("fmt", ("--format",), type="choice", choices=("text", "json"), default="text", show_default=True),
    Opt("output", ("-o", "--output"), type="file", nonempty=True, help="Write the report here instead of stdout."),
    Opt("fail_on", ("--fail-on",), type="choice", choices=SEVERITIES, default="medium", show_default=True,
        help="Exit 1 when a finding at or above this severity exists."),
    Opt("select", ("--select",), kind="multi", metavar="CODE", help="Only these rule codes or prefixes (repeatable)."),
    Opt("ignore", ("--ignore",), kind="multi", metavar="CODE", help="Skip these rule codes or prefixes (repeatable)."),
    Opt("verbose", ("-v", "--verbose"), kind="flag", default=False, help="All evidence, gaps and references."),
    Opt("color", ("--color", "--no-color"), kind="bool", help="Colour (default: when stdout is a terminal)."),
    Opt("termination_message", ("--termination-message",), type="file", metavar="FILE",
        help="Also write the JSON report, packed to fit a Kubernetes termination message (4 KiB), to FILE "
             "(/dev/termination-log in a pod): how `kubectl gpuwarden check` gets it back."),
)


class _Unsure(Exception):
    """This parser does not decide these arguments: click does."""


def seconds(value: object, lo: float, hi: float) -> float:
    """A finite number of seconds within [lo, hi] (inf, nan and 1e308 are no deadline a child can keep),
    else ValueError with the message the option's error says (cli.Seconds is this for click)."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(v) or not lo <= v <= hi:
        raise ValueError(f"{value!r} is not within {lo:g} .. {hi:g} seconds")
    return v


def duration(value: object, lo: float, hi: float) -> float:
    """A duration in the grammar of every flag and config file (parsers.duration) within [lo, hi]
    seconds, else ValueError with the option's error message (cli.Duration is this for click)."""
    try:
        v = parse_duration(value, positive=True)
    except DurationError as exc:
        raise ValueError(str(exc)) from None
    if not lo <= v <= hi:
        raise ValueError(f"{value!r} is not within {lo:g}s .. {hi:g}s")
    return v


def convert(opt: Opt, text: str) -> Any:
    """The value click gives the command for `text`, or _Unsure where click would refuse it."""
    if opt.nonempty and text == "":
        raise _Unsure
    if opt.type == "choice":
        if text not in opt.choices:
            raise _Unsure
        return text
    try:
        if opt.type == "duration":
            return duration(text, *opt.bounds)
        if opt.type == "seconds":
            return seconds(text, *opt.bounds)
    except ValueError:
        raise _Unsure from None
    if opt.type == "file" and text and os.path.isdir(text):  # click: "is a directory"
        raise _Unsure
    return text


def _defaults(opts: tuple[Opt, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for o in opts:
        if o.kind == "multi":
            out[o.dest] = ()
        elif o.type == "duration" and o.default is not None:
            out[o.dest] = duration(o.default, *o.bounds)
        else:
            out[o.dest] = o.default
    return out


def _index(opts: tuple[Opt, ...]) -> dict[str, tuple[Opt, Any]]:
    """Each spelling: (its option, the value a flag spelling sets; Ellipsis where a value follows)."""
    idx: dict[str, tuple[Opt, Any]] = {}
    for o in opts:
        if o.kind == "bool":
            idx[o.decls[0]], idx[o.decls[1]] = (o, True), (o, False)
        else:
            for d in o.decls:
                idx[d] = (o, True if o.kind == "flag" else ...)
    return idx


def parse(args: list[str], opts: tuple[Opt, ...] = CHECK) -> dict[str, Any] | None:
    """The command's parameters for `args` (the words after `check`), exactly as click would pass
    them, or None: click must parse these (help, an error, or a form this parser leaves to it)."""
    idx = _index(opts)
    params = _defaults(opts)
    multi: dict[str, list[Any]] = {}
    i = 0
    try:
        while i < len(args):
            word = args[i]
            i += 1
            name, eq, inline = word.partition("=") if word.startswith("--") else (word, "", "")
            if name not in idx or (eq and not name.startswith("--")):
                raise _Unsure  # -h/--help, a positional, an unknown or combined short option, "--"
            opt, flag_value = idx[name]
            if flag_value is not ...:
                if eq:
                    raise _Unsure  # --verbose=1
                params[opt.dest] = flag_value
                continue
            if eq:
                text = inline
            else:
                if i >= len(args) or args[i].startswith("-"):
                    raise _Unsure  # missing value, or one click may read otherwise
                text = args[i]
                i += 1
            value = convert(opt, text)
            if opt.kind == "multi":
                multi.setdefault(opt.dest, []).append(value)
            else:
                params[opt.dest] = value
    except _Unsure:
        return None
    for dest, values in multi.items():
        params[dest] = tuple(values)
    return params


def click_options(opts: tuple[Opt, ...], extra: Callable[[Opt], dict[str, Any]]) -> list[Callable]:
    """click.option decorators for `opts` (in order); `extra(opt)`: its click type and callback."""
    import click

    out = []
    for o in opts:
        kw: dict[str, Any] = {"help": o.help or None, "show_default": o.show_default}
        if o.metavar:
            kw["metavar"] = o.metavar
        if o.kind == "bool":
            decls = (f"{o.decls[0]}/{o.decls[1]}",)
            kw["default"] = o.default
        elif o.kind == "flag":
            decls, kw["is_flag"] = o.decls, True
        else:
            decls = o.decls
            kw["multiple"] = o.kind == "multi"
            if o.default is not None:
                kw["default"] = o.default
            kw.update(extra(o))
        out.append(click.option(*decls, o.dest, **kw))
    return out
