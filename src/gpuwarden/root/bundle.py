"""A captured node: a bundle directory or a built-in example, laid over the one it names (`base`)."""

from __future__ import annotations

import errno
import os
import posixpath
import stat as stat_mod
from typing import TYPE_CHECKING, BinaryIO, Iterator

from gpuwarden import confine
from gpuwarden.root.base import (READ_FLAGS, DEFAULT_MAX_BYTES, DirFd, Missing, StatInfo, TextFromBytes, close_after,
                                 member_dir, missing_of, norm, read_closing, regular_fd)
from gpuwarden.root.manifest import Manifest, read_meta

if TYPE_CHECKING:
    from pathlib import Path


class BundleRoot(TextFromBytes):
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
        self._base_dir = DirFd(self._base)
        #: meta.json, and why it could not be read ("" when it was): archive.open_bundle refuses the bundle with it
        self.meta, self.meta_error = read_meta(self._base_dir)
        self.manifest = Manifest(self.meta)
        #: the manifest's invalid entries, then a files/ that is a link: (where, why), each a gap of the report
        self.problems = list(self.manifest.problems)
        self._stats, self._links = self.manifest.stats, self.manifest.links
        self._listed, self._missing = self.manifest.listed, self.manifest.missing
        self._files_dir = member_dir(self._base_dir, "files")
        self._files_fd = self._files_dir.fd
        if self._files_dir.error is not None and self._files_dir.error.errno == errno.ELOOP:
            self.problems.append(("files/", str(self._files_dir.error.strerror)))
        #: "dir/" -> names under it, from the stat and readlink keys (built on first listdir)
        self._children: dict[str, set[str]] | None = None
        self._children_of: tuple[int, int] = (-1, -1)
        self._removed = self.manifest.removed
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
        """What the manifest recorded for a path this layer does not hold (or "invalid"), else missing."""
        return self._missing.get(p) or Missing(p, "missing")

    def _open(self, p: str, flags: int) -> int:
        if self._files_fd is None:
            raise FileNotFoundError(errno.ENOENT, "no files/ in this bundle", p)
        return confine.open_beneath(self._files_fd, p, flags)

    def _open_file(self, p: str) -> int | None:
        """An fd of the bundle's regular file at p, or None (not captured here: ask the layer below).

        O_NONBLOCK and a type check: a FIFO in a bundle directory must not block the reader.
        """
        try:
            return regular_fd(self._open(p, READ_FLAGS), p)
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
        return close_after(os.fdopen(fd, "rb"))

    def open_binary(self, path: str) -> BinaryIO | Missing:
        p = norm(path)
        fd = self._open_file(p)
        if fd is None:
            low = self._below(p)
            return low.open_binary(p) if low else self._gap(p)
        return os.fdopen(fd, "rb", buffering=0)

    def listdir(self, path: str) -> list[str] | Missing:
        p = norm(path)
        listed = self._listed.get(p)
        if isinstance(listed, Missing):
            return listed
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
            return rec
        if p in self._links:
            target = self._links[p]
            if isinstance(target, Missing):
                return target
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
                return missing_of(p, exc)
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
