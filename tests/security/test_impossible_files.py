"""Files no kernel or driver writes never confirm anything (issue 30, item 3).

Each case is one of the issue's reproductions on the healthy example (a real H200 capture with a
GPU pod): a /proc/devices with a malformed, zeroed, permuted or duplicated major, shuffled or cut
lines; non-ASCII digits in /proc/driver/nvidia/version; an NVML library link to an impossible
version; a manifest `missing` entry of the wrong type. Before the fix each gave a CONFIRMED
GPU-DRV-003, GPU-DEV-001 + GPU-DEV-004 or GPU-DRV-002. Now the source reads "unreadable
(malformed)" and the rules that conclude from it are "not evaluated". Files that contradict each
other (/proc/modules: nvidia_uvm Live; /proc/devices: no nvidia-uvm) give an at-risk finding
that says so, never a confirmed one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
from click.testing import CliRunner

from gpuwarden.cli import main
from gpuwarden.findings import Status
from tests.support.bundles import EXAMPLES, copy_example, edit_meta, open_dir, report_of, write

DEVICES = (EXAMPLES / "healthy/files/proc/devices").read_text()
VERSION = (EXAMPLES / "healthy/files/proc/driver/nvidia/version").read_text()
NVML = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
#: the rules that conclude from /proc/devices' NVIDIA majors
NEED_DEVICES = ("GPU-DRV-003", "GPU-DEV-001", "GPU-DEV-004")


def _devices(text: str) -> Callable[[Path], None]:
    return lambda b: write(b, "/proc/devices", text)


def _shuffled() -> str:
    lines = DEVICES.splitlines()
    return "\n".join(lines[:1] + lines[14:20] + lines[1:14] + lines[20:]) + "\n"


#: the issue's /proc/devices inputs: name -> text
BAD_DEVICES = {
    "uvm-major-zero": DEVICES.replace("238 nvidia-uvm", "  0 nvidia-uvm"),
    "uvm-major-malformed": DEVICES.replace("238 nvidia-uvm", "23x8 nvidia-uvm"),
    "uvm-major-negative": DEVICES.replace("238 nvidia-uvm", "-238 nvidia-uvm"),
    "uvm-major-full-width": DEVICES.replace("238 nvidia-uvm", "２３８ nvidia-uvm"),
    "uvm-major-permuted-283": DEVICES.replace("238 nvidia-uvm", "283 nvidia-uvm"),
    "uvm-major-permuted-832": DEVICES.replace("238 nvidia-uvm", "832 nvidia-uvm"),
    "uvm-major-shared": DEVICES.replace("238 nvidia-uvm", "237 nvidia-uvm\n237 hidraw2"),
    "uvm-listed-twice": DEVICES.replace("238 nvidia-uvm", "238 nvidia-uvm\n238 nvidia-uvm"),
    "uvm-at-two-majors": DEVICES.replace("238 nvidia-uvm", "237 nvidia-uvm\n238 nvidia-uvm"),
    "frontend-permuted": DEVICES.replace("195 nvidia\n195 nvidiactl", "159 nvidia\n159 nvidiactl"),
    "frontend-zero": DEVICES.replace("195 nvidia\n", "  0 nvidia\n"),
    "frontend-duplicated": DEVICES.replace("195 nvidia\n", "195 nvidia\n196 nvidia\n"),
    "fixed-majors-permuted": DEVICES.replace("  1 mem", "  1 misc").replace(" 10 misc", " 10 mem"),
    "lines-shuffled": _shuffled(),
    "truncated-before-uvm": DEVICES[: DEVICES.index("238 nvidia-uvm")],
    "truncated-mid-uvm": DEVICES[: DEVICES.index("238 nvidia-uvm") + 6],
}


def _check(b: Path) -> dict:
    r = CliRunner().invoke(main, ["check", "--bundle", str(b), "--format", "json"])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output
    return json.loads(r.stdout)


def _confirmed(js: dict) -> list[str]:
    return [f["code"] for f in js["findings"] if f["status"] == "confirmed"]


def test_the_healthy_base_has_no_finding(tmp_path: Path) -> None:
    js = _check(copy_example("healthy", tmp_path))
    assert js["findings"] == [] and not {s["code"] for s in js["not_evaluated"]} & set(NEED_DEVICES)


@pytest.mark.parametrize("case", sorted(BAD_DEVICES))
def test_impossible_proc_devices_confirms_nothing(tmp_path: Path, case: str) -> None:
    b = copy_example("healthy", tmp_path)
    _devices(BAD_DEVICES[case])(b)
    js = _check(b)
    assert _confirmed(js) == [], case
    gaps = {g["source"]: g["reason"] for g in js["unavailable"]}
    assert gaps["/proc/devices"].startswith("unreadable (malformed): "), gaps.get("/proc/devices")
    skipped = {s["code"]: s["reason"] for s in js["not_evaluated"]}
    assert set(NEED_DEVICES) <= set(skipped), (case, skipped)
    assert skipped["GPU-DRV-003"].startswith("/proc/devices: malformed ("), skipped["GPU-DRV-003"]


@pytest.mark.parametrize("version", ["５８０.159.04", "٥٨٠.159.04", "580.１５９.04", "18446744073709551616.1"])
def test_non_ascii_or_impossible_driver_version_confirms_nothing(tmp_path: Path, version: str) -> None:
    b = copy_example("healthy", tmp_path)
    write(b, "/proc/driver/nvidia/version", VERSION.replace("580.159.04", version))
    edit_meta(b, lambda m: m["readlink"].__setitem__(NVML, "libnvidia-ml.so.580.159.04"))
    js = _check(b)
    assert _confirmed(js) == []
    gaps = {g["source"]: g["reason"] for g in js["unavailable"]}
    assert gaps["/proc/driver/nvidia/version"].startswith("unreadable (malformed): ")


@pytest.mark.parametrize("target", ["libnvidia-ml.so.999999.1.1", "libnvidia-ml.so.580.18446744073709551616.04",
                                    "libnvidia-ml.so.580.159.04.1.2", "libnvidia-ml.so.５８０.159.05"])
def test_impossible_library_version_confirms_nothing(tmp_path: Path, target: str) -> None:
    b = copy_example("healthy", tmp_path)
    edit_meta(b, lambda m: m["readlink"].__setitem__(NVML, target))
    js = _check(b)
    assert _confirmed(js) == []
    if target.isascii():
        gaps = {g["source"]: g["reason"] for g in js["unavailable"]}
        assert gaps[NVML].startswith("unreadable (malformed): ") and "is not an NVIDIA driver version" in gaps[NVML]


def test_a_real_library_mismatch_is_still_confirmed(tmp_path: Path) -> None:
    """The check rejects only the impossible: another real version is the GPU-DRV-002 it always was."""
    b = copy_example("healthy", tmp_path)
    edit_meta(b, lambda m: m["readlink"].__setitem__(NVML, "libnvidia-ml.so.580.172.02"))
    assert _confirmed(_check(b)) == ["GPU-DRV-002"]


def _drop_uvm_node(m: dict, entry: object) -> None:
    m["stat"].pop("/dev/nvidia-uvm")
    m["missing"]["/dev/nvidia-uvm"] = entry


@pytest.mark.parametrize("entry", [5, "missing", None, [], ["bogus"], ["missing", "x", "y"], [1, 2]])
def test_invalid_manifest_missing_entry_confirms_nothing(tmp_path: Path, entry: object) -> None:
    """Refused (exit 2, the entry named), not read: no report, so no finding and no clean bill (issue 44)."""
    b = copy_example("healthy", tmp_path)
    edit_meta(b, lambda m: _drop_uvm_node(m, entry))
    r = CliRunner().invoke(main, ["check", "--bundle", str(b), "--format", "json"])
    assert r.exit_code == 2 and r.stdout == "", r.output
    assert "missing['/dev/nvidia-uvm']" in r.stderr and "Traceback" not in r.output


def test_a_valid_missing_entry_is_still_an_absent_node(tmp_path: Path) -> None:
    """["missing"] is how a capture records an absent node: GPU-DRV-003 confirms it as before."""
    b = copy_example("healthy", tmp_path)
    edit_meta(b, lambda m: _drop_uvm_node(m, ["missing"]))
    assert _confirmed(_check(b)) == ["GPU-DRV-003"]


def test_contradicting_modules_and_devices_lower_to_at_risk(tmp_path: Path) -> None:
    """A well-formed /proc/devices without nvidia-uvm while /proc/modules lists nvidia_uvm Live: the
    sources contradict each other (a live module has its major registered); at-risk, and it says so."""
    b = copy_example("healthy", tmp_path)
    write(b, "/proc/devices", DEVICES.replace("238 nvidia-uvm\n", ""))
    f = [f for f in report_of(open_dir(b)).findings if f.code == "GPU-DRV-003"]
    assert len(f) == 1 and f[0].status is Status.AT_RISK
    assert "contradict" in f[0].summary and "not confirmed" in f[0].summary
    assert any(e.source == "/proc/modules" and "Live" in e.text for e in f[0].evidence)
    # and it clears: the same node with both files agreeing has no GPU-DRV-003
    write(b, "/proc/devices", DEVICES)
    assert [f for f in report_of(open_dir(b)).findings if f.code == "GPU-DRV-003"] == []


def test_without_nvidia_uvm_in_either_file_it_is_confirmed(tmp_path: Path) -> None:
    b = copy_example("healthy", tmp_path)
    write(b, "/proc/devices", DEVICES.replace("238 nvidia-uvm\n", ""))
    mods = (EXAMPLES / "healthy/files/proc/modules").read_text()
    write(b, "/proc/modules", "".join(ln + "\n" for ln in mods.splitlines() if not ln.startswith("nvidia_uvm")))
    f = [f for f in report_of(open_dir(b)).findings if f.code == "GPU-DRV-003"]
    assert len(f) == 1 and f[0].status is Status.CONFIRMED


def test_module_absent_but_its_majors_registered_is_at_risk_not_confirmed(tmp_path: Path) -> None:
    """GPU-DRV-001 on contradicting files: no nvidia module in /proc/modules and no version file, yet
    /proc/devices lists 195 nvidia and the dynamic NVIDIA majors. At-risk, saying so; with /proc/devices
    agreeing (no NVIDIA entry) it is confirmed as before, and on the healthy node it clears."""
    b = copy_example("healthy", tmp_path)
    mods = (EXAMPLES / "healthy/files/proc/modules").read_text()
    write(b, "/proc/modules", "".join(ln + "\n" for ln in mods.splitlines() if not ln.startswith("nvidia")))
    (b / "files/proc/driver/nvidia/version").unlink()
    f = [f for f in report_of(open_dir(b)).findings if f.code == "GPU-DRV-001"]
    assert len(f) == 1 and f[0].status is Status.AT_RISK and "contradict" in f[0].summary
    assert any(e.source == "/proc/devices" and "195 nvidia" in e.text for e in f[0].evidence)
    write(b, "/proc/devices", "".join(ln + "\n" for ln in DEVICES.splitlines() if "nvidia" not in ln))
    f = [f for f in report_of(open_dir(b)).findings if f.code == "GPU-DRV-001"]
    assert len(f) == 1 and f[0].status is Status.CONFIRMED
    assert [f for f in report_of(open_dir(copy_example("healthy", tmp_path / "h"))).findings
            if f.code == "GPU-DRV-001"] == []
