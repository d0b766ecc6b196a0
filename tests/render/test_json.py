"""`gpuwarden check --example NAME --format json` of every built-in example, pinned byte for byte
(golden files), so that work on what a check costs (docs/performance.md §8) cannot change a report.

The golden files are tests/render/golden/<example>.json: the command's output with the two values
that change from run to run, `generated_at` and `summary.duration_s`, replaced. After a deliberate
change of a rule's output, regenerate them with the text ones and review the diff:

    GPUWARDEN_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/render/test_text.py tests/render/test_json.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwarden import examples
from gpuwarden.cli import main

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("GPUWARDEN_UPDATE_GOLDEN") == "1"


def normalized(out: str) -> str:
    out = re.sub(r'("generated_at": )"[^"]*"', r'\1"T"', out, count=1)
    return re.sub(r'("duration_s": )[0-9.e-]+', r"\g<1>0", out, count=1)


@pytest.mark.parametrize("name", examples.names())
def test_json_report_golden(name: str) -> None:
    r = CliRunner().invoke(main, ["check", "--example", name, "--format", "json"])
    assert r.exit_code in (0, 1), r.output
    got = normalized(r.stdout)
    path = GOLDEN / f"{name}.json"
    if UPDATE:
        path.write_text(got)
    assert path.exists(), f"no golden file {path.name}: run with GPUWARDEN_UPDATE_GOLDEN=1 and review it"
    assert got == path.read_text(), f"{path.name} differs: review, then GPUWARDEN_UPDATE_GOLDEN=1 (see the docstring)"
