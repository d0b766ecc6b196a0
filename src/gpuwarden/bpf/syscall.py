"""Read the device programs attached to a cgroup v2 directory, straight from the bpf(2) syscall.

There is no file to read on cgroup v2 (no devices.list); the policy is whatever programs the
kernel holds for BPF_CGROUP_DEVICE.  This module asks the kernel for their ids (directly
attached or effective, i.e. including ancestors) and for each program's translated
("xlated") instructions: the code the kernel actually runs after verification, which can
differ from what the runtime submitted.  ctypes only; every call is non-blocking.
"""

from __future__ import annotations

import ctypes
import errno as E
import os
import platform

from msgspec import Struct

from gpuwarden.bpf.insn import Insn, decode

# bpf(2) commands
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_QUERY = 16

BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6  # attach type

BPF_F_ALLOW_OVERRIDE = 1 << 0
BPF_F_ALLOW_MULTI = 1 << 1
BPF_F_QUERY_EFFECTIVE = 1 << 0

_SYS_BPF = {"x86_64": 321, "amd64": 321, "aarch64": 280, "arm64": 280, "riscv64": 280,
            "ppc64le": 361, "ppc64": 361, "s390x": 351, "i686": 357, "i386": 357, "armv7l": 386}

_CMD_NAMES = {BPF_PROG_LOAD: "BPF_PROG_LOAD", BPF_PROG_ATTACH: "BPF_PROG_ATTACH",
              BPF_PROG_DETACH: "BPF_PROG_DETACH", BPF_PROG_GET_FD_BY_ID: "BPF_PROG_GET_FD_BY_ID",
              BPF_OBJ_GET_INFO_BY_FD: "BPF_OBJ_GET_INFO_BY_FD", BPF_PROG_QUERY: "BPF_PROG_QUERY"}


class BpfError(OSError):
    """A bpf(2) call failed; ``errno`` and ``command`` say which and why."""

    def __init__(self, err: int, command: str, detail: str = "") -> None:
        msg = f"{command}: {os.strerror(err)}" + (f" ({detail})" if detail else "")
        super().__init__(err, msg)
        self.command = command
        self.detail = detail


class BpfPermissionError(BpfError, PermissionError):
    """EPERM/EACCES: needs root (CAP_SYS_ADMIN for ids, CAP_NET_ADMIN for queries) or an LSM refused."""


class BpfNotFoundError(BpfError, FileNotFoundError):
    """ENOENT: the program id is gone (detached and freed between query and open)."""


class BpfUnsupportedError(BpfError):
    """EINVAL/ENOSYS/EOPNOTSUPP/EBADF: this kernel or this target has no cgroup-device BPF."""


_ERRNO_CLASS = {E.EPERM: BpfPermissionError, E.EACCES: BpfPermissionError, E.ENOENT: BpfNotFoundError,
                E.EINVAL: BpfUnsupportedError, E.ENOSYS: BpfUnsupportedError,
                E.EOPNOTSUPP: BpfUnsupportedError, 524: BpfUnsupportedError,  # ENOTSUPP (kernel-internal)
                E.EBADF: BpfUnsupportedError}


def _error(err: int, cmd: int, detail: str = "") -> BpfError:
    name = _CMD_NAMES.get(cmd, f"bpf cmd {cmd}")
    if err == E.EBADF and not detail:
        detail = "target is not a cgroup v2 directory (or the fd is stale)"
    if err == E.EINVAL and not detail:
        detail = "kernel lacks this command/attach type, or rejected the attributes"
    return _ERRNO_CLASS.get(err, BpfError)(err, name, detail)


_libc: ctypes.CDLL | None = None


def sys_bpf_number(machine: str | None = None) -> int:
    m = (machine or platform.machine()).lower()
    try:
        return _SYS_BPF[m]
    except KeyError:
        raise BpfUnsupportedError(E.ENOSYS, "bpf", f"no known bpf syscall number for {m!r}") from None


def bpf(cmd: int, attr: ctypes.Structure) -> int:
    """Issue bpf(cmd, &attr, sizeof(attr)); returns the result or raises a typed BpfError."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    ret = _libc.syscall(ctypes.c_long(sys_bpf_number()), ctypes.c_int(cmd), ctypes.byref(attr),
                        ctypes.c_uint(ctypes.sizeof(attr)))
    if ret < 0:
        raise _error(ctypes.get_errno(), cmd)
    return int(ret)


# -- bpf_attr variants (prefixes of the kernel union; the kernel zero-fills the rest) ----------


class _QueryAttr(ctypes.Structure):
    _fields_ = [("target_fd", ctypes.c_uint32), ("attach_type", ctypes.c_uint32),
                ("query_flags", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32),
                ("prog_ids", ctypes.c_uint64), ("prog_cnt", ctypes.c_uint32), ("_pad", ctypes.c_uint32)]


class _GetFdByIdAttr(ctypes.Structure):
    _fields_ = [("prog_id", ctypes.c_uint32), ("next_id", ctypes.c_uint32), ("open_flags", ctypes.c_uint32)]


class _InfoAttr(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32), ("info", ctypes.c_uint64)]


class _ProgInfo(ctypes.Structure):
    """struct bpf_prog_info up to attach_btf_obj_id (kernel 5.16+ layout; older kernels fill less)."""

    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32), ("tag", ctypes.c_uint8 * 8),
                ("jited_prog_len", ctypes.c_uint32), ("xlated_prog_len", ctypes.c_uint32),
                ("jited_prog_insns", ctypes.c_uint64), ("xlated_prog_insns", ctypes.c_uint64),
                ("load_time", ctypes.c_uint64), ("created_by_uid", ctypes.c_uint32),
                ("nr_map_ids", ctypes.c_uint32), ("map_ids", ctypes.c_uint64),
                ("name", ctypes.c_char * 16), ("ifindex", ctypes.c_uint32), ("gpl_compatible", ctypes.c_uint32),
                ("netns_dev", ctypes.c_uint64), ("netns_ino", ctypes.c_uint64),
                ("nr_jited_ksyms", ctypes.c_uint32), ("nr_jited_func_lens", ctypes.c_uint32),
                ("jited_ksyms", ctypes.c_uint64), ("jited_func_lens", ctypes.c_uint64),
                ("btf_id", ctypes.c_uint32), ("func_info_rec_size", ctypes.c_uint32),
                ("func_info", ctypes.c_uint64), ("nr_func_info", ctypes.c_uint32),
                ("nr_line_info", ctypes.c_uint32), ("line_info", ctypes.c_uint64),
                ("jited_line_info", ctypes.c_uint64), ("nr_jited_line_info", ctypes.c_uint32),
                ("line_info_rec_size", ctypes.c_uint32), ("jited_line_info_rec_size", ctypes.c_uint32),
                ("nr_prog_tags", ctypes.c_uint32), ("prog_tags", ctypes.c_uint64),
                ("run_time_ns", ctypes.c_uint64), ("run_cnt", ctypes.c_uint64),
                ("recursion_misses", ctypes.c_uint64), ("verified_insns", ctypes.c_uint32),
                ("attach_btf_obj_id", ctypes.c_uint32)]


# -- results --------------------------------------------------------------------------------


class AttachedPrograms(Struct, frozen=True):
    """Program ids the kernel reports for BPF_CGROUP_DEVICE on one cgroup.

    Effective ids are in run order (this cgroup's, then its ancestors'); ``attach_flags``
    (BPF_F_ALLOW_MULTI/OVERRIDE) is only reported for a direct query.
    """

    cgroup: str
    effective: bool
    attach_flags: int
    prog_ids: tuple[int, ...]


class ProgInfo(Struct, frozen=True):
    """One loaded program as the kernel describes it; ``xlated`` is the code it runs."""

    id: int
    type: int
    name: str
    tag: str  # hex of the kernel's 8-byte program tag
    xlated: bytes
    jited_len: int = 0
    load_time_ns: int = 0  # since boot
    created_by_uid: int = 0
    gpl_compatible: bool = False
    verified_insns: int = 0
    insns: tuple[Insn, ...] = ()

    @property
    def is_device_program(self) -> bool:
        return self.type == BPF_PROG_TYPE_CGROUP_DEVICE


# -- calls ----------------------------------------------------------------------------------


def _open_cgroup(cgroup_dir: str | os.PathLike[str]) -> int:
    return os.open(os.fspath(cgroup_dir), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def query_cgroup_device(cgroup_dir: str | os.PathLike[str], *, effective: bool = True) -> AttachedPrograms:
    """BPF_PROG_QUERY for BPF_CGROUP_DEVICE: first the count, then the ids (retrying if it grew)."""
    fd = _open_cgroup(cgroup_dir)
    try:
        flags = BPF_F_QUERY_EFFECTIVE if effective else 0
        attr = _QueryAttr(target_fd=fd, attach_type=BPF_CGROUP_DEVICE, query_flags=flags)
        bpf(BPF_PROG_QUERY, attr)
        for _ in range(8):
            count = attr.prog_cnt
            if count == 0:
                return AttachedPrograms(os.fspath(cgroup_dir), effective, attr.attach_flags, ())
            ids = (ctypes.c_uint32 * count)()
            attr = _QueryAttr(target_fd=fd, attach_type=BPF_CGROUP_DEVICE, query_flags=flags,
                              prog_ids=ctypes.addressof(ids), prog_cnt=count)
            try:
                bpf(BPF_PROG_QUERY, attr)
            except BpfError as exc:
                if exc.errno == E.ENOSPC:  # more programs appeared meanwhile; attr.prog_cnt has the new count
                    continue
                raise
            got = min(attr.prog_cnt, count)
            return AttachedPrograms(os.fspath(cgroup_dir), effective, attr.attach_flags, tuple(ids[:got]))
        raise BpfError(E.ENOSPC, "BPF_PROG_QUERY", "program list kept changing")
    finally:
        os.close(fd)


def prog_fd_by_id(prog_id: int) -> int:
    """BPF_PROG_GET_FD_BY_ID (CAP_SYS_ADMIN); the caller closes the fd."""
    return bpf(BPF_PROG_GET_FD_BY_ID, _GetFdByIdAttr(prog_id=prog_id))


def prog_info(fd: int) -> ProgInfo:
    """BPF_OBJ_GET_INFO_BY_FD twice: once for the sizes, once to fetch the xlated instructions."""
    first = _ProgInfo()
    attr = _InfoAttr(bpf_fd=fd, info_len=ctypes.sizeof(first), info=ctypes.addressof(first))
    bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    size = first.xlated_prog_len
    if size == 0:
        # Every program has code; a zero length means the kernel hides it (caller lacks CAP_BPF/CAP_SYS_ADMIN).
        raise BpfPermissionError(E.EPERM, "BPF_OBJ_GET_INFO_BY_FD", f"kernel withheld the code of program {first.id}")
    second = _ProgInfo()
    buf = (ctypes.c_uint8 * size)()
    second.xlated_prog_len = size
    second.xlated_prog_insns = ctypes.addressof(buf)
    attr = _InfoAttr(bpf_fd=fd, info_len=ctypes.sizeof(second), info=ctypes.addressof(second))
    bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    if second.xlated_prog_insns == 0:
        # Constant-blinded programs (net.core.bpf_jit_harden) are only dumped when kptr_restrict allows it;
        # otherwise the kernel clears the pointer and leaves our buffer untouched.
        raise BpfPermissionError(E.EPERM, "BPF_OBJ_GET_INFO_BY_FD",
                                 f"kernel withheld the blinded code of program {second.id}")
    got = min(second.xlated_prog_len, size)
    xlated = bytes(buf[:got])
    return ProgInfo(
        id=second.id,
        type=second.type,
        name=second.name.decode("utf-8", "replace"),
        tag=bytes(second.tag).hex(),
        xlated=xlated,
        jited_len=second.jited_prog_len,
        load_time_ns=second.load_time,
        created_by_uid=second.created_by_uid,
        gpl_compatible=bool(second.gpl_compatible & 1),
        verified_insns=second.verified_insns,
        insns=tuple(decode(xlated)),
    )


def read_program(prog_id: int) -> ProgInfo:
    fd = prog_fd_by_id(prog_id)
    try:
        return prog_info(fd)
    finally:
        os.close(fd)


def read_cgroup_device_programs(
    cgroup_dir: str | os.PathLike[str], *, effective: bool = True
) -> list[ProgInfo]:
    """The device programs in force for a cgroup, in kernel run order.

    A program can be detached and freed between the query and the open (runtimes replace
    programs at container start); that shows as ENOENT and the whole read is retried.
    """
    for attempt in range(3):
        ids = query_cgroup_device(cgroup_dir, effective=effective).prog_ids
        try:
            return [read_program(i) for i in ids]
        except BpfNotFoundError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")  # pragma: no cover
