"""Memory pressure as the kernel sees it: PSI triggers on the node and on the kubepods cgroup.

A trigger ("some 150000 1000000": tasks stalled on memory 150 ms within a second) is written to a
pressure file opened beneath the root, and the fd is polled for POLLPRI: the kernel wakes us when the
stall crosses it, at most once per window, and never while the node is healthy. Where the agent may not
set a sub-2 s window (no CAP_SYS_RESOURCE in the init user namespace: the kernel answers EINVAL), the
unprivileged form ("some 500000 2000000") is used. POLLERR means the cgroup went away: that file is dropped.
"""

from __future__ import annotations

import os
import select
import time
from typing import Any

from gpuwarden import confine
from gpuwarden.wake.base import Emit, Wake
from gpuwarden.wake.poller import Polled

TRIGGERS = (b"some 150000 1000000\0", b"some 500000 2000000\0")
#: the node's memory pressure, then the kubepods cgroup's (cgroup v2, systemd or cgroupfs driver; hybrid)
PRESSURE_FILES = ("/proc/pressure/memory", "/sys/fs/cgroup/kubepods.slice/memory.pressure",
                  "/sys/fs/cgroup/kubepods/memory.pressure", "/sys/fs/cgroup/unified/kubepods.slice/memory.pressure",
                  "/sys/fs/cgroup/unified/kubepods/memory.pressure")


class PsiSource(Polled):
    name = "psi"

    def __init__(self, root: Any, paths: tuple[str, ...] = PRESSURE_FILES, clock: Any = time.time) -> None:
        self.root = root
        self.paths = paths
        self.clock = clock
        self.fds: dict[int, str] = {}
        self.triggers: dict[str, str] = {}  # path -> the trigger set there
        self._emit: Emit | None = None
        self.why: list[str] = []

    def start(self, emit: Emit) -> str | None:
        if not getattr(self.root, "live", False) or not hasattr(self.root, "open_fd"):
            return "not a live root"
        for p in self.paths:
            fd = self._arm(p)
            if fd is not None:
                self.fds[fd] = p
        if not self.fds:
            return "no PSI trigger could be set: " + "; ".join(self.why)
        self._emit = emit
        self._listen((fd, select.POLLPRI, lambda ev, fd=fd: self._ready(fd, ev)) for fd in self.fds)
        return None

    def _arm(self, path: str) -> int | None:
        try:
            fd = self.root.open_fd(path, os.O_RDWR | os.O_NONBLOCK)
        except OSError as exc:
            self.why.append(f"{path}: {exc.strerror or exc}")
            return None
        # a trigger is written only to the kernel's own pressure file: on a node tree (a copy) the same path
        # is a regular file, and writing there would change the tree
        if not (confine.is_procfs(fd) or confine.is_cgroupfs(fd)):
            os.close(fd)
            self.why.append(f"{path}: not the kernel's pressure file (procfs or cgroupfs)")
            return None
        last: OSError | None = None
        for trig in TRIGGERS:
            try:
                os.write(fd, trig)
                self.triggers[path] = trig.rstrip(b"\0").decode()
                return fd
            except OSError as exc:
                last = exc
        os.close(fd)
        self.why.append(f"{path}: trigger refused ({last.strerror if last else ''})")
        return None

    def _ready(self, fd: int, ev: int) -> None:
        path = self.fds.get(fd, "")
        if ev & (select.POLLERR | select.POLLNVAL | select.POLLHUP):
            # the cgroup was removed (or its trigger destroyed): that file is dropped, the periodic check remains
            assert self._poller is not None
            self._poller.drop(fd)
            self.fds.pop(fd, None)
            os.close(fd)
            if not self.fds:
                self._poller.failed = f"{path}: the pressure file went away, no trigger is left"
            return
        if ev & select.POLLPRI and self._emit is not None:
            self._emit(Wake(self.name, "memory", f"memory pressure crossed {self.triggers.get(path, '')} ({path})",
                            self.clock()))

    def stop(self) -> None:
        self._unlisten()
        for fd in list(self.fds):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()

