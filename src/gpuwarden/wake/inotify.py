"""inotify through libc (ctypes): no dependency, a non-blocking fd, watches added beneath the root.

A watch is added on `/proc/self/fd/N` of a directory fd the root opened (`root.open_dir`: resolved
beneath the root, never through a link out of it), so inotify watches exactly the directory the
checks read. The fd is read in slices of at most READ_BYTES; IN_Q_OVERFLOW (the kernel dropped events)
is reported as such: the caller then asks for one full check instead of trusting the events.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
from typing import Iterator

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

#: what changes a directory's meaning for the rules: entries come, go, are replaced or rewritten
DIR_EVENTS = (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ATTRIB
              | IN_DELETE_SELF | IN_MOVE_SELF)
#: a followed log file also grows
LOG_EVENTS = DIR_EVENTS | IN_MODIFY
#: a directory of device nodes: entries made, removed or renamed (not closed after a write: every user of a GPU does that)
NODE_EVENTS = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF

READ_BYTES = 64 * 1024
_HEADER = struct.Struct("iIII")


class Event(tuple):
    """(wd, mask, name) of one inotify event."""

    __slots__ = ()

    @property
    def wd(self) -> int:
        return self[0]

    @property
    def mask(self) -> int:
        return self[1]

    @property
    def name(self) -> str:
        return self[2]


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        return lib
    except (OSError, AttributeError):
        return None


class Inotify:
    """One inotify instance; `fd` is non-blocking. Raises OSError where inotify is not available."""

    def __init__(self) -> None:
        self._lib = _libc()
        if self._lib is None:
            raise OSError(errno.ENOSYS, "inotify is not available (no libc inotify_init1)")
        fd = self._lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_init1: {os.strerror(e)}")
        self.fd = fd

    def watch_fd(self, dirfd: int, mask: int) -> int:
        """Watch the directory open as `dirfd` (an O_PATH fd beneath the root); returns the watch descriptor."""
        wd = self._lib.inotify_add_watch(self.fd, f"/proc/self/fd/{dirfd}".encode(), mask | IN_ONLYDIR)  # type: ignore[union-attr]
        if wd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        return wd

    def read(self) -> Iterator[Event]:
        """The events ready now (one read of at most READ_BYTES); none when nothing is pending."""
        try:
            buf = os.read(self.fd, READ_BYTES)
        except BlockingIOError:
            return
        i = 0
        while i + _HEADER.size <= len(buf):
            wd, mask, _cookie, n = _HEADER.unpack_from(buf, i)
            raw = buf[i + _HEADER.size: i + _HEADER.size + n]
            i += _HEADER.size + n
            yield Event((wd, mask, raw.split(b"\0", 1)[0].decode("utf-8", "replace")))

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            finally:
                self.fd = -1
