"""At most two glibc malloc arenas for the agent, as `MALLOC_ARENA_MAX=2` would set at start.

glibc gives a thread that allocates while the other arenas are busy an arena of its own, up to eight
per CPU. The agent starts short-lived threads every check (a probe's reader, a /metrics request),
and on the GPU hosts (16 and 32 CPUs, up to 20 threads at once) each check touched new pages in such
arenas: the agent's RSS rose 48-104 KiB per 100 checks, all anonymous memory, with Python's own heap
flat (docs/performance.md §9). `mallopt(M_ARENA_MAX)` limits the arenas made from then on, so the
agent calls it before its first thread. An operator's `MALLOC_ARENA_MAX` is left as it is; a C
library without `mallopt` (or one that ignores it, as musl does) is left alone too.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 2


def limit_arenas(libc: Any = None, env: dict[str, str] | None = None) -> bool:
    """Set glibc's arena limit to ARENAS unless MALLOC_ARENA_MAX is set: whether it was set now."""
    if "MALLOC_ARENA_MAX" in (os.environ if env is None else env):
        return False
    try:
        lib = libc if libc is not None else ctypes.CDLL(None)  # the process's own C library
        mallopt = lib.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, ARENAS))
