"""The kernel log of a node tree (a `--root` copy, a captured node): its log files followed through inotify.

Where /dev/kmsg is not the kernel's device, the checks read the captured kernel log instead
(`.gpuwarden/logs/kmsg.txt`, `/var/log/kern.log`, the kernel lines of `/var/log/messages` …): the same
files are watched here, through directory fds opened beneath the root. On a write, what the file gained
since the last look is read (at most READ_CAP bytes, through the root, never through a link) and a line
holding a kernel signature's anchor wakes the agent; a file replaced, truncated or grown past READ_CAP
in one go wakes it unread (the check reads the file whole).
"""

from __future__ import annotations

import os
import re
import select
import stat
import time
from typing import Any, Callable

from gpuwarden.wake.base import Emit, Wake, clip
from gpuwarden.wake.inotify import IN_Q_OVERFLOW, LOG_EVENTS, Inotify
from gpuwarden.wake.kmsg import kernel_words
from gpuwarden.wake.poller import Polled

#: the kernel logs the checks read on a node tree (facts/logs.py CANDIDATES["kernel"], files only)
KERNEL_LOGS = ("/.gpuwarden/logs/kernel.log", "/.gpuwarden/logs/kmsg.txt", "/.gpuwarden/logs/dmesg.txt",
               "/var/log/kern.log", "/var/log/messages", "/var/log/syslog")
READ_CAP = 1 << 20


class LogFileSource(Polled):
    name = "logfile"
    #: makes the inotify instance (bench/fleet_sim.py's thousands of agents share one instance and thread)
    new_inotify: Callable[[], Inotify] = Inotify

    def __init__(self, root: Any, paths: tuple[str, ...] = KERNEL_LOGS, clock: Any = time.time,
                 words: re.Pattern[bytes] | None = None) -> None:
        self.root = root
        self.paths = paths
        self.clock = clock
        self._ino: Inotify | None = None
        self._emit: Emit | None = None
        self._names: dict[int, dict[str, str]] = {}  # wd -> file name -> node path
        self._end: dict[str, tuple[tuple[int, int], int]] = {}  # node path -> (ident, where the last look stopped)
        #: what wakes the agent (the kernel signatures' anchors; the bench's benign marker)
        self._words = words or kernel_words()
        self.watched: list[str] = []

    def start(self, emit: Emit) -> str | None:
        if not hasattr(self.root, "open_dir"):
            return "this root has no directories to watch (a built-in example does not change)"
        try:
            self._ino = self.new_inotify()
        except OSError as exc:
            return str(exc.strerror or exc)
        dirs: dict[str, dict[str, str]] = {}
        for p in self.paths:
            d, n = os.path.split(p)
            dirs.setdefault(d, {})[n] = p
        for d, names in dirs.items():
            try:
                dfd = self.root.open_dir(d)
            except OSError:
                continue  # not on this node: nothing to follow there
            try:
                wd = self._ino.watch_fd(dfd, LOG_EVENTS)
            except OSError:
                continue
            finally:
                os.close(dfd)
            self._names.setdefault(wd, {}).update(names)
            self.watched.extend(sorted(names.values()))
            for p in names.values():
                self._end[p] = self._size(p)
        if not self._names:
            self._ino.close()
            return "no kernel log directory on this root (" + ", ".join(sorted(dirs)) + ")"
        self._emit = emit
        self._listen([(self._ino.fd, select.POLLIN, self._ready)])
        return None

    def _size(self, path: str) -> tuple[tuple[int, int], int]:
        try:
            fd = self.root.open_fd(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return (0, 0), 0
        try:
            st = os.fstat(fd)
            return (st.st_dev, st.st_ino), st.st_size
        finally:
            os.close(fd)

    def _ready(self, _ev: int) -> None:
        changed: set[str] = set()
        assert self._ino is not None
        for e in self._ino.read():
            if e.mask & IN_Q_OVERFLOW:
                self._wake("inotify queue overflowed: the kernel log is checked whole")
                return
            p = self._names.get(e.wd, {}).get(e.name)
            if p:
                changed.add(p)
        for p in sorted(changed):
            self._look(p)

    def _look(self, path: str) -> None:
        ident, end = self._end.get(path, ((0, 0), 0))
        try:
            fd = self.root.open_fd(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            self._end[path] = ((0, 0), 0)
            return  # removed or moved away: a new file wakes us when it appears
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return  # a FIFO or a device planted in a tree is never read
            now_ident = (st.st_dev, st.st_ino)
            if now_ident != ident or st.st_size < end:
                end = 0  # replaced or truncated: what is there is new
            grew = st.st_size - end
            self._end[path] = (now_ident, st.st_size)
            if grew <= 0:
                return
            if grew > READ_CAP:
                self._wake(f"{path} grew by {grew} bytes at once: the check reads it whole")
                return
            data = os.pread(fd, grew, end)
        finally:
            os.close(fd)
        m = self._words.search(data)
        if m:
            a = data.rfind(b"\n", 0, m.start()) + 1
            b = data.find(b"\n", m.end())
            self._wake(data[a: b if b >= 0 else len(data)])

    def _wake(self, detail: str | bytes) -> None:
        if self._emit is not None:
            self._emit(Wake(self.name, "log", clip(detail), self.clock()))

    def stop(self) -> None:
        self._unlisten()
        if self._ino is not None:
            self._ino.close()
            self._ino = None
