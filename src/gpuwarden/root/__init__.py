"""The rooted reader: the one way gpuwarden reads a node.

A live node (`/`), a host mounted into a pod (`/host`), a captured bundle and a built-in example are
the same to every collector and rule: `base` (the answers, the protocol, the one bounded read),
`host` (the live node), `manifest` (a bundle's meta.json, typed) and `bundle` (a captured node).
Failures are returned as values, never raised, so a missing or unreadable file becomes a gap in the
report instead of a traceback.
"""

from __future__ import annotations

import fnmatch

from gpuwarden.root.base import (DEFAULT_MAX_BYTES, Missing, NotRegularFile, Root, StatInfo, norm, read_capped,
                                 read_closing, read_fd, read_regular, regular_fd)
from gpuwarden.root.bundle import BundleRoot
from gpuwarden.root.host import HostRoot
from gpuwarden.root.manifest import MAX_META_BYTES, MISSING_KINDS, Manifest

__all__ = ["DEFAULT_MAX_BYTES", "MAX_META_BYTES", "MISSING_KINDS", "BundleRoot", "HostRoot", "Manifest", "Missing",
           "NotRegularFile", "Root", "StatInfo", "glob", "norm", "read_capped", "read_closing", "read_fd",
           "read_regular", "regular_fd"]


def glob(root: Root, pattern: str) -> list[str]:
    """Expand a glob one path component at a time through the root."""
    parts = [x for x in norm(pattern).split("/") if x]
    paths = ["/"]
    for part in parts:
        nxt: list[str] = []
        for base in paths:
            if any(c in part for c in "*?["):
                names = root.listdir(base)
                if isinstance(names, Missing):
                    continue
                nxt.extend(norm(f"{base}/{n}") for n in names if fnmatch.fnmatchcase(n, part))
            else:
                nxt.append(norm(f"{base}/{part}"))
        paths = nxt
    return sorted(paths)
