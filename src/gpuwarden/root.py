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
import stat as stat_mod
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Iterator, Protocol

#: Hard cap on one file read: /proc and log files can be huge or endless.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Missing:
    """Why a path could not be read (missing, denied, error)."""

    path: str
    kind: str  # "missing" | "denied" | "error" | "not-captured"
    detail: str = ""

    def __str__(self) -> str:
        tail = f" ({self.detail})" if self.detail else ""
        return f"{self.path}: {self.kind}{tail}"


@dataclass(frozen=True)
class StatInfo:
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
        return {k: v for k, v in self.__dict__.items() if v is not None}


_STAT_FIELDS = frozenset(StatInfo.__dataclass_fields__)


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


class HostRoot:
    """A live filesystem, rooted at `/` or wherever the host is mounted."""

    def __init__(self, base: str = "/") -> None:
        self.base = os.path.abspath(base)
        self.label = f"live:{self.base}"
        self.live = True

    def host_path(self, path: str) -> str:
        return os.path.join(self.base, norm(path).lstrip("/")) if self.base != "/" else norm(path)

    def read_bytes(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes | Missing:
        p = norm(path)
        try:
            # O_NONBLOCK: a FIFO or a character device must never block the reader.
            fd = os.open(self.host_path(p), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            return _missing(p, exc)
        try:
            st = os.fstat(fd)
            if not (stat_mod.S_ISREG(st.st_mode)):
                return Missing(p, "error", "not a regular file")
            chunks: list[bytes] = []
            left = max_bytes
            while left > 0:
                b = os.read(fd, min(left, 1 << 20))
                if not b:
                    break
                chunks.append(b)
                left -= len(b)
            return b"".join(chunks)
        except OSError as exc:
            return _missing(p, exc)
        finally:
            os.close(fd)

    def read_text(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str | Missing:
        b = self.read_bytes(path, max_bytes)
        return b if isinstance(b, Missing) else b.decode("utf-8", "replace")

    def open_lines(self, path: str) -> Iterator[bytes] | Missing:
        p = norm(path)
        try:
            # like read_bytes: opening a FIFO must not block, and only regular files are read
            fd = os.open(self.host_path(p), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            return _missing(p, exc)
        try:
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            return _missing(p, exc)
        if not stat_mod.S_ISREG(st.st_mode):
            os.close(fd)
            return Missing(p, "error", "not a regular file")
        return _close_after(os.fdopen(fd, "rb"))

    def open_binary(self, path: str) -> BinaryIO | Missing:
        """A regular file for streaming reads (big logs); never blocks on a FIFO or device."""
        p = norm(path)
        try:
            fd = os.open(self.host_path(p), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            return _missing(p, exc)
        try:
            if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                return Missing(p, "error", "not a regular file")
            return os.fdopen(fd, "rb", buffering=0)
        except OSError as exc:
            os.close(fd)
            return _missing(p, exc)

    def listdir(self, path: str) -> list[str] | Missing:
        p = norm(path)
        try:
            return sorted(os.listdir(self.host_path(p)))
        except OSError as exc:
            return _missing(p, exc)

    def stat(self, path: str, follow: bool = True) -> StatInfo | Missing:
        p = norm(path)
        try:
            st = os.stat(self.host_path(p), follow_symlinks=follow)
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
            return os.readlink(self.host_path(p))
        except OSError as exc:
            return _missing(p, exc)


def _close_after(f) -> Iterator[bytes]:
    with f:
        yield from f


class BundleRoot:
    """A captured node: regular files under `files/`, the rest in `meta.json`.

    Device nodes, symlinks and directory listings cannot travel as plain files
    (or need root to recreate), so `collect` records their stat/readlink/listdir
    results in the manifest and this class answers from it.
    """

    def __init__(self, base: str | Path, label: str | None = None, lower: "BundleRoot | None" = None) -> None:
        self.base = Path(base)
        self.files = self.base / "files"
        self.live = False
        self.label = label or f"bundle:{self.base}"
        meta_path = self.base / "meta.json"
        try:
            self.meta: dict = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            self.meta = {}
        if not isinstance(self.meta, dict):
            self.meta = {}
        self._stats: dict[str, dict] = self.meta.get("stat", {})
        self._links: dict[str, str] = self.meta.get("readlink", {})
        self._files_dir = str(self.files)
        #: "dir/" -> names under it, from the stat and readlink keys (built on first listdir)
        self._children: dict[str, set[str]] | None = None
        self._children_of: tuple[int, int] = (-1, -1)
        self._missing: dict[str, list[str]] = self.meta.get("missing", {})
        #: an example may overlay another one ("base"), hiding some of its paths ("remove")
        self.lower = lower
        self._removed: tuple[str, ...] = tuple(norm(x) for x in self.meta.get("remove", []))
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

    def _file(self, p: str) -> Path:
        return self.files / p.lstrip("/")

    def _gap(self, p: str) -> Missing:
        rec = self._missing.get(p)
        if rec:
            return Missing(p, rec[0], rec[1] if len(rec) > 1 else "")
        return Missing(p, "missing")

    def _file_str(self, p: str) -> str:
        """The bundle file of a normalised node path, as a string (cheaper than a Path per read)."""
        return self._files_dir + p

    def read_bytes(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes | Missing:
        p = norm(path)
        try:
            # os.read in bounded pieces: a buffered f.read(max_bytes) allocates max_bytes (16 MB)
            # per call, ~30 us a file; a big node's check reads thousands of small files
            fd = os.open(self._file_str(p), os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            low = self._below(p)
            return low.read_bytes(p, max_bytes) if low else self._gap(p)
        except OSError as exc:
            return _missing(p, exc)
        try:
            chunks: list[bytes] = []
            left = max_bytes if max_bytes is not None and max_bytes >= 0 else sys.maxsize
            while left > 0:
                b = os.read(fd, min(left, 1 << 20))
                if not b:
                    break
                chunks.append(b)
                left -= len(b)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        except IsADirectoryError:  # a directory opens fine; reading it fails
            low = self._below(p)
            return low.read_bytes(p, max_bytes) if low else self._gap(p)
        except OSError as exc:
            return _missing(p, exc)
        finally:
            os.close(fd)

    def read_text(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str | Missing:
        b = self.read_bytes(path, max_bytes)
        return b if isinstance(b, Missing) else b.decode("utf-8", "replace")

    def open_lines(self, path: str) -> Iterator[bytes] | Missing:
        p = norm(path)
        try:
            f = open(self._file(p), "rb")
        except OSError:
            low = self._below(p)
            return low.open_lines(p) if low else self._gap(p)
        return _close_after(f)

    def open_binary(self, path: str) -> BinaryIO | Missing:
        p = norm(path)
        try:
            return open(self._file(p), "rb", buffering=0)
        except OSError:
            low = self._below(p)
            return low.open_binary(p) if low else self._gap(p)

    def listdir(self, path: str) -> list[str] | Missing:
        p = norm(path)
        names: set[str] = set()
        found = False
        try:
            names.update(os.listdir(self._file_str(p)))
            found = True
        except OSError:  # not captured as a directory here (missing, or a file)
            pass
        prefix = p.rstrip("/") + "/"
        below = self._child_index().get(prefix)
        if below:
            names.update(below)
            found = True
        listed = self.meta.get("listdir", {}).get(p)
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
        rec = self._stats.get(p)
        if rec is not None:
            try:
                return StatInfo(**{k: v for k, v in rec.items() if k in _STAT_FIELDS})
            except (AttributeError, TypeError) as exc:
                return Missing(p, "error", f"bad stat record in meta.json: {exc}")
        if p in self._links:
            if not follow:
                return StatInfo(p, "link")  # as lstat(2) answers on a live node
            if _hops >= 40:  # as the kernel's ELOOP: a link cycle in meta.json must not recurse forever
                return Missing(p, "error", "ELOOP: too many levels of symbolic links")
            target = self._links[p]
            tgt = target if target.startswith("/") else norm(str(PurePosixPath(p).parent / target))
            return self.stat(tgt, True, _hops + 1)
        try:
            st = os.stat(self._file_str(p))  # one stat(2), not exists() + stat() + is_dir()
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
            return self._links[p]
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
