"""Active device-access check: open() a device node from inside a container's cgroup.

Definitive on cgroup v1 and v2 alike (the kernel itself decides), but it briefly
places a process in the workload's cgroup, so it runs only with --probe-access.
The child opens the host's node read-write with O_NONBLOCK and closes it at once:
no ioctl, no read, no write. EPERM means the cgroup denies it; success, ENXIO or
ENODEV mean it is allowed (the driver may still refuse for its own reasons).
"""

from __future__ import annotations

import errno
import os

from gpuwarden.probes.bounded import ChildResult, run_func


def _open_in(procs_files: list[str], paths: list[str]) -> dict[str, str]:
    """Runs in the child: join the cgroup(s), then try each node."""
    me = str(os.getpid())
    for pf in procs_files:
        with open(pf, "w") as f:
            f.write(me)
    out = {}
    for p in paths:
        try:
            fd = os.open(p, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as exc:
            out[p] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        else:
            os.close(fd)
            out[p] = "OK"
    return out


def probe(procs_files: list[str], paths: list[str], timeout: float) -> ChildResult:
    """{path: "OK" | "EPERM" | "ENXIO" | ...} as seen from inside the cgroup(s)."""
    return run_func(_open_in, procs_files, paths, timeout=timeout)


def allowed(result: str) -> bool | None:
    if result in ("OK", "ENXIO", "ENODEV", "EBUSY", "EAGAIN"):
        return True
    if result == "EPERM":
        return False
    return None  # ENOENT and others say nothing about the cgroup
