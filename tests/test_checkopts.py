"""`gpuwarden check` parses its arguments without click when it can (checkopts): it must then give the
command exactly what click gives it, and leave to click everything it is not certain of."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden import checkopts, cli

REPO = Path(__file__).resolve().parents[1]


def _click_params(args: list[str]) -> dict | None:
    """What click passes to `check` for `args`, or None where click refuses them (or prints help)."""
    try:
        with cli.check.make_context("check", list(args)) as ctx:
            return dict(ctx.params)
    except (click.exceptions.ClickException, click.exceptions.Exit):
        return None


ACCEPTED = [
    [],
    ["--example", "healthy"],
    ["--example=healthy", "--format", "json", "-o", "out.json"],
    ["--root", "/host", "--no-probes", "--probe-timeout", "500ms", "--probe-access"],
    ["--bundle", "b.tar.gz", "--kubelet-log", "k.log", "--stall-seconds", "90", "--log-window", "15m"],
    ["--select", "GPU-DRV", "--select=GPU-HW-002", "--ignore", "GPU-K8S-001", "-v", "--no-color"],
    ["--fail-on", "high", "--color", "--termination-message", "tm", "--format=text"],
    ["--probes", "--no-probes", "--probes", "--fail-on", "info", "--fail-on", "critical"],  # the last one wins
    ["--root="],  # an empty root: the command says "not checked", as with click
    ["--log-window", "nonsense"],  # not parsed by either: the command refuses it, the same way
]

LEFT_TO_CLICK = [
    ["-h"], ["--help"], ["--format", "xml"], ["--format"], ["-o", ""], ["-o"], ["--output="], ["-vo", "x"],
    ["--probe-timeout", "0"], ["--probe-timeout", "nan"], ["--probe-timeout", "2h"], ["--stall-seconds", "inf"],
    ["--stall-seconds", "0.5"], ["--verbose=1"], ["stray"], ["--", "--example", "x"], ["--exampl", "healthy"],
    ["--select", "-x"], ["--fail-on", "HIGH"], ["-o", "/"], ["--kubelet-log", "/"],
]


@pytest.mark.parametrize("args", ACCEPTED, ids=" ".join)
def test_accepted_arguments_give_what_click_gives(args: list[str]) -> None:
    got = checkopts.parse(args)
    assert got is not None
    assert got == _click_params(args)


@pytest.mark.parametrize("args", LEFT_TO_CLICK, ids=" ".join)
def test_help_errors_and_unusual_forms_are_left_to_click(args: list[str]) -> None:
    assert checkopts.parse(args) is None


WORDS = sorted({d for o in checkopts.CHECK for d in o.decls}) + [
    "-h", "--help", "--", "-vo", "stray", "--exampl", "-x", "=", "--example=", "--format=json", "--format=xml",
    "--probe-timeout=5", "--color=1"]
VALUES = ["healthy", "", "json", "text", "xml", "medium", "high", "5", "5s", "500ms", "0", "-1", "nan", "inf",
          "1e308", "90", "2h", "GPU-DRV", "/", "/nonexistent/x", "out.json", "-v", "--help"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(WORDS), st.sampled_from(VALUES)), max_size=8))
def test_whatever_the_fast_parser_accepts_click_accepts_alike(args: list[str]) -> None:
    got = checkopts.parse(args)
    if got is not None:
        assert got == _click_params(args), args


def test_click_options_are_built_from_the_one_table() -> None:
    names = [p.name for p in cli.check.params]
    assert names == [o.dest for o in checkopts.CHECK]
    assert [p.name for p in cli.why.params if p.name in {o.dest for o in checkopts.SOURCE}] == \
        [o.dest for o in checkopts.SOURCE]


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    code = ("import json, runpy, sys\n"
            f"sys.argv = ['gpuwarden', *{args!r}]\n"
            "try:\n    runpy.run_module('gpuwarden', run_name='__main__')\n"
            "except SystemExit as e:\n    code = e.code\n"
            "print(json.dumps({'exit': code, 'click': 'click' in sys.modules}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "src"), **env))


def _tail(out: subprocess.CompletedProcess) -> dict:
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_check_runs_without_click_and_a_usage_error_is_said_by_click() -> None:
    ok = _run(["check", "--example", "healthy", "--format", "json", "-o", os.devnull])
    assert _tail(ok) == {"exit": 0, "click": False}, ok.stderr
    # the fast parser accepts these, the command refuses them: click parses again and says it its way
    both = _run(["check", "--example", "healthy", "--root", "/"])
    assert _tail(both) == {"exit": 2, "click": True}
    assert "Error: give at most one of --root, --bundle, --example" in both.stderr
    assert "Usage: gpuwarden check [OPTIONS]" in both.stderr
    window = _run(["check", "--example", "healthy", "--log-window", "xx"])
    assert _tail(window)["exit"] == 2 and "Invalid value for --log-window: 'xx' is not a duration" in window.stderr
    bad = _run(["check", "--format", "xml"])
    assert _tail(bad) == {"exit": 2, "click": True} and "'xml' is not one of 'text', 'json'" in bad.stderr


def test_msgspec_is_imported_without_typing_extensions_which_stays_importable() -> None:
    code = ("import sys, gpuwarden\nprint('msgspec' in sys.modules, 'typing_extensions' in sys.modules)\n"
            "import typing_extensions\nprint(typing_extensions.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    assert out.stdout.split() == ["True", "False", "typing_extensions"], out.stderr
