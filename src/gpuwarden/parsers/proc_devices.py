"""/proc/devices: the kernel's device-name -> major table.

nvidia-uvm, nvidia-caps and nvidia-nvswitch majors are allocated dynamically
at module load, so they must always be read from here; only 195 is fixed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwarden.parsers import plausible

NVIDIA_FIXED_MAJOR = 195
#: names that mean "the 195 frontend"; renamed in driver 550.40 (nvidia-container-toolkit#324)
_FRONTEND_NAMES = ("nvidia", "nvidia-frontend", "nvidiactl")


@dataclass(frozen=True)
class DeviceTable:
    char: dict[str, list[int]] = field(default_factory=dict)
    block: dict[str, list[int]] = field(default_factory=dict)
    #: why the table is empty although the file was not: an impossible value makes it unreadable
    problems: tuple[str, ...] = ()

    def char_major(self, name: str) -> int | None:
        majors = self.char.get(name)
        return majors[0] if majors else None

    def name_of(self, major: int) -> str | None:
        for name, majors in self.char.items():
            if major in majors:
                return name
        return None

    def nvidia_majors(self) -> dict[str, int]:
        """Every nvidia* character major, with the frontend names folded onto 195."""
        out: dict[str, int] = {}
        for name, majors in self.char.items():
            if name.startswith("nvidia") and majors:
                out[name] = majors[0]
        if any(n in self.char for n in _FRONTEND_NAMES):
            out.setdefault("nvidia", NVIDIA_FIXED_MAJOR)
        return out


def parse(text: str) -> DeviceTable:
    table = DeviceTable()
    section: dict[str, list[int]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        low = line.lower()
        if low.startswith("character devices"):
            section = table.char
            continue
        if low.startswith("block devices"):
            section = table.block
            continue
        if section is None:
            continue
        parts = line.split(None, 1)
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        if plausible.digits(parts[0], plausible.MAX_MAJOR) is None:  # dev_t has 12 bits of major
            return DeviceTable(problems=(f"major {parts[0][:24]} of {parts[1][:40]!r} is not a possible device number",))
        section.setdefault(parts[1].strip(), []).append(int(parts[0]))
    return table
