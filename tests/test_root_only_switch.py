"""GPUWARDEN_REQUIRE_ROOT_TESTS=1 turns root-only skips into failures, and only those (tests/support/root_only.py)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.support.root_only import ENV, ROOT_ONLY

REPO = Path(__file__).resolve().parents[1]

CASES = '''
import pytest

@pytest.fixture
def node_dir():
    pytest.skip("SYNTHETIC NODE UNAVAILABLE: materialising an example needs mknod (run as root)")

@pytest.mark.skipif(True, reason="needs root to create a cgroup")
def test_marked_root_only():
    pass

def test_fixture_root_only(node_dir):
    pass

def test_called_root_only():
    pytest.skip("REAL MPS CONTROL DAEMON NOT RUN: needs root (its /mps mount point and mount namespace)")

@pytest.mark.skipif(True, reason="no NVIDIA GPU on this host")
def test_no_gpu():
    pass

@pytest.mark.xfail(reason="needs root, but expected to fail anyway")
def test_xfail():
    assert False

def test_plain():
    pass
'''


def outcomes(tmp_path: Path, switch: str | None) -> dict[str, str]:
    """Each case's outcome (passed, skipped, failed, xfailed) with the switch set or not."""
    (tmp_path / "test_cases.py").write_text(CASES)
    xml = tmp_path / f"r{switch}.xml"
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if switch is not None:
        env[ENV] = switch
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.support.root_only",
                    f"--junitxml={xml}", "test_cases.py"], cwd=tmp_path, env=env, capture_output=True, timeout=120)
    got = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        kind = kinds[0] if kinds else "passed"
        if kind == "skipped" and case.find("skipped").get("type") == "pytest.xfail":
            kind = "xfailed"
        got[case.get("name")] = {"failure": "failed", "error": "failed"}.get(kind, kind)  # a skipif fails the setup
    return got


def test_without_the_switch_root_only_tests_skip(tmp_path: Path) -> None:
    got = outcomes(tmp_path, None)
    assert got == {"test_marked_root_only": "skipped", "test_fixture_root_only": "skipped",
                   "test_called_root_only": "skipped", "test_no_gpu": "skipped", "test_xfail": "xfailed",
                   "test_plain": "passed"}


def test_with_the_switch_root_only_skips_fail_and_other_skips_stay(tmp_path: Path) -> None:
    got = outcomes(tmp_path, "1")
    assert got["test_marked_root_only"] == got["test_fixture_root_only"] == got["test_called_root_only"] == "failed"
    assert (got["test_no_gpu"], got["test_xfail"], got["test_plain"]) == ("skipped", "xfailed", "passed")


def test_every_root_skip_of_the_suite_is_worded_as_root_only() -> None:
    """The switch knows a root-only skip by its reason: each skip guarded by the uid or mknod must say so."""
    guarded = re.compile(
        r'skipif\((?:os\.geteuid\(\) != 0|not IS_ROOT)[^\n]*?reason="([^"]+)"'
        r'|(?:os\.geteuid\(\) != 0|not can_mknod\(\)):\n\s+(?:pytest\.skip\(|return |raise \w+\()f?"([^"]+)"')
    reasons = []
    for f in sorted((REPO / "tests").rglob("*.py")):
        for m in guarded.finditer(f.read_text()):
            reasons.append((f.relative_to(REPO).as_posix(), m.group(1) or m.group(2)))
    assert len(reasons) >= 10, reasons
    assert [r for r in reasons if not ROOT_ONLY.search(r[1])] == []
    assert any(f == "tests/conftest.py" for f, _ in reasons)  # node_dir


def test_ci_sets_the_switch_when_it_runs_as_root(tmp_path: Path) -> None:
    """.ci/run exports the switches before it hands over to scripts/test (here a stand-in printing them)."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(REPO / ".ci/run", tmp_path / ".ci/run")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts/test").write_text('echo "root=${GPUWARDEN_REQUIRE_ROOT_TESTS:-unset} '
                                           'api=$GPUWARDEN_REQUIRE_APISERVER prom=$GPUWARDEN_REQUIRE_PROMTOOL"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWARDEN_REQUIRE_")}
    out = subprocess.run(["bash", str(tmp_path / ".ci/run")], env=env, capture_output=True, text=True, timeout=30)
    root = "1" if os.geteuid() == 0 else "unset"
    assert out.stdout.strip() == f"root={root} api=1 prom=1", out.stderr
