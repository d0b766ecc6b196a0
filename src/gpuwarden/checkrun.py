"""What `check` (and `why`) do once their options are parsed: open the node, run the rules, write the
report, exit with the verdict's code; without a CLI framework, so that `gpuwarden check` can run
without importing one (checkopts parses its arguments; cli is the click front of the same code).

Exit codes of `check`: 0 no finding at or above --fail-on; 1 findings at or above it;
2 usage error (bad arguments, unreadable bundle); 3 internal error; 4 not checked (the root is not
a directory, no rule selected or evaluable, no NVIDIA GPU on the node): never read as healthy.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from typing import Any, Callable

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL, EXIT_NOT_CHECKED = 0, 1, 2, 3, 4
#: the collector's thresholds for the start-up of a command (see `startup`), and the interpreter's
START_GC_THRESHOLD = (50_000, 20, 100)
DEFAULT_GC_THRESHOLD = gc.get_threshold()


def startup() -> None:
    """Every command's first step (with click or without)."""
    # A command imports ~250 modules, whose classes and tables live as long as the process and hold
    # few cycles: collecting the young generation every 700 of those allocations costs ~5% of a
    # one-shot `check` (docs/performance.md). `agent` and `controller` go back to the default once
    # started, for their long run.
    gc.set_threshold(*START_GC_THRESHOLD)
    # At exit the interpreter collects every object once more (~14 ms after a `check` here): none of
    # those objects needs it (files and probe children are closed explicitly), so they are frozen
    # out of that last collection. Registered once, however often a test process invokes a command.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


class UsageError(Exception):
    """Arguments no run can start from: said by click (`Error: ...`, exit 2), before anything is read."""

    def __init__(self, message: str, param_hint: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param_hint = message, param_hint


def say(text: str, err: bool = False) -> None:
    """One line to stdout or stderr (what click.echo does for plain text), terminal-safe: a message
    may quote a bundle's member or a node's path."""
    from gpuwarden import terminal

    stream = sys.stderr if err else sys.stdout
    stream.write(terminal.safe(text) + "\n")
    stream.flush()


def settings(**kw: Any):
    """The facts' Settings with each given (not None) value set."""
    from gpuwarden.facts import Settings

    s = Settings()
    for k, v in kw.items():
        if v is not None:
            setattr(s, k, v)
    return s


def open_source(root_dir, bundle, example, text_on_stdout: bool = False):
    """(root, mode, keep) for --root/--bundle/--example; exits with EXIT_USAGE on a bad source.

    `keep` is a temporary directory (an unpacked bundle) to clean up after the run, or None.
    `text_on_stdout`: the report would be text on stdout, where a root that cannot be read is said.
    """
    if sum(x is not None for x in (root_dir, bundle, example)) > 1:
        raise UsageError("give at most one of --root, --bundle, --example")
    for flag, value in (("--bundle", bundle), ("--example", example)):
        if value == "":  # never the live / in its place
            raise UsageError(f"{flag} is empty: name a bundle or an example (gpuwarden examples)")
    try:
        if example:
            from gpuwarden.examples import open_example

            return open_example(example), "example", None
        if bundle:
            from gpuwarden.bundle.archive import open_bundle

            root, keep = open_bundle(bundle)
            return root, "bundle", keep
        from gpuwarden.root import HostRoot

        # always the host asked for (or this one): never an example in its place
        root = HostRoot(root_dir or "/")
        if root_dir == "" or root.usable is not None:
            why = "is empty" if root_dir == "" else f"cannot be opened as a directory ({root.usable.strerror})"
            not_checked(f"--root {root_dir!r} {why}", text_on_stdout)
        return root, "live", None
    except Exception as exc:  # KeyError (example), OSError, BundleError and friends
        say(f"gpuwarden: {exc}", err=True)
        sys.exit(EXIT_USAGE)


def not_checked(why: str, text_on_stdout: bool = False) -> None:
    """Exit EXIT_NOT_CHECKED saying why: nothing was looked at, so nothing may read as healthy.

    Said where the report would have been when that is text on stdout (the whole report, first and
    last line), else on stderr (stdout stays JSON, or the report was to go to a file).
    """
    if text_on_stdout:
        say(f"Not checked: {why}.")
    else:
        say(f"gpuwarden: not checked: {why}", err=True)
    sys.exit(EXIT_NOT_CHECKED)


def text_on_stdout(fmt: str, output: str | None) -> bool:
    return fmt == "text" and not output


def run_on_source(src: dict, rules):
    """Open the node of the source options, run `rules` on it, clean up: the Report.

    `rules` may be a callable that picks them: on a live node the NVML probe child is then forked
    first, so that its nvmlInit overlaps loading the rules as well as reading the node.
    """
    from gpuwarden.facts import NodeFacts

    window_s = None
    if src.get("log_window") is not None:
        from gpuwarden.parsers.duration import parse_duration

        try:
            window_s = parse_duration(src["log_window"], positive=True)
        except ValueError:
            raise UsageError(f"{src['log_window']!r} is not a duration (900, 90s, 15m, 2h)",
                             param_hint="--log-window") from None
    root, mode, keep = open_source(src["root_dir"], src["bundle"], src["example"], src.get("text_on_stdout", False))
    opts = settings(probes=src["probes"] and mode == "live", probe_timeout_s=src["probe_timeout"],
                    probe_access=src["probe_access"], kubelet_log=src["kubelet_log"],
                    plugin_call_stall_s=src["stall_seconds"], log_window_s=window_s, plugin_probe=mode == "live")
    facts = None
    try:
        facts = NodeFacts(root, opts)
        if mode == "live" and opts.probes and (callable(rules) or any("probes" in r.needs for r in rules)):
            from gpuwarden.facts.probes import start_early

            start_early(facts)  # NVML runs in its child while the rules load and the other facts are read
        chosen = rules() if callable(rules) else rules
        if not any("probes" in r.needs for r in chosen):  # e.g. --ignore GPU-DRV-006: not needed after all
            for pending in facts.early.values():
                pending.cancel()
        from gpuwarden import engine

        return engine.run(facts, chosen, mode=mode)
    except Exception as exc:  # pragma: no cover - the engine isolates rules; this is a last resort
        say(f"gpuwarden: internal error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(EXIT_INTERNAL)
    finally:
        for pending in (facts.early.values() if facts is not None else ()):
            pending.result()  # never leave a probe child behind: collected, or killed at its deadline
        if keep is not None:
            keep.cleanup()


def _reader_gone() -> None:
    """The reader of stdout went away (`check ... | head -1`): stop writing, quietly.

    The rest of the report goes nowhere (stdout becomes /dev/null, so no flush at exit fails), and the
    command still exits with its verdict's code, not click's 1 for a broken pipe.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real file descriptor (a test runner's stream)
        pass


class ReaderSafeStdout:
    """sys.stdout for a command run as a process: a reader that went away (`gpuwarden rules | head -1`) is
    not an error. The first write or flush that meets the closed pipe makes stdout /dev/null
    (_reader_gone), and the command goes on to its end and its own exit code: click would exit 1 with
    a broken pipe, and a `check` could then not be told from one that found something. Everything
    else is the wrapped stream's."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            _reader_gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _reader_gone()
            try:
                self._stream.flush()  # what was buffered goes to /dev/null now
            except (BrokenPipeError, ValueError):
                pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def reader_safe_stdout() -> None:
    """Make sys.stdout a ReaderSafeStdout (once): the entry of the `gpuwarden` process calls it first."""
    if sys.stdout is not None and not isinstance(sys.stdout, ReaderSafeStdout):
        sys.stdout = ReaderSafeStdout(sys.stdout)  # type: ignore[assignment]


def emit(output: str | None, write: Callable) -> None:
    """write(stream) to stdout, or to the file `output`: rendered in memory first, so that a full disk,
    an unwritable or special file ends in one line and exit 2, never a traceback or half a report."""
    if output is None:
        try:
            write(sys.stdout)
            sys.stdout.flush()
        except BrokenPipeError:
            _reader_gone()
        return
    import io

    buf = io.StringIO()
    write(buf)
    try:
        with open(output, "w", encoding="utf-8") as f:
            f.write(buf.getvalue())
    except OSError as exc:
        say(f"gpuwarden: cannot write the report to {output}: {exc.strerror or exc}", err=True)
        sys.exit(EXIT_USAGE)



def check(root_dir, bundle, example, probes, probe_timeout, probe_access, kubelet_log, stall_seconds, log_window,
          fmt, output, fail_on, select, ignore, verbose, color, termination_message) -> None:
    """`gpuwarden check`: run every rule (or those selected) on the node, write the report, exit."""

    def every_rule():
        from gpuwarden import engine

        return engine.select(engine.all_rules(), (), ignore)

    # with --select only those families are imported (cheap, and it tells whether NVML is needed);
    # without, the NVML probe is forked first and every family is imported while it runs
    rules = every_rule
    if select:
        from gpuwarden import engine

        rules = engine.select(engine.rules_for(select), select, ignore)
    if select and not rules:
        not_checked(f"no rule matches --select {' '.join(select)}" + (f" --ignore {' '.join(ignore)}" if ignore else "")
                    + " (gpuwarden rules lists them)", text_on_stdout(fmt, output))

    src = dict(root_dir=root_dir, bundle=bundle, example=example, probes=probes, probe_timeout=probe_timeout,
               probe_access=probe_access, kubelet_log=kubelet_log, stall_seconds=stall_seconds, log_window=log_window,
               text_on_stdout=text_on_stdout(fmt, output))
    report = run_on_source(src, rules)

    def write(stream) -> None:
        if fmt == "json":
            from gpuwarden.render import json as render_json

            render_json.render(report, stream)
        else:
            from gpuwarden.render import text as render_text

            use_color = color if color is not None else (stream.isatty() and not os.environ.get("NO_COLOR"))
            render_text.render(report, stream, color=bool(use_color), verbose=verbose)

    emit(output, write)
    if termination_message:
        from gpuwarden.render.packed import pack

        try:
            with open(termination_message, "w") as f:
                f.write(pack(report.to_json()))
        except OSError as exc:
            say(f"gpuwarden: cannot write the termination message: {exc}", err=True)
    from gpuwarden.findings import Severity

    threshold = Severity.parse(fail_on)
    if any(f.severity >= threshold for f in report.findings):
        sys.exit(EXIT_FINDINGS)
    sys.exit(EXIT_NOT_CHECKED if report.not_checked else EXIT_OK)
