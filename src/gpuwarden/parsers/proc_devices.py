"""/proc/devices: the kernel's device-name -> major table.

nvidia-uvm, nvidia-caps and nvidia-nvswitch majors are allocated dynamically
at module load, so they must always be read from here; only 195 is fixed.

The kernel writes this file one way only (fs/char_dev.c, block/genhd.c): "Character devices:",
one "%3d %s" line per registration in ascending major order, a blank line, "Block devices:" and
its lines. A file that breaks that shape (a line that is not "<major> <name>", major 0 or past the
kernel's 512, majors out of order, no block section, a fixed major moved, an NVIDIA module
registered twice or at a major no dynamic allocation can give) was not written by a kernel: the
table is left empty with the reason in `problems`, so nothing is concluded from it.
"""

from __future__ import annotations

import re

from msgspec import Struct, field

NVIDIA_FIXED_MAJOR = 195
#: names that mean "the 195 frontend"; renamed in driver 550.40 (nvidia-container-toolkit#324)
_FRONTEND_NAMES = ("nvidia", "nvidia-frontend", "nvidiactl")
#: CHRDEV_MAJOR_MAX and BLKDEV_MAJOR_MAX: no registration has a major of 512 or more
MAX_KERNEL_MAJOR = 511
#: majors the kernel (include/uapi/linux/major.h) and the NVIDIA driver fix at build time
FIXED_CHAR_MAJORS = {"mem": 1, "tty": 4, "/dev/vc/0": 4, "/dev/tty": 5, "/dev/console": 5, "/dev/ptmx": 5,
                     "vcs": 7, "misc": 10, "input": 13, "ptm": 128, "pts": 136,
                     **{n: NVIDIA_FIXED_MAJOR for n in _FRONTEND_NAMES}}


def dynamic_major(major: int) -> bool:
    """A major alloc_chrdev_region can hand out: 254 down to 234, then 511 down to 384 (Linux >= 4.14;
    older kernels searched 254 down to 1)."""
    return 1 <= major <= 254 or 384 <= major <= MAX_KERNEL_MAJOR


#: one registration, as the kernel prints it ("%3d %s"); ASCII digits only
_LINE = re.compile(r" {0,2}([0-9]{1,3}) (\S.*)")


class DeviceTable(Struct, frozen=True):
    """/proc/devices: driver name -> major numbers, by char and block."""
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


def _impossible(char: list[tuple[int, str]]) -> str | None:
    """The first registration in the character section that no kernel can show, or None."""
    by_major: dict[int, list[str]] = {}
    for major, name in char:
        by_major.setdefault(major, []).append(name)
    seen: set[tuple[int, str]] = set()
    for major, name in char:
        fixed = FIXED_CHAR_MAJORS.get(name)
        if fixed is not None and major != fixed:
            return f"{name!r} at major {major}: the kernel fixes it at {fixed}"
        if not name.startswith("nvidia"):
            continue
        if (major, name) in seen:
            return f"{major} {name!r} is listed twice: the driver registers it once"
        seen.add((major, name))
        if name in _FRONTEND_NAMES:
            continue
        # a dynamically allocated NVIDIA major: one registration, on a major nothing else holds
        if sum(1 for _, n in char if n == name) > 1:
            return f"{name!r} is listed at two majors: the driver registers it once"
        others = [n for n in by_major[major] if n != name]
        if others:
            return f"{name!r} shares major {major} with {others[0][:40]!r}: a dynamic major is never shared"
        if not dynamic_major(major):
            return f"{name!r} at major {major}: no dynamic allocation gives that major"
    return None


def parse(text: str) -> DeviceTable:
    """The table; empty with `problems` set when the text is not what a kernel writes.

    Text with no "Character devices:" section at all gives an empty table and no problem (the
    caller says it is garbage or truncated)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    heads = [i for i, ln in enumerate(lines) if ln.strip().lower() == "character devices:"]
    if not heads:
        return DeviceTable()
    if heads != [0]:
        return DeviceTable(problems=("'Character devices:' is not the first line, or not the only one",))
    sections: dict[str, list[tuple[int, str]]] = {"char": [], "block": []}
    current = "char"
    for n, raw in enumerate(lines[1:], start=2):
        if raw.strip().lower() == "block devices:" and current == "char":
            current = "block"
            continue
        m = _LINE.fullmatch(raw.rstrip())
        if m is None:
            return DeviceTable(problems=(f"line {n} {raw[:40]!r} is not '<major> <name>'",))
        major, name = int(m.group(1)), m.group(2).strip()
        if not 1 <= major <= MAX_KERNEL_MAJOR:
            return DeviceTable(problems=(f"major {major} of {name[:40]!r} is not a possible device number",))
        prev = sections[current][-1][0] if sections[current] else 0
        if major < prev:
            return DeviceTable(problems=(f"major {major} ({name[:40]!r}) follows {prev}: the kernel lists majors "
                                         "in ascending order (lines shuffled)",))
        sections[current].append((major, name))
    if current != "block":
        return DeviceTable(problems=("no 'Block devices:' section: the file is cut short",))
    bad = _impossible(sections["char"])
    if bad:
        return DeviceTable(problems=(bad,))
    table = DeviceTable()
    for major, name in sections["char"]:
        table.char.setdefault(name, []).append(major)
    for major, name in sections["block"]:
        table.block.setdefault(name, []).append(major)
    return table
