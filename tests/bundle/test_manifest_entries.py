"""A bundle's manifest entries are typed (root.manifest): an invalid one is a usage error, never a silent pass.

Issue 44, item 5: in the dra-uvm-missing bundle, `"missing": {"/dev/nvidia-uvm": {"a": 1}}` made the
driver fact unavailable, 12 rules were skipped and the report said "No problems found", exit 0.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuwarden.bundle.archive import BundleError, open_bundle
from gpuwarden.root import BundleRoot, Manifest, Missing, StatInfo
from tests.support.bundles import copy_example, edit_meta

_BAD = [{"a": 1}, [1], "denied", 3, None, [], ["gone"], ["missing", "a", "b"]]


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuwarden", "check", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("bad", _BAD, ids=[json.dumps(b) for b in _BAD])
def test_an_invalid_missing_entry_is_a_usage_error_not_a_clean_report(tmp_path, bad) -> None:
    b = copy_example("dra-uvm-missing", tmp_path)
    edit_meta(b, lambda m: m.__setitem__("missing", {"/dev/nvidia-uvm": bad}))
    r = _check("--bundle", str(b))
    assert r.returncode == 2, (r.returncode, r.stdout[-400:])
    assert "No problems found" not in r.stdout and "Traceback" not in r.stderr
    assert "meta.json" in r.stderr and "missing['/dev/nvidia-uvm']" in r.stderr, r.stderr


def test_the_untouched_copy_still_reports_its_finding(tmp_path) -> None:
    """The negative: the same bundle with its manifest as collect wrote it is read, and exits 1."""
    b = copy_example("dra-uvm-missing", tmp_path)
    r = _check("--bundle", str(b), "--select", "GPU-DRA-010")
    assert r.returncode == 1 and "GPU-DRA-010" in r.stdout


@pytest.mark.parametrize("table,entry", [
    ("stat", {"/dev/nvidia0": {"kind": "chr", "major": 4096, "minor": 0}}),  # dev_t: majors stop at 4095
    ("stat", {"/dev/nvidia0": {"kind": "chr", "major": 195, "minor": 1 << 20}}),  # minors at 2^20-1
    ("stat", {"/dev/nvidia0": {"kind": "chr"}}),
    ("stat", {"/dev/nvidia0": {"kind": "chr", "major": True, "minor": 0}}),
    ("stat", {"/dev/nvidia0": {"kind": "dir", "mtime": float("1e300")}}),
    ("readlink", {"/dev/char/195:0": 7}),
    ("listdir", {"/dev": ["ok", ".."]}),
    ("listdir", {"/dev": "nvidia0"}),
    ("remove", ["/dev/nvidia0", 3]),
    ("stat", []),
])
def test_every_table_is_typed_and_an_invalid_entry_refused(tmp_path, table, entry) -> None:
    b = copy_example("healthy", tmp_path)
    edit_meta(b, lambda m: m.__setitem__(table, entry))
    with pytest.raises(BundleError, match="not a manifest gpuwarden collect writes"):
        open_bundle(b)


def test_a_valid_manifest_opens_and_is_answered_from_its_types(tmp_path) -> None:
    m = Manifest({"stat": {"/dev/nvidia0": {"kind": "chr", "major": 195, "minor": 0, "mode": 8630, "ctime": 1,
                                            "inode": 7, "path": "/elsewhere"}},
                  "readlink": {"/dev/char/195:0": "../nvidia0"}, "listdir": {"/dev": ["nvidia0"]},
                  "missing": {"/proc/1/environ": ["denied", "EACCES"], "/etc/x": ["error"]}, "remove": ["/a/../b"]})
    assert m.problems == []
    assert m.stats["/dev/nvidia0"] == StatInfo("/dev/nvidia0", "chr", 195, 0, 8630, 1.0)
    assert m.missing == {"/proc/1/environ": Missing("/proc/1/environ", "denied", "EACCES"),
                         "/etc/x": Missing("/etc/x", "error")}
    assert m.removed == ("/b",)
    open_bundle(copy_example("healthy", tmp_path))  # every shipped example is a valid manifest


def test_an_invalid_entry_read_directly_answers_invalid_and_is_a_gap(tmp_path) -> None:
    """BundleRoot itself (without open_bundle's refusal) never answers a lower layer or a fact for it."""
    (tmp_path / "meta.json").write_text(json.dumps({"missing": {"/dev/nvidia-uvm": {"a": 1}}}))
    r = BundleRoot(tmp_path)
    got = r.stat("/dev/nvidia-uvm")
    assert isinstance(got, Missing) and got.kind == "invalid"
    assert r.problems and "missing['/dev/nvidia-uvm']" in r.problems[0][0]


def test_problems_are_bounded(tmp_path) -> None:
    m = Manifest({"stat": {f"/dev/x{i}": "chr" for i in range(10_000)}})
    assert len(m.problems) == 100 and m.dropped == 9_900
    assert "(+9997 more)" in m.said()
