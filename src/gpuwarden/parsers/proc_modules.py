"""/proc/modules: loaded kernel modules."""

from __future__ import annotations

from msgspec import Struct

from gpuwarden.parsers import plausible


class Module(Struct, frozen=True):
    """One line of /proc/modules."""
    name: str
    size: int
    refcount: int
    used_by: tuple[str, ...]
    state: str


def parse(text: str) -> dict[str, Module]:
    out: dict[str, Module] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) < 5 or not plausible.decimal(f[1]):
            continue
        ref = int(f[2]) if plausible.decimal(f[2].lstrip("-")) else -1
        used = tuple(x for x in f[3].strip(",").split(",") if x and x != "-")
        out[f[0]] = Module(f[0], int(f[1]), ref, used, f[4])
    return out
