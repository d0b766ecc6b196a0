"""What every root shares: the answers (`Missing`, `StatInfo`), the Root protocol, and the one bounded read.

Failures are values, never raised, so a missing or unreadable file becomes a gap in the report
instead of a traceback.
"""

from __future__ import annotations

import errno
import os
import stat as stat_mod
import sys
from typing import BinaryIO, Callable, Iterator, Protocol

from msgspec import Struct
from msgspec.structs import asdict

#: Hard cap on one file read: /proc and log files can be huge or endless.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


class Missing(Struct, frozen=True):
    """Why a path could not be read (missing, denied, error)."""

    path: str
    kind: str  # "missing" | "denied" | "error" | "not-captured" | "invalid" (a manifest entry no node can have)
    detail: str = ""

    def __str__(self) -> str:
        tail = f" ({self.detail})" if self.detail else ""
        return f"{self.path}: {self.kind}{tail}"


class StatInfo(Struct, frozen=True):
    """The parts of stat(2) the rules use: device numbers and times."""

    path: str
    kind: str  # "chr" | "blk" | "dir" | "file" | "link" | "other"
    major: int | None = None
    minor: int | None = None
    mode: int = 0
    ctime: float = 0.0
    mtime: float = 0.0
    size: int = 0

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def kind_of(mode: int) -> str:
    if stat_mod.S_ISCHR(mode):
        return "chr"
    if stat_mod.S_ISBLK(mode):
        return "blk"
    if stat_mod.S_ISDIR(mode):
        return "dir"
    if stat_mod.S_ISREG(mode):
        return "file"
    if stat_mod.S_ISLNK(mode):
        return "link"
    return "other"


def missing_of(path: str, exc: OSError) -> Missing:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return Missing(path, "missing")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return Missing(path, "denied", exc.strerror or "")
    return Missing(path, "error", f"{errno.errorcode.get(exc.errno or 0, exc.errno)}: {exc.strerror}")


def norm(path: str) -> str:
    """Absolute, normalised node path ('/proc/meminfo')."""
    # the same as normpath(str(PurePosixPath("/") / path.lstrip("/"))), without building a path object
    # (this runs for every read); the leading "/" joined to the stripped path keeps normpath from
    # preserving a POSIX "//" prefix
    return os.path.normpath("/" + path.lstrip("/"))


class Root(Protocol):
    """What collectors may ask of a node."""

    label: str
    live: bool

    def read_text(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str | Missing: ...
    def read_bytes(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes | Missing: ...
    def listdir(self, path: str) -> list[str] | Missing: ...
    def stat(self, path: str, follow: bool = True) -> StatInfo | Missing: ...
    def readlink(self, path: str) -> str | Missing: ...
    def open_lines(self, path: str) -> Iterator[bytes] | Missing: ...
    def open_binary(self, path: str) -> BinaryIO | Missing: ...
    def host_path(self, path: str) -> str | None: ...


#: the first read's size: most files a check reads (procfs, sysfs, cgroup files) are a few KiB
READ_FIRST = 64 * 1024
READ_MAX = 1 << 20  # the largest single read; bigger files are read in pieces of this size


def read_fd(fd: int, max_bytes: int | None = DEFAULT_MAX_BYTES) -> bytes:
    """At most max_bytes of an open file, read in bounded pieces (the one read loop of every root).

    os.read in pieces, not a buffered f.read(max_bytes), which allocates max_bytes (16 MB) per call:
    a big node's check reads thousands of small files. The pieces start at READ_FIRST and double up to
    READ_MAX: os.read allocates its whole size and then shrinks it, and a 1 MiB request for every
    small file fragmented the C heap of a long-running agent (its RSS rose ~60 KiB per 100 checks
    with its Python objects flat; docs/performance.md §9).
    """
    chunks: list[bytes] = []
    left = max_bytes if max_bytes is not None and max_bytes >= 0 else sys.maxsize
    size = READ_FIRST
    while left > 0:
        b = os.read(fd, min(left, size))
        if not b:
            break
        chunks.append(b)
        left -= len(b)
        size = min(2 * size, READ_MAX)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a FIFO never blocks the open


class NotRegularFile(OSError):
    """A FIFO, a device or a directory where a file was expected: reading it could block or mean nothing."""


def regular_fd(fd: int, path: str) -> int:
    """`fd` when it is a regular file; else it is closed and NotRegularFile (EINVAL) is raised."""
    try:
        if stat_mod.S_ISREG(os.fstat(fd).st_mode):
            return fd
        exc: OSError = NotRegularFile(errno.EINVAL, "not a regular file", path)
    except OSError as err:
        exc = err
    os.close(fd)
    raise exc


def read_closing(fd: int, path: str, max_bytes: int | None) -> bytes | Missing:
    """At most max_bytes of an open regular file (read_fd), then closed: the one bounded read of
    every root; a failing read is a Missing."""
    try:
        return read_fd(fd, max_bytes)
    except OSError as exc:
        return missing_of(path, exc)
    finally:
        os.close(fd)


def read_regular(path: str, max_bytes: int) -> bytes:
    """A config file: a regular file of at most max_bytes, never blocking on a FIFO or a device.

    Raises OSError (missing, denied, not a regular file) or ValueError (larger than max_bytes).
    """
    return read_capped(os.open(path, READ_FLAGS), path, max_bytes)


def read_capped(fd: int, name: str, max_bytes: int) -> bytes:
    """All of the open file fd, which must be a regular file, then closed; ValueError past max_bytes."""
    fd = regular_fd(fd, name)
    try:
        data = read_fd(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ValueError(f"{name}: larger than {max_bytes} bytes")
    return data


class TextFromBytes:
    """read_text of every root: its read_bytes, decoded (bad UTF-8 replaced, never an error)."""

    def read_text(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str | Missing:
        b = self.read_bytes(path, max_bytes)  # type: ignore[attr-defined]
        return b if isinstance(b, Missing) else b.decode("utf-8", "replace")


class DirFd:
    """An O_PATH fd of a directory, the anchor of confined lookups; closed with its owner."""

    def __init__(self, path: str, opener: Callable[[], int] | None = None) -> None:
        self.fd: int | None = None
        self.error: OSError | None = None
        try:
            self.fd = opener() if opener else os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            self.error = exc

    def __del__(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


def close_after(f) -> Iterator[bytes]:
    with f:
        yield from f


def member_fd(base: DirFd, name: str, flags: int) -> int:
    """An fd of `name` directly in a bundle directory: never a link (ELOOP with a message that says so)."""
    if base.fd is None:
        raise base.error or FileNotFoundError(errno.ENOENT, "bundle directory is not open", name)
    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=base.fd)
    try:
        if stat_mod.S_ISLNK(os.fstat(fd).st_mode):
            raise OSError(errno.ELOOP, f"{name} is a symbolic link: not followed (a bundle is read only "
                                       "beneath its own directory)", name)
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=base.fd)
    finally:
        os.close(fd)


def read_member(base: DirFd, name: str, max_bytes: int) -> bytes:
    """A regular file directly in a bundle directory, at most max_bytes (else ValueError); raises OSError."""
    return read_capped(member_fd(base, name, READ_FLAGS), name, max_bytes)


def member_dir(base: DirFd, name: str) -> DirFd:
    """A directory directly in a bundle directory (not a link) as a DirFd; its error says why not."""
    return DirFd(name, lambda: member_fd(base, name, os.O_PATH | os.O_DIRECTORY))
