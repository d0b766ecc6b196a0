"""Device programs of the shapes real runtimes generate, plus load/attach helpers and a kernel probe.

The builders reproduce the instruction sequences (not the code) of:

* runc's devicefilter (libcontainer/cgroups/devices, v1.1.x): a prologue loading type/access/
  major/minor into r2..r5, then one block per rule -- type, access subset, major, minor, each
  a ``JNE`` to the next block -- ending in ``r0 = allow; exit``; the program's tail returns
  the default (deny for allow-lists, allow for deny-lists).  First matching block decides.
* systemd's bpf-devices (src/core/bpf-devices.c): same prologue but the access check comes
  first, every entry ends in ``goto PASS``, entries only ever allow; the tail is
  ``r0 = 0; goto +1; r0 = 1; exit`` (or just ``r0 = 0; exit`` for DevicePolicy=strict with no
  entries).  systemd's skips the access check for ``rwm`` and has device/major/class entries.
* libnvidia-container's nvcgo (src/nvcgo/internal/cgroup/ebpf.go): NOT a separate program --
  a single extra ALLOW_MULTI program could only ever take permissions away.  For every
  device program already attached it builds ``prefix + <that program's xlated code>``,
  attaches the result (ALLOW_MULTI) and detaches the original.  The prefix loads r2..r5
  (type with a 16-bit narrow load), returns 1 for its own rules (checked from the last rule
  to the first) and otherwise falls through into the original code, whose own prologue
  reloads the ctx.  Current nvcgo uses r6 as scratch for the access check; an earlier
  revision used r2, clobbering the device type so that later blocks never match a "rw"
  request: ``temp_reg=2`` reproduces it.

Importable from the repo root: ``from tests.support.devprog import ...`` (run with the repo
root on sys.path, e.g. ``python -m pytest`` or ``PYTHONPATH=.:src``).
"""

from __future__ import annotations

import ctypes
import errno as E
import json
import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from gpuwarden.bpf import insn as I
from gpuwarden.bpf.evaluate import (
    ACC_MKNOD, ACC_READ, ACC_WRITE, DEV_BLOCK, DEV_CHAR, DeviceRequest, access_mask,
)
from gpuwarden.bpf.insn import Insn
from gpuwarden.bpf.syscall import (
    BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI, BPF_PROG_ATTACH, BPF_PROG_DETACH, BPF_PROG_LOAD,
    BPF_PROG_TYPE_CGROUP_DEVICE, BpfError, bpf,
)

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
NVIDIA_MODESET_MINOR = 254
UVM_MAJOR = 509  # dynamic: 509 on current drivers/kernels, 238-ish on older ones
UVM_MAJOR_OLD = 238
RWM = ACC_READ | ACC_WRITE | ACC_MKNOD

# -- rules and their reference semantics -------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A devices.allow/deny-style line: ``c 195:* rw``; None major/minor is ``*``."""

    type: str  # "c" | "b" | "a"
    major: int | None
    minor: int | None
    access: str
    allow: bool = True

    @classmethod
    def parse(cls, text: str, allow: bool = True) -> "Rule":
        typ, nums, access = text.split()
        major, minor = nums.split(":")
        return cls(typ, None if major == "*" else int(major), None if minor == "*" else int(minor), access, allow)

    def matches(self, req: DeviceRequest) -> bool:
        """Type equal (or 'a'), numbers equal or wildcard, requested access a subset of ours."""
        if self.type != "a" and self.type != req.dev_type:
            return False
        if self.major is not None and self.major != req.major:
            return False
        if self.minor is not None and self.minor != req.minor:
            return False
        return access_mask(req.access) & ~access_mask(self.access) == 0

    def __str__(self) -> str:
        star = lambda v: "*" if v is None else str(v)  # noqa: E731
        return f"{'' if self.allow else '!'}{self.type} {star(self.major)}:{star(self.minor)} {self.access}"


def rules(*lines: str, allow: bool = True) -> tuple[Rule, ...]:
    return tuple(Rule.parse(line, allow) for line in lines)


def first_match(rule_list: Sequence[Rule], req: DeviceRequest, default: bool) -> bool:
    for r in rule_list:
        if r.matches(req):
            return r.allow
    return default


# -- a tiny assembler with labels ---------------------------------------------------------------


class Asm:
    def __init__(self) -> None:
        self._items: list[tuple[Insn, str | None]] = []
        self._labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self._labels[name] = len(self._items)

    def emit(self, code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0, to: str | None = None) -> None:
        self._items.append((Insn(0, code, dst, src, off, imm), to))

    def extend(self, insns: Iterable[Insn]) -> None:
        for ins in insns:
            self._items.append((ins, None))

    def assemble(self) -> list[Insn]:
        out = I.reindex(ins for ins, _ in self._items)
        ends = [ins.index for ins in out] + [out[-1].next_index if out else 0]
        for pos, (_, to) in enumerate(self._items):
            if to is None:
                continue
            target_slot = ends[self._labels[to]]
            ins = out[pos]
            out[pos] = Insn(ins.index, ins.code, ins.dst, ins.src, target_slot - ins.index - 1, ins.imm, ins.wide)
        return out

    # encodings used below
    def ldx(self, size: int, dst: int, src: int, off: int) -> None:
        self.emit(I.LDX | I.MODE_MEM | size, dst, src, off)

    def alu32(self, op: int, dst: int, imm: int | None = None, src: int | None = None) -> None:
        if src is None:
            self.emit(I.ALU | op | I.SRC_K, dst, imm=imm or 0)
        else:
            self.emit(I.ALU | op | I.SRC_X, dst, src)

    def mov64_imm(self, dst: int, imm: int) -> None:
        self.emit(I.ALU64 | I.OP_MOV | I.SRC_K, dst, imm=imm)

    def jne_imm(self, dst: int, imm: int, to: str) -> None:
        self.emit(I.JMP | I.OP_JNE | I.SRC_K, dst, imm=imm, to=to)

    def jne_reg(self, dst: int, src: int, to: str, *, jmp32: bool = False) -> None:
        self.emit((I.JMP32 if jmp32 else I.JMP) | I.OP_JNE | I.SRC_X, dst, src, to=to)

    def ja(self, to: str | None = None, off: int = 0) -> None:
        self.emit(I.JMP | I.OP_JA, off=off, to=to)

    def exit(self) -> None:
        self.emit(I.JMP | I.OP_EXIT)


def _bpf_type(t: str) -> int:
    return {"c": DEV_CHAR, "b": DEV_BLOCK}[t]


# -- (a) runc devicefilter --------------------------------------------------------------------


def runc_program(rule_list: Sequence[Rule], default_allow: bool = False) -> list[Insn]:
    """runc v1.1 devicefilter for an already "clean" rule list (no 'a' rules)."""
    a = Asm()
    a.ldx(I.SIZE_W, 2, 1, 0)
    a.alu32(I.OP_AND, 2, 0xFFFF)
    a.ldx(I.SIZE_W, 3, 1, 0)
    a.alu32(I.OP_RSH, 3, 16)
    a.ldx(I.SIZE_W, 4, 1, 4)
    a.ldx(I.SIZE_W, 5, 1, 8)
    for n, r in enumerate(rule_list):
        if r.type not in ("c", "b"):
            raise ValueError(f"runc emits no block for type {r.type!r}")
        nxt = f"block-{n + 1}"
        a.jne_imm(2, _bpf_type(r.type), nxt)
        acc = access_mask(r.access)
        if acc != RWM:
            a.alu32(I.OP_MOV, 1, src=3)  # r1 (ctx) is free once the prologue ran
            a.alu32(I.OP_AND, 1, acc)
            a.jne_reg(1, 3, nxt)
        if r.major is not None:
            a.jne_imm(4, r.major, nxt)
        if r.minor is not None:
            a.jne_imm(5, r.minor, nxt)
        a.alu32(I.OP_MOV, 0, 1 if r.allow else 0)
        a.exit()
        a.label(nxt)
    a.alu32(I.OP_MOV, 0, 1 if default_allow else 0)
    a.exit()
    return a.assemble()


# -- (b) systemd bpf-devices ------------------------------------------------------------------


def systemd_program(entries: Sequence[Rule], *, deny_everything: bool = False) -> list[Insn]:
    """systemd's allow-list program: entries are device (maj:min), major (maj:*) or class (*:*)."""
    a = Asm()
    if not deny_everything:
        a.ldx(I.SIZE_W, 2, 1, 0)
        a.alu32(I.OP_AND, 2, 0xFFFF)
        a.ldx(I.SIZE_W, 3, 1, 0)
        a.alu32(I.OP_RSH, 3, 16)
        a.ldx(I.SIZE_W, 4, 1, 4)
        a.ldx(I.SIZE_W, 5, 1, 8)
        for n, r in enumerate(entries):
            if not r.allow or r.type not in ("c", "b"):
                raise ValueError(f"systemd only emits allow entries for c/b, got {r}")
            if r.major is None and r.minor is not None:
                raise ValueError("systemd has no '*:minor' entries")
            nxt = f"entry-{n + 1}"
            acc = access_mask(r.access)
            if acc != RWM:
                a.alu32(I.OP_MOV, 1, src=3)
                a.alu32(I.OP_AND, 1, acc)
                a.jne_reg(1, 3, nxt)
            a.jne_imm(2, _bpf_type(r.type), nxt)
            if r.major is not None:
                a.jne_imm(4, r.major, nxt)
            if r.minor is not None:
                a.jne_imm(5, r.minor, nxt)
            a.ja("pass")
            a.label(nxt)
        a.mov64_imm(0, 0)
        a.ja(off=1)
        a.label("pass")
    a.mov64_imm(0, 0 if deny_everything else 1)
    a.exit()
    return a.assemble()


# -- (c) libnvidia-container nvcgo prefix -----------------------------------------------------


def nvidia_prepend(rule_list: Sequence[Rule], original: Sequence[Insn], *, temp_reg: int = 6) -> list[Insn]:
    """nvcgo's PrependDeviceFilter: its rule blocks (last rule first), then ``original`` verbatim."""
    prefix = f"nv-{uuid.uuid4().hex[:8]}"
    a = Asm()
    a.ldx(I.SIZE_H, 2, 1, 0)  # type: narrow 16-bit load of access_type
    a.ldx(I.SIZE_W, 3, 1, 0)
    a.alu32(I.OP_RSH, 3, 16)
    a.ldx(I.SIZE_W, 4, 1, 4)
    a.ldx(I.SIZE_W, 5, 1, 8)
    block = 0
    for r in reversed(rule_list):
        nxt = f"{prefix}-{block + 1}"
        has_type = r.type != "a"
        acc = access_mask(r.access)
        if has_type:
            a.jne_imm(2, _bpf_type(r.type), nxt)
        if acc != RWM:
            a.alu32(I.OP_MOV, temp_reg, src=3)
            a.alu32(I.OP_AND, temp_reg, acc)
            a.jne_reg(temp_reg, 3, nxt, jmp32=True)
        if r.major is not None:
            a.jne_imm(4, r.major, nxt)
        if r.minor is not None:
            a.jne_imm(5, r.minor, nxt)
        a.alu32(I.OP_MOV, 0, 1 if r.allow else 0)
        a.exit()
        a.label(nxt)
        block += 1
        if not has_type and acc == RWM and r.major is None and r.minor is None:
            break  # nvcgo ignores everything after a full wildcard
    a.extend(original)
    return a.assemble()


def add_device_rules(cgroup_dir: str | os.PathLike[str], rule_list: Sequence[Rule]) -> list[int]:
    """What libnvidia-container's hook does on cgroup v2 (src/nvcgo/internal/cgroup/v2.go AddDeviceRules):
    for each program attached to the cgroup, a new one that is `nvidia_prepend(rules, its code)` (the code
    read back as the kernel keeps it, as cilium/ebpf's ProgramInfo.Instructions() does); then every old
    program detached and the new ones attached (BPF_F_ALLOW_MULTI; no BPF_F_REPLACE: it runs before the
    container starts). With no program attached, one of its rules followed by `return` (r0 as it is).
    Returns the new programs' ids."""
    from gpuwarden.bpf.insn import decode
    from gpuwarden.bpf.syscall import prog_fd_by_id, prog_info, query_cgroup_device, read_program

    old = query_cgroup_device(cgroup_dir, effective=False).prog_ids
    bases = [decode(read_program(i).xlated) for i in old] if old else [[Insn(0, I.JMP | I.OP_EXIT, 0, 0, 0, 0)]]
    new = [load_program(nvidia_prepend(rule_list, base), name="nvc_devices") for base in bases]
    try:
        for pid in old:
            fd = prog_fd_by_id(pid)
            try:
                detach(cgroup_dir, fd)
            finally:
                os.close(fd)
        for fd in new:
            attach(cgroup_dir, fd, multi=True)
        return [prog_info(fd).id for fd in new]
    finally:
        for fd in new:
            os.close(fd)


def nvidia_reference(rule_list: Sequence[Rule], original: Callable[[DeviceRequest], bool]) -> Callable[[DeviceRequest], bool]:
    def allows(req: DeviceRequest) -> bool:
        for r in reversed(rule_list):
            if r.matches(req):
                return r.allow
        return original(req)

    return allows


# -- scenarios shared by fixtures, unit tests, live tests and GPU-machine scripts --------------

RUNC_DEFAULT = rules(
    "c *:* m", "b *:* m", "c 1:3 rwm", "c 1:8 rwm", "c 1:7 rwm", "c 5:0 rwm", "c 1:5 rwm",
    "c 1:9 rwm", "c 136:* rwm", "c 5:2 rwm", "c 10:200 rwm",
)
GPU_DEVICES = rules(
    f"c {NVIDIA_MAJOR}:{NVIDIACTL_MINOR} rw", f"c {NVIDIA_MAJOR}:{NVIDIA_MODESET_MINOR} rw",
    f"c {NVIDIA_MAJOR}:0 rw", f"c {NVIDIA_MAJOR}:1 rw", f"c {UVM_MAJOR}:0 rw", f"c {UVM_MAJOR}:1 rw",
)
SYSTEMD_CLOSED = rules(
    "c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", "c 5:0 rwm", "c 5:2 rwm",
    "c 136:* rw", "c *:* m", "b *:* m",
)


@dataclass(frozen=True)
class Scenario:
    """A program of one real shape plus the rule-list semantics it was built from."""

    name: str
    doc: str
    build: Callable[[Sequence[Insn] | None], list[Insn]]  # argument: base program code (nvidia only)
    allows: Callable[[DeviceRequest], bool]  # what the rules mean (the reference)
    base: str | None = None  # scenario whose kernel-xlated code an nvidia prefix wraps
    license: str = "Apache"
    known_bug: str = ""  # set when the program is known NOT to implement `allows`


def _runc(name: str, doc: str, rule_list: Sequence[Rule], default_allow: bool = False) -> Scenario:
    return Scenario(name, doc, lambda _b: runc_program(rule_list, default_allow),
                    lambda req: first_match(rule_list, req, default_allow))


def _systemd(name: str, doc: str, entries: Sequence[Rule], deny_everything: bool = False) -> Scenario:
    return Scenario(name, doc, lambda _b: systemd_program(entries, deny_everything=deny_everything),
                    lambda req: (not deny_everything) and first_match(entries, req, False), license="GPL")


def _nvidia(name: str, doc: str, rule_list: Sequence[Rule], base: str, temp_reg: int = 6, bug: str = "") -> Scenario:
    def build(base_code: Sequence[Insn] | None) -> list[Insn]:
        if base_code is None:
            base_code = SCENARIOS[base].build(None)
        return nvidia_prepend(rule_list, base_code, temp_reg=temp_reg)

    def allows(req: DeviceRequest) -> bool:
        return nvidia_reference(rule_list, SCENARIOS[base].allows)(req)

    return Scenario(name, doc, build, allows, base=base, known_bug=bug)


NVIDIA_RULES = rules(
    f"c {NVIDIA_MAJOR}:{NVIDIACTL_MINOR} rw", f"c {NVIDIA_MAJOR}:0 rw", f"c {UVM_MAJOR}:0 rw", f"c {UVM_MAJOR}:1 rw",
)

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        _runc("runc-default", "runc default allow-list, no GPU: nvidiactl and uvm denied", RUNC_DEFAULT),
        _runc("runc-gpu", "runc allow-list with nvidiactl, modeset, GPUs 0-1, uvm", RUNC_DEFAULT + GPU_DEVICES),
        _runc("runc-gpu-no-uvm", "GPU allow-list missing nvidia-uvm (major 509)",
              RUNC_DEFAULT + rules("c 195:255 rw", "c 195:0 rw")),
        _runc("runc-gpu-no-ctl", "GPU allow-list missing nvidiactl (195:255)",
              RUNC_DEFAULT + rules("c 195:0 rw", "c 238:0 rw", "c 238:1 rw")),
        _runc("runc-ctl-readonly", "nvidiactl allowed 'r' only: O_RDWR (one 'rw' request) is denied",
              RUNC_DEFAULT + rules("c 195:255 r", "c 195:0 rw", "c 509:0 rwm")),
        _runc("runc-odd-wildcards", "wildcards in every position, block and char",
              rules("c *:3 r", "b 7:* m", "c 10:* w", "b *:* rwm", "c 195:* rw", "c *:* m")),
        _runc("runc-denylist", "default-allow deny-list: all of 195, uvm 'w' only, block 8:* rw",
              rules("c 195:* rwm", "c 509:0 w", "b 8:* rw", allow=False), default_allow=True),
        _runc("runc-allow-all", "runc for 'a *:* rwm': prologue then return 1", (), default_allow=True),
        _systemd("systemd-closed", "systemd DevicePolicy=closed + nvidia by major and uvm device",
                 SYSTEMD_CLOSED + rules("c 195:* rw", "c 509:0 rw", "b 7:* r")),
        _systemd("systemd-closed-no-nvidia", "systemd closed, no nvidia entries (e.g. after daemon-reload)",
                 SYSTEMD_CLOSED),
        _systemd("systemd-strict-empty", "systemd DevicePolicy=strict, no entries: deny everything", (),
                 deny_everything=True),
        _nvidia("nvidia-on-runc-default", "nvcgo prefix (r6 scratch) over runc's default program",
                NVIDIA_RULES, "runc-default"),
        _nvidia("nvidia-on-systemd-no-nvidia", "nvcgo prefix over systemd's program", NVIDIA_RULES,
                "systemd-closed-no-nvidia"),
        _nvidia("nvidia-r2-on-runc-default", "earlier nvcgo revision using r2 as scratch", NVIDIA_RULES,
                "runc-default", temp_reg=2,
                bug="access check clobbers r2 (device type): after one block's type+access matched, "
                    "later blocks compare the access bits with the type and miss"),
    )
}

#: programs attached together (ALLOW_MULTI) to one cgroup; allowed only if all allow
COMBINATIONS: dict[str, tuple[str, ...]] = {
    "runc+systemd": ("systemd-closed", "runc-gpu"),
    "nvidia-at-start": ("nvidia-on-systemd-no-nvidia", "nvidia-on-runc-default"),
    "nvidia-after-daemon-reload": ("systemd-closed-no-nvidia", "nvidia-on-runc-default"),
    "uvm-denied-by-one": ("runc-gpu-no-uvm", "systemd-closed"),
}


def build_order(names: Iterable[str]) -> list[str]:
    """Scenario names with every base before the nvidia prefix wrapping it."""
    out: list[str] = []

    def add(n: str) -> None:
        base = SCENARIOS[n].base
        if base:
            add(base)
        if n not in out:
            out.append(n)

    for n in names:
        add(n)
    return out


# -- kernel helpers (root) ----------------------------------------------------------------------


class _LoadAttr(ctypes.Structure):
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32), ("insns", ctypes.c_uint64),
                ("license", ctypes.c_uint64), ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32), ("prog_flags", ctypes.c_uint32),
                ("prog_name", ctypes.c_char * 16), ("prog_ifindex", ctypes.c_uint32),
                ("expected_attach_type", ctypes.c_uint32)]


class _AttachAttr(ctypes.Structure):
    _fields_ = [("target_fd", ctypes.c_uint32), ("attach_bpf_fd", ctypes.c_uint32),
                ("attach_type", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32),
                ("replace_bpf_fd", ctypes.c_uint32)]


class LoadError(BpfError):
    """BPF_PROG_LOAD failed; ``log`` holds the verifier's explanation."""

    def __init__(self, err: int, log: str) -> None:
        lines = [ln for ln in log.strip().splitlines() if ln and not ln.startswith(("processed ", "verification time"))]
        super().__init__(err, "BPF_PROG_LOAD", lines[-1] if lines else "")
        self.log = log


def load_program(insns: Sequence[Insn] | bytes, license: str = "Apache", name: str = "") -> int:
    """BPF_PROG_LOAD as BPF_PROG_TYPE_CGROUP_DEVICE; returns the program fd (caller closes)."""
    code = insns if isinstance(insns, bytes) else I.encode(insns)
    name = re.sub(r"[^A-Za-z0-9_.]", "_", name)[:15]  # the kernel rejects other characters (EINVAL)
    buf = ctypes.create_string_buffer(code, len(code))
    lic = ctypes.create_string_buffer(license.encode())
    attr = _LoadAttr(prog_type=BPF_PROG_TYPE_CGROUP_DEVICE, insn_cnt=len(code) // 8,
                     insns=ctypes.addressof(buf), license=ctypes.addressof(lic),
                     prog_name=name.encode(), expected_attach_type=BPF_CGROUP_DEVICE)
    try:
        return bpf(BPF_PROG_LOAD, attr)
    except BpfError as exc:
        if exc.errno not in (E.EINVAL, E.EACCES):  # only EINVAL/EACCES carry a verifier log worth fetching
            raise
        log = ctypes.create_string_buffer(1 << 16)
        attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ctypes.addressof(log)
        try:
            return bpf(BPF_PROG_LOAD, attr)  # pragma: no cover - failed once, fails again
        except BpfError as again:
            raise LoadError(again.errno or exc.errno, log.value.decode("utf-8", "replace")) from None


def _attach_call(cmd: int, cgroup_dir: str | os.PathLike[str], fd: int, flags: int) -> None:
    dfd = os.open(os.fspath(cgroup_dir), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        bpf(cmd, _AttachAttr(target_fd=dfd, attach_bpf_fd=fd, attach_type=BPF_CGROUP_DEVICE, attach_flags=flags))
    finally:
        os.close(dfd)


def attach(cgroup_dir: str | os.PathLike[str], fd: int, multi: bool = True) -> None:
    _attach_call(BPF_PROG_ATTACH, cgroup_dir, fd, BPF_F_ALLOW_MULTI if multi else 0)


def detach(cgroup_dir: str | os.PathLike[str], fd: int) -> None:
    _attach_call(BPF_PROG_DETACH, cgroup_dir, fd, 0)


def cgroup2_mount() -> str | None:
    """Where the unified hierarchy is mounted (/sys/fs/cgroup or /sys/fs/cgroup/unified on hybrid)."""
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                left, _, right = line.partition(" - ")
                if right.split()[:1] == ["cgroup2"]:
                    return left.split()[4]
    except OSError:
        return None
    return None


# The probe runs in a fresh interpreter so that only it -- not pytest -- enters the cgroup.
_PROBE = r"""
import json, os, sys
cg, ops = sys.argv[1], json.loads(sys.argv[2])
with open(os.path.join(cg, "cgroup.procs"), "w") as fh:
    fh.write(str(os.getpid()))
out = []
for op in ops:
    try:
        if op[0] == "open":
            fd = os.open(op[1], op[2] | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
            os.close(fd)
        elif op[0] == "mknod":
            os.mknod(op[1], op[2], os.makedev(op[3], op[4]))
            os.unlink(op[1])
        out.append(0)
    except OSError as exc:
        out.append(exc.errno)
print(json.dumps(out))
"""


def kernel_probe(cgroup_dir: str, ops: Sequence[tuple], timeout: float = 30.0) -> list[int]:
    """Run open/mknod ops in a child that first joins ``cgroup_dir``; returns errno per op (0 = ok).

    ops: ("open", path, flags) or ("mknod", path, mode_with_S_IFCHR/S_IFBLK, major, minor).
    The child exits when done, which empties the cgroup again.
    """
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", _PROBE, cgroup_dir, json.dumps(list(ops))],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"kernel probe failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)


@dataclass
class CgroupSandbox:
    """A throw-away child cgroup with programs attached; everything undone by close()."""

    path: str
    fds: list[int] = field(default_factory=list)

    @classmethod
    def create(cls, parent: str | None = None) -> "CgroupSandbox":
        root = parent or cgroup2_mount()
        if root is None:
            raise FileNotFoundError("no cgroup2 mount")
        path = os.path.join(root, f"gpuwarden-test-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        os.mkdir(path)
        return cls(path)

    def attach(self, insns: Sequence[Insn] | bytes, license: str = "Apache", name: str = "") -> int:
        fd = load_program(insns, license, name)
        self.fds.append(fd)
        attach(self.path, fd, multi=True)
        return fd

    def detach_all(self) -> None:
        for fd in self.fds:
            try:
                detach(self.path, fd)
            except OSError:
                pass
            os.close(fd)
        self.fds.clear()

    def close(self) -> None:
        self.detach_all()
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as fh:
                stragglers = [int(p) for p in fh.read().split()]
            parent = os.path.dirname(self.path)
            for pid in stragglers:  # only our own probe children could be here
                with open(os.path.join(parent, "cgroup.procs"), "w") as fh:
                    fh.write(str(pid))
        except OSError:
            pass
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> "CgroupSandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
