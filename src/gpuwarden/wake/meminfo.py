"""MemAvailable falling fast: the wake-up of incident 4 before the node feels any pressure.

PSI triggers fire only once tasks stall on memory; a node with 100 GiB free stalls on nothing while a
driver leak takes 40 GiB a minute, and a quarter of it is gone before the next 60 s check (run 20's
issue-41 scenario, on the H200). The kernel has no notification for MemAvailable itself, so this source
reads /proc/meminfo once a second (one pread of a kept fd, tens of microseconds) and wakes the memory
topic when MemAvailable fell by at least `min_drop_bytes` within the last `window_s` seconds, at the
agent's growth threshold or faster. The check decides what it is: a pod allocating legitimately is
charged to its cgroup and is no finding. While falls go on, the wakes come 2, 4, 8 ... s apart (at
most `repeat_max_s`): by the second one the agent's own fast memory sampling follows a leak, and a tenant
that allocates and frees large buffers all day costs a memory check every half minute, not every second.
After `calm_s` without a fast fall the spacing starts again at `repeat_s`. Nothing is ever written.
"""

from __future__ import annotations

import collections
import os
import stat
import time
from typing import Any, Deque

from gpuwarden.parsers import meminfo
from gpuwarden.wake.base import Emit, Wake
from gpuwarden.wake.poller import Polled, Poller

MiB = 1 << 20
#: how much of /proc/meminfo is read (it is about 1.5 KiB on today's kernels)
READ_MAX = 16384


class MemDropSource(Polled):
    name = "meminfo"

    def __init__(self, root: Any, growth_bytes_per_min: int = 1 << 30, period_s: float = 1.0, window_s: float = 5.0,
                 min_drop_bytes: int = 256 * MiB, repeat_s: float = 1.0, repeat_max_s: float = 30.0,
                 calm_s: float = 60.0, clock: Any = time.time, mono: Any = time.monotonic) -> None:
        self.root = root
        self.growth_per_s = max(1, int(growth_bytes_per_min)) / 60.0
        self.period_s = max(0.05, float(period_s))
        self.window_s = max(self.period_s, float(window_s))
        self.min_drop = max(1, int(min_drop_bytes))
        self.repeat_s = float(repeat_s)
        self.repeat_max_s = max(self.repeat_s, float(repeat_max_s))
        self.calm_s = float(calm_s)
        self.spacing = self.repeat_s  # the least time to the next wake; doubles while falls keep coming
        self.last_fall = -1e18
        self.clock = clock  # the Wake's `seen` (epoch), the start of the fault-seen -> raised latency
        self.mono = mono  # the window's time: a wall-clock step is no drop
        self.fd = -1
        self.seen: Deque[tuple[float, int]] = collections.deque(maxlen=max(2, int(self.window_s / self.period_s) + 2))
        self.last_wake = -1e18
        self.wakes = 0
        self.reads = 0
        self.skipped = ""  # the last sample refused (garbage or impossible values), for the agent's log
        self._emit: Emit | None = None

    def start(self, emit: Emit) -> str | None:
        if not hasattr(self.root, "open_fd"):
            return "this root has no files to read"
        try:
            self.fd = self.root.open_fd("/proc/meminfo", os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            return f"/proc/meminfo: {exc.strerror or exc}"
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):  # a FIFO or device planted in a tree is never read
            os.close(self.fd)
            self.fd = -1
            return "/proc/meminfo: not a regular file"
        self._emit = emit
        self._poller = Poller(self.name, pace_s=0)
        self._poller.idle = (int(self.period_s * 1000), self.tick)
        self._poller.start()
        return None

    def read(self) -> int | None:
        """MemAvailable in bytes, or None for a file that is not a kernel's (cut, garbage, impossible)."""
        try:
            raw = os.pread(self.fd, READ_MAX, 0)
        except OSError as exc:
            self.skipped = f"/proc/meminfo: {exc.strerror or exc}"
            return None
        info = meminfo.parse(raw.decode("ascii", "replace"))
        avail = info.get("MemAvailable")
        why = meminfo.impossible(info.values) or ("" if avail is not None else "no MemAvailable")
        if why:
            self.skipped = f"/proc/meminfo: {why}"
            return None
        return avail

    def tick(self) -> None:
        """One reading; a wake when MemAvailable fell fast enough within the window."""
        avail = self.read()
        self.reads += 1
        if avail is None:
            return
        now = self.mono()
        self.seen.append((now, avail))
        while self.seen and now - self.seen[0][0] > self.window_s:
            self.seen.popleft()
        t0, top = max(self.seen, key=lambda x: x[1])
        drop, dt = top - avail, now - t0
        if drop < self.min_drop or dt <= 0 or drop / dt < self.growth_per_s:
            return
        if now - self.last_fall > self.calm_s:
            self.spacing = self.repeat_s  # a new episode after a calm spell
        self.last_fall = now
        if now - self.last_wake < self.spacing or self._emit is None:
            return
        self.spacing = min(self.spacing * 2, self.repeat_max_s)
        self.last_wake = now
        self.wakes += 1
        self._emit(Wake(self.name, "memory", f"MemAvailable fell {drop / MiB:.0f} MiB in {dt:.1f} s "
                                             f"({drop / dt * 60 / (1 << 30):.1f} GiB/min)", self.clock()))

    def stop(self) -> None:
        self._unlisten()
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1
