"""parsers.plausible: the kernel's device-number bounds, the NVIDIA GPU node names and driver versions."""

from __future__ import annotations

import pytest

from gpuwarden.parsers import plausible


@pytest.mark.parametrize("path, major, minor", [
    ("/dev/nvidia0", 195, 0), ("/dev/nvidiactl", 195, 255), ("/dev/nvidia253", None, None),
    ("/dev/nvidia-uvm", 4095, (1 << 20) - 1), ("/dev/nvidia-caps/nvidia-cap1", 241, 1), ("/dev/dri/card1", 0, 0)])
def test_possible_devices(path: str, major, minor) -> None:
    assert plausible.device_problem(path, major, minor) is None


@pytest.mark.parametrize("path, major, minor, says", [
    ("/dev/nvidia0", 4096, 0, "major 4096 is not a Linux device major (12 bits"),
    ("/dev/nvidia0", 1 << 31, 0, "major 2147483648"), ("/dev/nvidia0", (1 << 32) - 1, 0, "major 4294967295"),
    ("/dev/nvidia0", 195, 1 << 20, "minor 1048576 is not a Linux device minor (20 bits"),
    ("/dev/nvidia0", 195, (1 << 32) - 1, "minor 4294967295"), ("/dev/nvidia0", -1, 0, "major -1"),
    ("/dev/nvidia0", "195", 0, "major 195"), ("/dev/nvidia0", True, 0, "major True"), ("/dev/nvidia0", 1.0, 0, "major 1.0"),
    ("/dev/nvidia99999999", None, None, "/dev/nvidia0 .. /dev/nvidia253"), ("/dev/nvidia254", None, None, "nvidia253"),
    ("dev/nvidia0", None, None, "not an absolute path"), ("/dev/nv\0", None, None, "not an absolute path"),
    ("/" + "a" * 256, None, None, "longer than a path"), ("/a/" * 1400, None, None, "longer than a path"),
    (None, None, None, "not an absolute path")])
def test_impossible_devices_say_why(path, major, minor, says: str) -> None:
    why = plausible.device_problem(path, major, minor)
    assert why is not None and says in why and len(why) < 200, why


@pytest.mark.parametrize("v", ["580.159.04", "570.158.01", "580.95.05", "390.157", "313.09", "570.999.01"])
def test_driver_versions_nvidia_ships(v: str) -> None:
    assert plausible.driver_version(v)


@pytest.mark.parametrize("v", ["15.3.04", "15.3.0", "58.159.04", "0580.159.04", "5800.1", "580", "580.1234.01",
                               "580.159.04.1", "580.159.0400", "999999.1.1"])
def test_versions_no_nvidia_driver_has(v: str) -> None:
    assert not plausible.driver_version(v)
