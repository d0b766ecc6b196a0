"""/proc/driver/nvidia/version: which kernel module is loaded."""

from __future__ import annotations

import re

from msgspec import Struct

from gpuwarden.parsers import lazyre, plausible

_NVRM = lazyre.compile(
    r"NVRM version:\s*NVIDIA UNIX (?P<flavor>Open )?(?:(?P<arch>\S+) )?Kernel Module(?: for (?P<arch2>\S+))?\s+(?P<version>[0-9]+(?:\.[0-9]+)+)(?![^\s])"
)


class DriverVersion(Struct, frozen=True):
    """The loaded NVIDIA kernel module's version, from /proc/driver/nvidia/version."""
    version: str
    open_module: bool
    line: str

    @property
    def branch(self) -> int:
        return int(self.version.split(".")[0])

    def tuple(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.version.split("."))


def parse(text: str) -> DriverVersion | None:
    """The module's version; None when there is no NVRM line or its version is impossible."""
    for line in text.splitlines():
        m = _NVRM.search(line)
        if m:
            if not plausible.driver_version(m.group("version")):
                return None
            return DriverVersion(m.group("version"), bool(m.group("flavor")), line.strip())
    return None


_LIBRARY = lazyre.compile(r"\.so\.([0-9]+(?:\.[0-9]+)+)\Z")


def library_version(name: str) -> str | None:
    """The driver version in a library's file name ("libnvidia-ml.so.570.158.01" -> "570.158.01"), as
    written (check it with plausible.driver_version); None when the name carries none ("….so.1")."""
    m = _LIBRARY.search(name)
    return m.group(1) if m else None


def version_tuple(text: str) -> tuple[int, ...]:
    """'570.158.01' -> (570, 158, 1); non-numeric parts end the tuple."""
    out = []
    for part in re.split(r"[.\-]", text.strip().lstrip("v")):
        if not plausible.decimal(part):
            m = re.match(r"[0-9]+", part)
            if m:
                out.append(int(m.group()))
            break
        out.append(int(part))
    return tuple(out)
