"""Open a path beneath a directory as if that directory were `/` (chroot semantics, no chroot).

A node's tree is not ours: a bundle comes from a customer, `/host` holds links written by every
container runtime on the node (`/var/log/containers/*.log` are absolute links meant for the host),
and a crafted tree may link to `/etc/shadow` or `../../`. Resolving such a link on the reader's own
filesystem reads the wrong file at best and leaks one at worst. So every path is resolved the way
the kernel resolves it inside a chroot: an absolute link starts again at the root, `..` never climbs
above it, and magic links (`/proc/<pid>/fd/*`, `/proc/<pid>/root`) are not followed.

The same resolution confines every side effect on a node (docs/security.md): a write goes to an
exclusive temporary file in a directory resolved beneath the root, then is renamed within it
(write_file); a unix socket is connected through an fd of the socket itself, opened without following
a link (open_socket, fd_address); what a kill acts through is opened beneath the root too
(remediation/localkill.py), on a filesystem checked to be the kernel's (fs_magic).

Linux >= 5.6 does exactly this in one call: openat2(2) with RESOLVE_IN_ROOT. Where it is missing
(older kernel, a seccomp profile that refuses it) the same walk is done one component at a time
with O_PATH|O_NOFOLLOW, each link read and re-walked from the root, at most MAX_LINKS of them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import posixpath
import stat as stat_mod

#: the kernel's own bound on links followed in one lookup (ELOOP beyond it)
MAX_LINKS = 40
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_SYS_OPENAT2 = 437  # the same number on every architecture (added after the syscall table unification)
_PROC_SUPER_MAGIC = 0x9FA0
#: statfs f_type of the kernel's cgroup filesystems (linux/magic.h): v2, and v1's hierarchies
CGROUP2_SUPER_MAGIC = 0x63677270
CGROUP_SUPER_MAGIC = 0x27E0EB
#: openat2 answers EAGAIN when a rename raced the lookup of ".."; it is safe to retry
_RETRIES = 8


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
    _libc.syscall.restype = ctypes.c_long
except OSError:  # pragma: no cover - no libc to call (not Linux)
    _libc = None


def _openat2(dirfd: int, path: str, flags: int) -> int:
    assert _libc is not None
    how = _OpenHow(flags, 0, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
    raw = os.fsencode(path)
    for _ in range(_RETRIES):
        fd = _libc.syscall(_SYS_OPENAT2, ctypes.c_int(dirfd), ctypes.c_char_p(raw), ctypes.byref(how),
                           ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


def _probe_openat2() -> bool:
    """Whether openat2 works here (kernel >= 5.6 and not refused by seccomp)."""
    if _libc is None or not hasattr(os, "O_PATH"):
        return False
    try:
        fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:  # pragma: no cover
        return False
    try:
        os.close(_openat2(fd, ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        return True
    except OSError:  # ENOSYS on old kernels, EPERM under some seccomp profiles
        return False
    finally:
        os.close(fd)


#: set once per process; tests flip it to exercise the fallback on a kernel that has openat2
USE_OPENAT2 = _probe_openat2()


def _walk(rootfd: int, path: str, flags: int) -> int:
    """The portable equivalent of openat2(RESOLVE_IN_ROOT): one component at a time."""
    todo = [c for c in path.split("/") if c and c != "."]
    stack: list[int] = []  # directories below the root, deepest last
    links = 0
    try:
        while todo:
            name = todo.pop(0)
            cur = stack[-1] if stack else rootfd
            if name == "..":
                if stack:
                    os.close(stack.pop())
                continue
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur)
            st = os.fstat(fd)
            if stat_mod.S_ISLNK(st.st_mode) and not (not todo and flags & os.O_NOFOLLOW):
                os.close(fd)
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                target = os.readlink(name, dir_fd=cur)
                if target.startswith("/"):
                    while stack:
                        os.close(stack.pop())
                todo[:0] = [c for c in target.split("/") if c and c != "."]
                continue
            if not todo:  # the last component, not a link to follow: open it for real
                os.close(fd)  # O_NOFOLLOW: a link swapped in since the fstat is not followed either
                return os.open(name, flags | os.O_NOFOLLOW, dir_fd=cur)
            if not stat_mod.S_ISDIR(st.st_mode):
                os.close(fd)
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            stack.append(fd)
        return os.open(".", flags, dir_fd=stack[-1] if stack else rootfd)
    finally:
        for fd in stack:
            os.close(fd)


def open_beneath(rootfd: int, path: str, flags: int) -> int:
    """open(2) `path` with `rootfd` as `/`; raises OSError like open(2) (ELOOP past MAX_LINKS)."""
    rel = path.lstrip("/") or "."
    if USE_OPENAT2:
        return _openat2(rootfd, rel, flags)
    return _walk(rootfd, rel, flags)


def fs_magic(fd: int) -> int | None:
    """The filesystem type (statfs f_type) of what fd refers to; None when it cannot be told."""
    if _libc is None:
        return None
    buf = ctypes.create_string_buffer(256)
    if _libc.fstatfs(ctypes.c_int(fd), buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value


def is_procfs(fd: int) -> bool:
    """Whether fd lies on a procfs (its /proc/<pid>/root links are the kernel's, not a tree's)."""
    return fs_magic(fd) == _PROC_SUPER_MAGIC


def is_cgroupfs(fd: int) -> bool:
    """Whether fd lies on the kernel's cgroup filesystem (v1 or v2), not on a copy of one."""
    return fs_magic(fd) in (CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC)


def real_path(fd: int) -> str:
    """The kernel's name of what fd refers to (how a child process or a socket reaches it)."""
    return os.readlink(f"/proc/self/fd/{fd}")


# -- side effects: every write, connect and kill under a root resolves like a read ------------------

_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC if hasattr(os, "O_PATH") else 0


def _split(path: str) -> tuple[str, str]:
    """(parent, last name) of a path normalised as a node path; the name is "" for the root itself."""
    return posixpath.split(posixpath.normpath("/" + path.lstrip("/")))


def open_dir(rootfd: int, path: str, create: bool = False, mode: int = 0o755) -> int:
    """An O_PATH fd of the directory `path` beneath rootfd (resolved as open_beneath resolves).

    With `create`, missing directories are made one at a time with mkdirat in their parent's fd; a
    name that exists but is not a directory (a dangling link included) is not made, never followed.
    """
    try:
        return open_beneath(rootfd, path, _DIR_FLAGS)
    except FileNotFoundError:
        if not create:
            raise
    parent, name = _split(path)
    if not name:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    pfd = open_dir(rootfd, parent, create, mode)
    try:
        try:
            os.mkdir(name, mode, dir_fd=pfd)
        except FileExistsError:  # made meanwhile, or a link whose target is missing: opened without following
            pass
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=pfd)
    finally:
        os.close(pfd)


def write_file(rootfd: int, path: str, data: bytes, mode: int = 0o644, create_dirs: bool = True) -> None:
    """Replace the file `path` beneath rootfd with `data`, atomically; raises OSError.

    The directory is resolved in the root (open_dir); the data goes to a new temporary file in it,
    created O_EXCL|O_NOFOLLOW under a random name (nothing planted there is opened), fsynced, then
    renamed over `path` within that directory fd: a link at `path` is replaced, never written through.
    """
    parent, name = _split(path)
    if not name:
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    dfd = open_dir(rootfd, parent, create_dirs)
    try:
        # os.urandom is what secrets.token_hex reads; importing secrets loads hashlib and random (~8 ms)
        tmp = f".{name[:200]}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
    finally:
        os.close(dfd)


def open_socket(rootfd: int, path: str) -> int:
    """An O_PATH fd of the unix socket `path` beneath rootfd, to connect to at fd_address(fd); raises OSError.

    The directory is resolved in the root; the socket itself must be one, not a link (ELOOP) nor
    anything else (ENOTSOCK): connect(2) by name would follow a link on the real filesystem. The fd
    pins the inode, so what is connected to is what was checked.
    """
    parent, name = _split(path)
    dfd = open_beneath(rootfd, parent, _DIR_FLAGS)
    try:
        fd = os.open(name or ".", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    finally:
        os.close(dfd)
    mode = os.fstat(fd).st_mode
    if not stat_mod.S_ISSOCK(mode):
        os.close(fd)
        if stat_mod.S_ISLNK(mode):
            raise OSError(errno.ELOOP, "a symbolic link, not connected to", path)
        raise OSError(errno.ENOTSOCK, "not a unix socket", path)
    return fd


def fd_address(fd: int) -> str:
    """The unix-socket address of an open_socket fd: connect(2) reaches the very inode the fd holds
    (also in a forked child, which inherits the fd under the same number)."""
    return f"/proc/self/fd/{fd}"
