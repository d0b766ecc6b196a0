"""The JSON report packed into a Kubernetes termination message (4 KiB) and read back."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gpuwarden.cli import main
from gpuwarden.examples import names
from gpuwarden.findings import Report
from gpuwarden.render.packed import LIMIT, PREFIX, pack, unpack


def report(example: str) -> dict:
    r = CliRunner().invoke(main, ["check", "--example", example, "--format", "json"])
    return json.loads(r.stdout)


@pytest.mark.parametrize("example", names())
def test_every_example_fits_and_reads_back(example: str) -> None:
    r = report(example)
    text = pack(r)
    assert text.startswith(PREFIX) and len(text.encode()) <= LIMIT
    back = unpack(text)
    if back.get("packed") == "reduced":
        assert [f["code"] for f in back["findings"]] == [f["code"] for f in r["findings"]]
        assert "evidence" not in back["findings"][0]
    else:
        assert back == r


@pytest.mark.parametrize("example", names())
def test_report_json_round_trip(example: str) -> None:
    r = report(example)
    assert Report.from_json(r).to_json() == r


def test_reduction_drops_the_least_severe_findings_first() -> None:
    r = report("mig-nvml-hang")
    codes = [f["code"] for f in r["findings"]]
    kept_counts = set()
    for limit in range(300, 3000, 20):
        text = pack(r, limit=limit)
        back = unpack(text)
        kept = [f["code"] for f in back["findings"]]
        assert kept == codes[:len(kept)]  # worst first: a prefix survives
        assert len(text) <= limit or kept == []
        kept_counts.add(len(kept))
    assert kept_counts == {0, 1, 2}


@pytest.mark.parametrize("garbage", ["", "hello", PREFIX + "!!!", PREFIX + "aGVsbG8=", "{not json", PREFIX[:-3]])
def test_garbage_is_none_not_a_traceback(garbage: str) -> None:
    assert unpack(garbage) is None


def test_check_writes_the_termination_message(tmp_path) -> None:
    out = tmp_path / "termination-log"
    r = CliRunner().invoke(main, ["check", "--example", "uvm-missing", "--format", "json",
                                  "--termination-message", str(out)])
    assert r.exit_code == 1
    assert unpack(out.read_text()) == json.loads(r.stdout)
    bad = CliRunner().invoke(main, ["check", "--example", "uvm-missing", "--termination-message",
                                    str(tmp_path / "no" / "dir")])
    assert bad.exit_code == 1 and "cannot write the termination message" in bad.stderr
