"""The `dev_char` fact: the host's /dev/char/M:m links that point at NVIDIA device nodes, and what they point at.

runc (systemd cgroup driver) allows a device through its /dev/char link; a link left from before a
module reload points at a node with another major, or at none (GPU-DEV-003, GPU-DEV-004). Every
NVIDIA link is kept, whatever its major: a stale one has a major the driver no longer uses.
"""

from __future__ import annotations

import re

from msgspec import Struct

from gpuwarden.facts.node import NodeFacts, fact
from gpuwarden.root import Missing, StatInfo

DEV_CHAR = "/dev/char"


class CharLink(Struct, frozen=True):
    """A /dev/char link and whether it points at the device it names."""
    link: str  # /dev/char/M:m
    numbers: tuple[int, int] | None  # (M, m) from the link's name
    target: str  # as the link says
    #: (major, minor) of the node it resolves to under /dev (None: not a device, or unknown)
    target_numbers: tuple[int | None, int | None]
    target_unread: str = ""  # why the target could not be stat'ed ("missing": it does not exist)


@fact("dev_char")
def collect_dev_char(facts: NodeFacts) -> list[CharLink]:
    names = facts.root.listdir(DEV_CHAR)
    out: list[CharLink] = []
    for n in ([] if isinstance(names, Missing) else names):
        link = f"{DEV_CHAR}/{n}"
        target = facts.root.readlink(link)
        if not isinstance(target, str) or "nvidia" not in target:
            continue
        m = re.fullmatch(r"([0-9]+):([0-9]+)", n)
        tpath = target if target.startswith("/") else "/dev/" + target.split("../", 1)[-1].lstrip("/")
        st = facts.root.stat(tpath)
        numbers = (int(m.group(1)), int(m.group(2))) if m else None
        if isinstance(st, StatInfo):
            out.append(CharLink(link, numbers, target, (st.major, st.minor)))
        else:
            out.append(CharLink(link, numbers, target, (None, None), st.kind))
    return out
