"""A reader that goes away (`gpuwarden rules | head -1`) is no error: the command exits as it would have,
without a traceback (issue 44: `rules | head -1` exited 1 in most runs, click's code for a broken pipe)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _closed_reader(*args: str) -> tuple[int, str]:
    """Run `gpuwarden ARGS` with its stdout a pipe whose reader is already gone: every write meets EPIPE."""
    p = subprocess.Popen([sys.executable, "-m", "gpuwarden", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    return p.wait(timeout=120), err


@pytest.mark.parametrize("args,code", [
    (("rules",), 0),
    (("rules", "--format", "markdown"), 0),
    (("explain", "GPU-DEV-001"), 0),
    (("examples",), 0),
    (("check", "--example", "healthy"), 0),  # the fast path without click
    (("check", "--example", "uvm-missing"), 1),  # findings: 1, as with a reader
    (("check", "--example", "uvm-missing", "--fail-on", "critical"), 0),  # no finding at critical: 0, not 1
    (("check", "--example", "healthy", "--format", "json"), 0),
    (("why", "cuda-unknown-error", "--example", "uvm-missing"), 1),
])
def test_a_closed_pipe_exits_with_the_commands_own_code(args, code) -> None:
    rc, err = _closed_reader(*args)
    assert (rc, err) == (code, "")


def test_with_a_reader_the_codes_are_the_same() -> None:
    """The negative: the same commands with a reader exit with the same codes (nothing else changes)."""
    r = subprocess.run([sys.executable, "-m", "gpuwarden", "check", "--example", "uvm-missing", "--fail-on",
                        "critical"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "GPU-DEV-001" in r.stdout
    r = subprocess.run([sys.executable, "-m", "gpuwarden", "rules"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.count("\n") > 30


def test_kubectl_gpuwarden_too() -> None:
    """`kubectl gpuwarden --help | head -1` (the console script's entry, kubectl.cli.run): 0, as with a reader;
    the entry point named in pyproject is that one."""
    code = "import sys; sys.argv = ['kubectl-gpuwarden', '--help']; from gpuwarden.kubectl.cli import run; run()"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    assert (p.wait(timeout=120), p.stderr.read().decode()) == (0, "")
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'kubectl-gpuwarden = "gpuwarden.kubectl.cli:run"' in pyproject
