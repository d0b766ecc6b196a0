"""The live node's root (`/`, or `/host` in a pod): every path resolved beneath it as a chroot would."""

from __future__ import annotations

import errno
import os
from typing import BinaryIO, Callable, Iterator

from gpuwarden import confine
from gpuwarden.parsers import lazyre
from gpuwarden.root.base import (READ_FLAGS, DEFAULT_MAX_BYTES, DirFd, Missing, NotRegularFile, StatInfo,
                                 TextFromBytes, close_after, kind_of, missing_of, norm, read_closing, regular_fd)

_PROC_ROOT = lazyre.compile(r"^/proc/(\d+|self)/root(/.*)?$")


#: the inode of the initial PID namespace (PROC_PID_INIT_INO, include/linux/proc_ns.h): fixed by the kernel
_INIT_PID_NS_INO = 0xEFFFFFFC


class HostRoot(TextFromBytes):
    """A live filesystem, rooted at `/` or wherever the host is mounted.

    Every path is resolved beneath the root as a chroot would (gpuwarden.confine): a link in the
    tree, absolute or `../`, never reaches a file outside it, and in a pod an absolute link on the
    host (`/var/log/containers/*.log`) resolves on the host at `/host`, not in the pod.
    """

    def __init__(self, base: str = "/") -> None:
        self.base = os.path.abspath(base)
        self.label = f"live:{self.base}"
        self.live = True
        self._dir = DirFd(self.base)  # on error the caller (cli) says "not checked"; a read answers Missing
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

    def node_identity(self) -> str:
        """"" when this root is the running system's own root, else why not (or why it cannot be told).

        A copied tree is a live root too, but what its files show about processes (a socket nobody
        listens on) says nothing about a process of this machine. The root is the node's when its
        `/proc` is the kernel's procfs, of the initial PID namespace (the whole process table: its
        `self/ns/pid` has the kernel's fixed inode, which a procfs of a container's namespace cannot
        show us under `self`), and init's root (`/proc/1/root`) or ours (`/proc/self/root`) is this
        very directory: `/` on the node, `/host` in a pod with the host's PID namespace.
        """
        flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
        try:
            pfd = confine.open_beneath(self._rootfd("/"), "/proc", flags)
        except OSError as exc:
            return f"its /proc cannot be opened: {exc.strerror or exc}"
        try:
            if not confine.is_procfs(pfd):
                return "its /proc is not the kernel's procfs: a copied tree"
            try:
                if os.stat("self/ns/pid", dir_fd=pfd).st_ino != _INIT_PID_NS_INO:
                    return "its /proc is not the initial PID namespace's: not the node's whole process table"
            except OSError as exc:
                return f"/proc/self/ns/pid cannot be read: {exc.strerror or exc}"
            mine = os.fstat(self._rootfd("/"))
            for pid in ("1", "self"):  # the kernel's magic links (a real procfs: checked above)
                try:
                    st = os.stat(f"{pid}/root", dir_fd=pfd)
                except OSError:
                    continue  # /proc/1/root needs ptrace access to init
                if (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino):
                    return ""
            return f"{self.base} is the root of neither init nor this process (/proc/1/root, /proc/self/root): a copied tree"
        finally:
            os.close(pfd)

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
            return regular_fd(self._open(p, READ_FLAGS), p)
        except NotRegularFile:
            return Missing(p, "error", "not a regular file")
        except OSError as exc:
            return missing_of(p, exc)

    def read_bytes(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes | Missing:
        p = norm(path)
        fd = self._open_regular(p)
        return fd if isinstance(fd, Missing) else read_closing(fd, p, max_bytes)

    def open_lines(self, path: str) -> Iterator[bytes] | Missing:
        fd = self._open_regular(norm(path))
        return fd if isinstance(fd, Missing) else close_after(os.fdopen(fd, "rb"))

    def open_binary(self, path: str) -> BinaryIO | Missing:
        """A regular file for streaming reads (big logs); never blocks on a FIFO or device."""
        fd = self._open_regular(norm(path))
        return fd if isinstance(fd, Missing) else os.fdopen(fd, "rb", buffering=0)

    def listdir(self, path: str) -> list[str] | Missing:
        p = norm(path)
        try:
            fd = self._open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            return missing_of(p, exc)
        try:
            return sorted(os.listdir(fd))
        except OSError as exc:
            return missing_of(p, exc)
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
            return missing_of(p, exc)
        kind = kind_of(st.st_mode)
        dev = kind in ("chr", "blk")
        return StatInfo(
            p, kind,
            os.major(st.st_rdev) if dev else None,
            os.minor(st.st_rdev) if dev else None,
            st.st_mode, st.st_ctime, st.st_mtime, st.st_size,
        )

    def readlinks(self, path: str, choose: Callable[[list[str]], list[str]] | None = None) -> dict[str, str] | Missing:
        """The link targets of one directory's entries (a /proc/<pid>/fd table), the directory opened once
        beneath the root: listed through that fd, `choose` (given the sorted names) picks which to read, each
        read with readlinkat, never followed; an entry gone meanwhile or not a link is left out. Nothing but
        the directory is resolved (its entries are plain names)."""
        p = norm(path)
        try:
            fd = self._open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            return missing_of(p, exc)
        out: dict[str, str] = {}
        try:
            try:
                names = sorted(os.listdir(fd))
            except OSError as exc:
                return missing_of(p, exc)
            for name in (choose(names) if choose is not None else names):
                try:
                    out[name] = os.readlink(name, dir_fd=fd)
                except OSError:
                    continue
        finally:
            os.close(fd)
        return out

    def readlink(self, path: str) -> str | Missing:
        p = norm(path)
        try:
            dfd, name = self._parent(p)
            try:
                return os.readlink(name, dir_fd=dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            return missing_of(p, exc)
