"""The rooted reader: the one way gpuwarden reads a node.

A live node (`/`), a host mounted into a pod (`/host`), a captured bundle and a
built-in example are the same to every collector and rule. Failures are
returned as values, never raised, so a missing or unreadable file becomes a
gap in the report instead of a traceback.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import posixpath
import stat as stat_mod
import sys
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterator, Protocol

from msgspec import Struct
from msgspec.structs import asdict

from gpuwarden import confine
from gpuwarden.parsers import lazyre, plausible

if TYPE_CHECKING:
    from pathlib import Path

#: Hard cap on one file read: /proc and log files can be huge or endless.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
#: a bundle's manifest (meta.json): a big node's is a few MB
MAX_META_BYTES = 64 * 1024 * 1024


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


_STAT_FIELDS = frozenset(StatInfo.__struct_fields__)


def _kind_of(mode: int) -> str:
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


#: the kinds a bundle's manifest may record for a path that could not be read
MISSING_KINDS = frozenset({"missing", "denied", "error", "not-captured"})


def _missing(path: str, exc: OSError) -> Missing:
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


_PROC_ROOT = lazyre.compile(r"^/proc/(\d+|self)/root(/.*)?$")


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


_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a FIFO never blocks the open


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
        return _missing(path, exc)
    finally:
        os.close(fd)


def read_regular(path: str, max_bytes: int) -> bytes:
    """A config file: a regular file of at most max_bytes, never blocking on a FIFO or a device.

    Raises OSError (missing, denied, not a regular file) or ValueError (larger than max_bytes).
    """
    return read_capped(os.open(path, _READ_FLAGS), path, max_bytes)


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


class _TextFromBytes:
    """read_text of every root: its read_bytes, decoded (bad UTF-8 replaced, never an error)."""

    def read_text(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str | Missing:
        b = self.read_bytes(path, max_bytes)  # type: ignore[attr-defined]
        return b if isinstance(b, Missing) else b.decode("utf-8", "replace")


class _DirFd:
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


def _member_fd(base: _DirFd, name: str, flags: int) -> int:
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


def _read_member(base: _DirFd, name: str, max_bytes: int) -> bytes:
    """A regular file directly in a bundle directory, at most max_bytes (else ValueError); raises OSError."""
    return read_capped(_member_fd(base, name, _READ_FLAGS), name, max_bytes)


def _member_dir(base: _DirFd, name: str) -> _DirFd:
    """A directory directly in a bundle directory (not a link) as a _DirFd; its error says why not."""
    return _DirFd(name, lambda: _member_fd(base, name, os.O_PATH | os.O_DIRECTORY))


class HostRoot(_TextFromBytes):
    """A live filesystem, rooted at `/` or wherever the host is mounted.

    Every path is resolved beneath the root as a chroot would (gpuwarden.confine): a link in the
    tree, absolute or `../`, never reaches a file outside it, and in a pod an absolute link on the
    host (`/var/log/containers/*.log`) resolves on the host at `/host`, not in the pod.
    """

    def __init__(self, base: str = "/") -> None:
        self.base = os.path.abspath(base)
        self.label = f"live:{self.base}"
        self.live = True
        self._dir = _DirFd(self.base)  # on error the caller (cli) says "not checked"; a read answers Missing
        self._fd = self._dir.fd

    @property
    def usable(self) -> OSError | None:
        """None when the root is an open directory, else why not."""
        return self._dir.error

    def _open(self, p: str, flags: int) -> int:
        """open(2) of a normalised node path beneath the root; raises OSError."""
        rootfd = self._rootfd(p)
        m = _PROC_ROOT.match(p) if p.startswith("/proc/") else None
        if m:
            # a process's root is a magic link the kernel follows into its mount namespace: on a
            # real procfs it is the container's view of the node (its /dev), resolved as its own
            # chroot; on anything else (a copied tree) it is an ordinary link, resolved in ours
            pfd = confine.open_beneath(rootfd, f"/proc/{m.group(1)}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                if confine.is_procfs(pfd):
                    cfd = os.open("root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=pfd)
                    try:
                        return confine.open_beneath(cfd, m.group(2) or "/", flags)
                    finally:
                        os.close(cfd)
            finally:
                os.close(pfd)
        return confine.open_beneath(rootfd, p, flags)

    def _parent(self, p: str) -> tuple[int, str]:
        """(directory fd, last name) of a path, for calls that must not follow its last link."""
        parent, name = os.path.split(p)
        return self._open(parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), name

    def host_path(self, path: str) -> str:
        """Where a node path really is, resolved in the root: for a child process or a socket.

        The kernel names the file it opened (/proc/self/fd); the part of a path that does not exist
        (yet) is kept under its deepest resolved ancestor. A path that cannot be resolved inside the
        root (a magic link, a loop) gets a name that does not exist, never the unconfined join.
        """
        head, tail = norm(path), ""
        while True:
            try:
                fd = self._open(head, os.O_PATH | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR) and head != "/":
                    head, name = os.path.split(head)
                    tail = f"{name}/{tail}" if tail else name
                    continue
                break
            try:
                # the first missing name must not exist at all: a dangling link there would be followed
                # by whoever opens the returned path, on the real filesystem
                first = tail.split("/", 1)[0]
                if first:
                    try:
                        os.stat(first, dir_fd=fd, follow_symlinks=False)
                        break
                    except FileNotFoundError:
                        pass
                real = confine.real_path(fd)
            except OSError:
                break
            finally:
                os.close(fd)
            return os.path.join(real, tail) if tail else real
        return os.path.join(self.base, ".gpuwarden-unresolvable", norm(path).lstrip("/"))

    # -- side effects, each resolved beneath the root like a read (confine; docs/security.md) -----------
    def _rootfd(self, p: str) -> int:
        if self._fd is None:
            raise self._dir.error or OSError(errno.EBADF, "root is not open", p)
        return self._fd

    def write_file(self, path: str, data: bytes) -> None:
        """Replace a node file atomically (confine.write_file): never through a link; raises OSError."""
        p = norm(path)
        confine.write_file(self._rootfd(p), p, data)

    def open_socket(self, path: str) -> int:
        """An O_PATH fd of a unix socket of the node (confine.open_socket): connect to
        confine.fd_address(fd), then close it; a link or a non-socket raises OSError."""
        p = norm(path)
        return confine.open_socket(self._rootfd(p), p)

    def open_fd(self, path: str, flags: int) -> int:
        """open(2) of a node path beneath the root (a device node for a probe); raises OSError."""
        return self._open(norm(path), flags | os.O_CLOEXEC)

    def open_dir(self, path: str) -> int:
        """An O_PATH fd of a node directory, for calls relative to it (`dir_fd=`); raises OSError."""
        p = norm(path)
        return confine.open_dir(self._rootfd(p), p)

    def _open_regular(self, p: str) -> int | Missing:
        """An fd of a regular file; O_NONBLOCK: a FIFO or a character device never blocks the reader."""
        try:
            return regular_fd(self._open(p, _READ_FLAGS), p)
        except NotRegularFile:
            return Missing(p, "error", "not a regular file")
        except OSError as exc:
            return _missing(p, exc)

    def read_bytes(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes | Missing:
        p = norm(path)
        fd = self._open_regular(p)
        return fd if isinstance(fd, Missing) else read_closing(fd, p, max_bytes)

    def open_lines(self, path: str) -> Iterator[bytes] | Missing:
        fd = self._open_regular(norm(path))
        return fd if isinstance(fd, Missing) else _close_after(os.fdopen(fd, "rb"))

    def open_binary(self, path: str) -> BinaryIO | Missing:
        """A regular file for streaming reads (big logs); never blocks on a FIFO or device."""
        fd = self._open_regular(norm(path))
        return fd if isinstance(fd, Missing) else os.fdopen(fd, "rb", buffering=0)

    def listdir(self, path: str) -> list[str] | Missing:
        p = norm(path)
        try:
            fd = self._open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            return _missing(p, exc)
        try:
            return sorted(os.listdir(fd))
        except OSError as exc:
            return _missing(p, exc)
        finally:
            os.close(fd)

    def stat(self, path: str, follow: bool = True) -> StatInfo | Missing:
        p = norm(path)
        try:
            if follow or p == "/":
                fd = self._open(p, os.O_PATH | os.O_CLOEXEC)
                try:
                    st = os.fstat(fd)
                finally:
                    os.close(fd)
            else:
                dfd, name = self._parent(p)
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                finally:
                    os.close(dfd)
        except OSError as exc:
            return _missing(p, exc)
        kind = _kind_of(st.st_mode)
        dev = kind in ("chr", "blk")
        return StatInfo(
            p, kind,
            os.major(st.st_rdev) if dev else None,
            os.minor(st.st_rdev) if dev else None,
            st.st_mode, st.st_ctime, st.st_mtime, st.st_size,
        )

    def readlink(self, path: str) -> str | Missing:
        p = norm(path)
        try:
            dfd, name = self._parent(p)
            try:
                return os.readlink(name, dir_fd=dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            return _missing(p, exc)


def _close_after(f) -> Iterator[bytes]:
    with f:
        yield from f


#: a stat record's times must be a date a node can have (1970 .. 2200); anything else is garbage
_MAX_TIME = 7.3e9
_KINDS = frozenset({"chr", "blk", "dir", "file", "link", "other"})


def _stat_record(p: str, rec: object) -> StatInfo | str:
    """A manifest stat record as StatInfo, or why it is not one a filesystem could give."""
    if not isinstance(rec, dict):
        return f"not an object ({type(rec).__name__})"
    f = {k: v for k, v in rec.items() if k in _STAT_FIELDS and k != "path"}
    if f.get("kind") not in _KINDS:
        return f"kind {f.get('kind')!r} is not one of {', '.join(sorted(_KINDS))}"
    if f["kind"] in ("chr", "blk") and (f.get("major") is None or f.get("minor") is None):
        return "a device without major and minor numbers"
    # a device number the kernel's dev_t cannot hold (12-bit major, 20-bit minor) is no filesystem's
    for k, hi in (("major", plausible.MAX_MAJOR + 1), ("minor", plausible.MAX_MINOR + 1), ("mode", 1 << 16),
                  ("size", 1 << 62)):
        v = f.get(k)
        if v is not None and (type(v) is not int or not 0 <= v < hi):
            return f"{k} {v!r} is not an integer in [0, {hi})"
    for k in ("ctime", "mtime"):
        v = f.get(k)
        if v is not None and (type(v) not in (int, float) or not 0 <= v < _MAX_TIME):  # NaN fails both
            return f"{k} {v!r} is not a time between 1970 and 2200"
    return StatInfo(p, **f)


def _plain_name(n: object) -> bool:
    return isinstance(n, str) and n not in ("", ".", "..") and "/" not in n and "\0" not in n


def _manifest(meta: dict) -> tuple[dict, dict, dict, dict, list[tuple[str, str]]]:
    """The manifest's tables, each entry checked for type: (stat, readlink, listdir, missing, problems).

    A manifest is written by whoever sent the bundle. An entry of the wrong type is dropped with
    the reason (the path then reads as "error", never as a fabricated fact); a key is a node path,
    normalised, so none can name anything above the bundle's root.
    """
    problems: list[tuple[str, str]] = []  # (where in meta.json, why)
    tables = []
    for name, ok in (("stat", lambda v: isinstance(v, dict)),
                     ("readlink", lambda v: isinstance(v, str) and "\0" not in v),
                     ("listdir", lambda v: isinstance(v, list) and all(_plain_name(n) for n in v)),
                     ("missing", lambda v: isinstance(v, list) and 0 < len(v) <= 2 and all(isinstance(x, str) for x in v)
                      and v[0] in MISSING_KINDS)):
        raw = meta.get(name, {})
        out: dict = {}
        if not isinstance(raw, dict):
            problems.append((f"meta.json {name}", "not an object"))
        else:
            for k, v in raw.items():
                if not ok(v) or "\0" in k:
                    problems.append((f"meta.json {name}[{k[:200]!r}]", f"invalid entry ({type(v).__name__})"))
                    out[norm(k.replace("\0", ""))] = None  # the path answers "error", not a lower layer
                else:
                    out[norm(k)] = v
        tables.append(out)
    return tables[0], tables[1], tables[2], tables[3], problems


class BundleRoot(_TextFromBytes):
    """A captured node: regular files under `files/`, the rest in `meta.json`.

    Device nodes, symlinks and directory listings cannot travel as plain files
    (or need root to recreate), so `collect` records their stat/readlink/listdir
    results in the manifest and this class answers from it. Files are opened beneath
    `files/` as beneath a chroot (gpuwarden.confine): a link in a bundle directory reads
    nothing outside it.
    """

    def __init__(self, base: str | os.PathLike[str], label: str | None = None, lower: "BundleRoot | None" = None) -> None:
        self._base = os.fspath(base) or "."  # a string: a check does not import pathlib (datafiles says why)
        self.live = False
        self.label = label or f"bundle:{self.base}"
        # the directory is opened once; meta.json and files/ are names in it, never links (a bundle
        # directory is confined as a tarball is: nothing outside it is read, docs/security.md)
        self._base_dir = _DirFd(self._base)
        #: why meta.json could not be read ("" when it was): archive.open_bundle refuses the bundle with it
        self.meta_error = ""
        self.meta: dict = {}
        try:
            doc = json.loads(_read_member(self._base_dir, "meta.json", MAX_META_BYTES))
            if isinstance(doc, dict):
                self.meta = doc
            else:
                self.meta_error = "meta.json is not a JSON object"
        except FileNotFoundError:
            self.meta_error = "no meta.json (not a gpuwarden bundle)"
        except OSError as exc:
            self.meta_error = f"meta.json is unreadable ({exc.strerror or exc})"
        except (ValueError, RecursionError) as exc:
            self.meta_error = f"meta.json is unreadable ({exc})"
        self._stats, self._links, self._listed, self._missing, self.problems = _manifest(self.meta)
        self._files_dir = _member_dir(self._base_dir, "files")
        self._files_fd = self._files_dir.fd
        if self._files_dir.error is not None and self._files_dir.error.errno == errno.ELOOP:
            self.problems.append(("files/", str(self._files_dir.error.strerror)))
        #: "dir/" -> names under it, from the stat and readlink keys (built on first listdir)
        self._children: dict[str, set[str]] | None = None
        self._children_of: tuple[int, int] = (-1, -1)
        removed = self.meta.get("remove", [])
        self._removed: tuple[str, ...] = tuple(norm(x) for x in removed if isinstance(x, str)) \
            if isinstance(removed, list) else ()
        self.overlay(lower)

    @property
    def base(self) -> Path:
        """The bundle's directory."""
        from pathlib import Path

        return Path(self._base)

    @property
    def files(self) -> Path:
        """Its `files/` directory."""
        return self.base / "files"

    def overlay(self, lower: "BundleRoot | None") -> None:
        """Lay this bundle over `lower`: an example may overlay another one ("base"), hiding some of its
        paths ("remove")."""
        self.lower = lower
        if self.lower is not None:
            merged = dict(self.lower.meta_merged)
            merged.update({k: v for k, v in self.meta.items() if k not in ("stat", "readlink", "listdir", "missing")})
            self.meta_merged = merged
        else:
            self.meta_merged = self.meta

    def _below(self, p: str) -> "BundleRoot | None":
        """The lower layer, unless this layer removed the path."""
        if self.lower is None or p in self._missing:
            return None
        if any(p == r or p.startswith(r.rstrip("/") + "/") for r in self._removed):
            return None
        return self.lower

    def host_path(self, path: str) -> str | None:
        return None

    def _gap(self, p: str) -> Missing:
        rec = self._missing.get(p)
        if rec:
            return Missing(p, rec[0], rec[1] if len(rec) > 1 else "")
        if p in self._missing:  # an entry of the wrong type
            return Missing(p, "invalid", "invalid entry in meta.json")
        return Missing(p, "missing")

    def _open(self, p: str, flags: int) -> int:
        if self._files_fd is None:
            raise FileNotFoundError(errno.ENOENT, "no files/ in this bundle", p)
        return confine.open_beneath(self._files_fd, p, flags)

    def _open_file(self, p: str) -> int | None:
        """An fd of the bundle's regular file at p, or None (not captured here: ask the layer below).

        O_NONBLOCK and a type check: a FIFO in a bundle directory must not block the reader.
        """
        try:
            return regular_fd(self._open(p, _READ_FLAGS), p)
        except OSError:
            return None

    def read_bytes(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes | Missing:
        p = norm(path)
        fd = self._open_file(p)
        if fd is None:
            low = self._below(p)
            return low.read_bytes(p, max_bytes) if low else self._gap(p)
        return read_closing(fd, p, max_bytes)

    def open_lines(self, path: str) -> Iterator[bytes] | Missing:
        p = norm(path)
        fd = self._open_file(p)
        if fd is None:
            low = self._below(p)
            return low.open_lines(p) if low else self._gap(p)
        return _close_after(os.fdopen(fd, "rb"))

    def open_binary(self, path: str) -> BinaryIO | Missing:
        p = norm(path)
        fd = self._open_file(p)
        if fd is None:
            low = self._below(p)
            return low.open_binary(p) if low else self._gap(p)
        return os.fdopen(fd, "rb", buffering=0)

    def listdir(self, path: str) -> list[str] | Missing:
        p = norm(path)
        if p in self._listed and self._listed[p] is None:
            return Missing(p, "invalid", "invalid entry in meta.json")
        names: set[str] = set()
        found = False
        try:
            fd = self._open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                names.update(os.listdir(fd))
            finally:
                os.close(fd)
            found = True
        except OSError:  # not captured as a directory here (missing, or a file)
            pass
        prefix = p.rstrip("/") + "/"
        below = self._child_index().get(prefix)
        if below:
            names.update(below)
            found = True
        listed = self._listed.get(p)
        if listed is not None:
            names.update(listed)
            found = True
        low = self._below(p)
        if low is not None:
            below = low.listdir(p)
            if not isinstance(below, Missing):
                found = True
                names.update(n for n in below if self._below(norm(f"{p}/{n}")) is not None or n in names)
        return sorted(names) if found else self._gap(p)

    def _child_index(self) -> dict[str, set[str]]:
        """For every "dir/" prefix of a stat or readlink key, the first components after it.

        One pass over the manifest instead of one per listdir: a big node's bundle records
        thousands of /proc/<pid>/fd links and /dev stats, and collectors list hundreds of dirs.
        """
        sizes = (len(self._stats), len(self._links))
        if self._children is None or sizes != self._children_of:
            idx: dict[str, set[str]] = {}
            for key in list(self._stats) + list(self._links):
                j = key.find("/")
                while 0 <= j < len(key) - 1:
                    nxt = key.find("/", j + 1)
                    idx.setdefault(key[:j + 1], set()).add(key[j + 1:nxt] if nxt >= 0 else key[j + 1:])
                    j = nxt
            self._children, self._children_of = idx, sizes
        return self._children

    def stat(self, path: str, follow: bool = True, _hops: int = 0) -> StatInfo | Missing:
        p = norm(path)
        if p in self._stats:
            rec = _stat_record(p, self._stats[p])
            return rec if isinstance(rec, StatInfo) else Missing(p, "invalid", f"bad stat record in meta.json: {rec}")
        if p in self._links:
            target = self._links[p]
            if target is None:
                return Missing(p, "invalid", "bad readlink record in meta.json")
            if not follow:
                return StatInfo(p, "link")  # as lstat(2) answers on a live node
            if _hops >= confine.MAX_LINKS:  # as the kernel's ELOOP: a link cycle in meta.json must not recurse forever
                return Missing(p, "error", "ELOOP: too many levels of symbolic links")
            # norm(): an absolute target starts at the bundle's root and ".." stops there, as in a chroot
            tgt = norm(target if target.startswith("/") else posixpath.join(posixpath.dirname(p), target))
            return self.stat(tgt, True, _hops + 1)
        try:
            fd = self._open(p, os.O_PATH | os.O_CLOEXEC)  # one open + fstat, not exists() + stat() + is_dir()
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG):
                return _missing(p, exc)
        else:
            return StatInfo(p, "dir" if stat_mod.S_ISDIR(st.st_mode) else "file", mode=st.st_mode,
                            size=st.st_size, ctime=st.st_ctime, mtime=st.st_mtime)
        low = self._below(p)
        return low.stat(p, follow) if low else self._gap(p)

    def readlink(self, path: str) -> str | Missing:
        p = norm(path)
        if p in self._links:
            t = self._links[p]
            return t if t is not None else Missing(p, "invalid", "bad readlink record in meta.json")
        low = self._below(p)
        return low.readlink(p) if low else self._gap(p)


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
