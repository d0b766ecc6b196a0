"""Active device-access check: open() a device node from inside a container's cgroup.

Definitive on cgroup v1 and v2 alike (the kernel itself decides), but it briefly
places a process in the workload's cgroup, so it runs only with --probe-access.
The child opens the host's node read-write with O_NONBLOCK and closes it at once:
no ioctl, no read, no write. EPERM means the cgroup denies it; success, ENXIO or
ENODEV mean it is allowed (the driver may still refuse for its own reasons).

Both side effects are confined to the node's root (docs/security.md): each cgroup directory is
opened beneath it and must lie on the kernel's cgroup filesystem, `cgroup.procs` is opened in that
directory fd without following a link, and each device node is opened beneath the root.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from gpuwarden import confine
from gpuwarden.probes.bounded import ChildResult, run_func


def _join(root: Any, cgroup_dir: str) -> None:
    """Move this process into the cgroup at the node path `cgroup_dir`; raises OSError."""
    dfd = root.open_dir(cgroup_dir)
    try:
        if not confine.is_cgroupfs(dfd):
            raise OSError(errno.EXDEV, "not on the kernel's cgroup filesystem (not a live node)", cgroup_dir)
        fd = os.open("cgroup.procs", os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    finally:
        os.close(dfd)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)


def _open_in(root: Any, cgroup_dirs: list[str], paths: list[str]) -> dict[str, str]:
    """Runs in the child: join the cgroup(s), then try each node (node paths under the live root)."""
    for d in cgroup_dirs:
        _join(root, d)
    out = {}
    for p in paths:
        try:
            fd = root.open_fd(p, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as exc:
            out[p] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        else:
            os.close(fd)
            out[p] = "OK"
    return out


def probe(root: Any, cgroup_dirs: list[str], paths: list[str], timeout: float) -> ChildResult:
    """{node path: "OK" | "EPERM" | "ENXIO" | ...} as seen from inside the cgroup(s) (node paths of the
    live root `root`, a HostRoot)."""
    return run_func(_open_in, root, cgroup_dirs, paths, timeout=timeout)


def allowed(result: str) -> bool | None:
    if result in ("OK", "ENXIO", "ENODEV", "EBUSY", "EAGAIN"):
        return True
    if result == "EPERM":
        return False
    return None  # ENOENT and others say nothing about the cgroup
