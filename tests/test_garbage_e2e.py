"""Garbage, truncated and missing inputs end to end: `check --bundle <dir>` never crashes, and says what it lacked.

Each case copies the healthy example and damages it; the report must still be produced
(exit 0 or 1, never 3, never a traceback) and name the unreadable sources or the rules
that could not conclude.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwarden.cli import main
from tests.support.minischema import validate
from tests.support.bundles import CHECKPOINT, GPU_DEVICES_LIST, REPO, copy_example, write

SCHEMA = json.loads((REPO / "docs/report-schema.json").read_text())
CORE_SECTIONS = ("driver", "kubelet", "containers", "gpu_access", "processes", "plugin", "runtime", "identity")
DEV_CODES = ("GPU-DEV-001", "GPU-DEV-002", "GPU-DEV-003")


def _meta(b: Path, fn) -> None:
    meta = json.loads((b / "meta.json").read_text())
    fn(meta)
    (b / "meta.json").write_text(json.dumps(meta))


def _truncate(b: Path, path: str, keep: int) -> None:
    f = b / "files" / path.lstrip("/")
    f.write_bytes(f.read_bytes()[:keep])


def _truncate_in(b: Path, path: str, marker: str, keep: int) -> None:
    """Cut the file `keep` characters into the line that starts with marker (mid-line, as a torn copy)."""
    f = b / "files" / path.lstrip("/")
    text = f.read_text()
    f.write_text(text[: text.index(marker) + keep])


def _rm(b: Path, path: str, listed: tuple[str, ...] = ()) -> None:
    shutil.rmtree(b / "files" / path.lstrip("/"))

    def drop(m: dict) -> None:
        for key in ("listdir", "stat", "readlink"):
            for p in [p for p in m.get(key, {}) if p == path or p.startswith(path + "/")]:
                del m[key][p]

    _meta(b, drop)


def no_var_lib_kubelet(b: Path) -> None:
    _rm(b, "/var/lib/kubelet")


def no_cgroupfs(b: Path) -> None:
    _rm(b, "/sys/fs/cgroup")


def no_proc(b: Path) -> None:
    _rm(b, "/proc")


GARBAGE = b"\x00\x7fELF\x02\x01\x01 \xff\xfe{not: [valid\n\x1b[31m"

#: name -> (damage, expected unavailable sources, expected not_evaluated DEV codes)
CASES = {
    "proc-devices-truncated": (lambda b: _truncate(b, "/proc/devices", 10), {"/proc/devices"}, ()),
    "proc-devices-garbage": (lambda b: write(b, "/proc/devices", GARBAGE), {"/proc/devices"}, ()),
    "proc-devices-empty": (lambda b: write(b, "/proc/devices", ""), {"/proc/devices"}, ()),
    "devices-list-garbage": (lambda b: write(b, GPU_DEVICES_LIST, GARBAGE), {GPU_DEVICES_LIST}, ()),
    "devices-list-truncated": (lambda b: _truncate_in(b, GPU_DEVICES_LIST, "c 195:255 rw", 7), {GPU_DEVICES_LIST}, ()),
    "kubelet-config-garbage": (lambda b: write(b, "/var/lib/kubelet/config.yaml", GARBAGE),
                               {"/var/lib/kubelet/config.yaml"}, ()),
    "kubelet-config-truncated": (lambda b: _truncate_in(b, "/var/lib/kubelet/config.yaml", "cpuManagerPolicy", 10),
                                 {"/var/lib/kubelet/config.yaml"}, ()),
    "checkpoint-garbage": (lambda b: write(b, CHECKPOINT, GARBAGE), {CHECKPOINT}, ()),
    "checkpoint-truncated": (lambda b: _truncate(b, CHECKPOINT, 300), {CHECKPOINT}, ()),
    "cpu-manager-state-garbage": (lambda b: write(b, "/var/lib/kubelet/cpu_manager_state", GARBAGE),
                                  {"/var/lib/kubelet/cpu_manager_state"}, ()),
    "no-var-lib-kubelet": (no_var_lib_kubelet, {"/var/lib/kubelet/config.yaml"}, ()),
    "no-sys-fs-cgroup": (no_cgroupfs, set(), DEV_CODES),
    "no-proc": (no_proc, set(), DEV_CODES),
}


def everything(b: Path) -> None:
    for name, (damage, _, _) in CASES.items():
        if name != "no-proc":
            try:
                damage(b)
            except (FileNotFoundError, UnicodeDecodeError, ValueError):
                pass  # an earlier case removed or garbled it


def check_dir(b: Path) -> tuple[int, dict, str]:
    r = CliRunner().invoke(main, ["check", "--bundle", str(b), "--format", "json"])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output + r.stderr
    return r.exit_code, json.loads(r.stdout), r.stderr


def assert_sane(code: int, js: dict) -> None:
    assert code in (0, 1)
    assert validate(js, SCHEMA) == []
    crashed = [e for e in js["errors"] if any(f"collector {s} failed" in e for s in CORE_SECTIONS)]
    assert crashed == []
    assert not any(e.startswith("rule GPU-DEV") for e in js["errors"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_damaged_healthy_node(tmp_path: Path, case: str) -> None:
    damage, want_gaps, want_skipped = CASES[case]
    b = copy_example("healthy", tmp_path)
    damage(b)
    code, js, _ = check_dir(b)
    assert_sane(code, js)
    gaps = {g["source"]: g["reason"] for g in js["unavailable"]}
    assert want_gaps <= set(gaps), (case, gaps)
    skipped = {s["code"]: s["reason"] for s in js["not_evaluated"]}
    assert set(want_skipped) <= set(skipped), (case, skipped)
    # damage never invents a device-access failure on a healthy node
    assert [f["code"] for f in js["findings"] if f["code"].startswith("GPU-DEV") and f["status"] == "confirmed"] == []


def test_a_garbage_manifest_entry_refuses_the_bundle(tmp_path: Path) -> None:
    """A manifest entry collect never writes is a usage error naming it, not a partial report that could
    read healthy (issue 44; root/manifest.py)."""
    b = copy_example("healthy", tmp_path)
    _meta(b, lambda m: m["stat"].update({"/dev/nvidiactl": {"kind": 5}}))
    r = CliRunner().invoke(main, ["check", "--bundle", str(b), "--format", "json"])
    assert r.exit_code == 2 and r.stdout == ""
    assert "stat['/dev/nvidiactl']" in r.stderr and "Traceback" not in r.output


def test_reasons_are_specific(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    no_cgroupfs(b)
    _, js, _ = check_dir(b)
    reasons = {s["code"]: s["reason"] for s in js["not_evaluated"]}
    assert reasons["GPU-DEV-001"] == "gpu_access: /sys/fs/cgroup cannot be listed: missing"
    b2 = copy_example("healthy", tmp_path / "2")
    write(b2, "/var/lib/kubelet/config.yaml", GARBAGE)
    write(b2, "/proc/devices", "Character devi")
    _, js, _ = check_dir(b2)
    gaps = {g["source"]: g["reason"] for g in js["unavailable"]}
    assert gaps["/var/lib/kubelet/config.yaml"] == "not a YAML mapping (garbage or truncated)"
    assert gaps["/proc/devices"] == "unreadable (malformed): no 'Character devices:' section (truncated or garbage)"


def test_everything_damaged_in_a_real_process(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    everything(b)
    code, js, _ = check_dir(b)
    assert_sane(code, js)
    assert set(DEV_CODES) <= {s["code"] for s in js["not_evaluated"]}
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    p = subprocess.run([sys.executable, "-m", "gpuwarden", "check", "--bundle", str(b), "--format", "json"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode in (0, 1), p.stderr
    assert "Traceback" not in p.stderr
    assert_sane(p.returncode, json.loads(p.stdout))
