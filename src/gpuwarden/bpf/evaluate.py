"""Run a BPF_PROG_TYPE_CGROUP_DEVICE program on one device request, exactly, or say why not.

On cgroup v2 a container's device policy exists only as code, so the only faithful way to
answer "may this container open /dev/nvidiactl read-write?" is to execute that code on the
context the kernel would build.  This is a concrete interpreter, not an analysis: every
supported instruction is executed with the kernel's semantics; anything outside the subset
device programs use (helper calls, maps, packet loads, pointer tricks, uninitialised reads)
stops the run with ``allowed=None`` and the reason, so a verdict is never a guess.
"""

from __future__ import annotations

import os
import struct
import sys
from typing import Sequence

from msgspec import Struct

from gpuwarden.bpf import insn as I
from gpuwarden.bpf.insn import Insn

# struct bpf_cgroup_dev_ctx { u32 access_type /* (access << 16) | type */; u32 major; u32 minor; }
CTX_SIZE = 12
ACC_MKNOD, ACC_READ, ACC_WRITE = 1, 2, 4
DEV_BLOCK, DEV_CHAR = 1, 2
_ACCESS_BITS = {"m": ACC_MKNOD, "r": ACC_READ, "w": ACC_WRITE}
_DEV_TYPES = {"b": DEV_BLOCK, "c": DEV_CHAR}

STACK_SIZE = 512
NUM_REGS = 12
DEFAULT_STEP_LIMIT = 100_000
MAX_PATH = 4096  # slots kept for evidence; the run itself is bounded by the step limit

_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1
_ALU_OPS = frozenset({I.OP_ADD, I.OP_SUB, I.OP_MUL, I.OP_DIV, I.OP_OR, I.OP_AND, I.OP_LSH, I.OP_RSH,
                      I.OP_NEG, I.OP_MOD, I.OP_XOR, I.OP_MOV, I.OP_ARSH, I.OP_END})


def access_mask(access: str) -> int:
    """'rw' -> READ|WRITE; what the kernel puts in the upper half of access_type."""
    if not access or any(ch not in _ACCESS_BITS for ch in access):
        raise ValueError(f"access must be a non-empty subset of 'rwm', got {access!r}")
    mask = 0
    for ch in access:
        mask |= _ACCESS_BITS[ch]
    return mask


def access_string(mask: int) -> str:
    return "".join(ch for ch in "rwm" if mask & _ACCESS_BITS[ch])


def access_for_open(flags: int) -> str:
    """The access an ``open(2)`` with these flags is checked for, as ONE combined request.

    The kernel (devcgroup_inode_permission via inode_permission) turns MAY_READ/MAY_WRITE
    into one access mask, so O_RDWR is a single "rw" question, not "r" and "w" separately.
    O_TRUNC adds MAY_WRITE even on O_RDONLY.  O_PATH opens are not checked: returns "".
    """
    if flags & getattr(os, "O_PATH", 0):
        return ""
    acc = flags & os.O_ACCMODE
    access = {os.O_RDONLY: "r", os.O_WRONLY: "w"}.get(acc, "rw")
    if flags & os.O_TRUNC and "w" not in access:
        access += "w"
    return access


class DeviceRequest(Struct, frozen=True):
    """One question the kernel asks the programs: type, numbers, combined access."""

    dev_type: str  # "c" | "b"
    major: int
    minor: int
    access: str  # non-empty subset of "rwm"

    def __post_init__(self) -> None:
        if self.dev_type not in _DEV_TYPES:
            raise ValueError(f"device type must be 'c' or 'b', got {self.dev_type!r}")
        for name in ("major", "minor"):
            v = getattr(self, name)
            if not 0 <= v <= _M32:
                raise ValueError(f"{name} {v} does not fit the u32 ctx field")
        access_mask(self.access)

    @property
    def access_type(self) -> int:
        return (access_mask(self.access) << 16) | _DEV_TYPES[self.dev_type]

    def ctx(self) -> bytes:
        return make_ctx(self.access_type, self.major, self.minor)

    def __str__(self) -> str:
        return f"{self.dev_type} {self.major}:{self.minor} {access_string(access_mask(self.access))}"


def make_ctx(access_type: int, major: int, minor: int) -> bytes:
    # The kernel's struct lives in native byte order; device programs run on the host they guard.
    return struct.pack("=III", access_type & _M32, major & _M32, minor & _M32)


class ProgramVerdict(Struct, frozen=True):
    """Outcome of one program on one request.

    ``allowed`` is None when the program could not be evaluated exactly; ``index`` is then
    the slot that stopped the run, otherwise the slot of the decisive ``exit``.
    """

    allowed: bool | None
    reason: str
    index: int | None
    return_value: int | None
    path: tuple[int, ...]  # slots executed, in order (first MAX_PATH)
    steps: int

    @property
    def known(self) -> bool:
        return self.allowed is not None


class ProgramsVerdict(Struct, frozen=True):
    """All effective programs together: the kernel runs each and fails with EPERM if any returns 0."""

    allowed: bool | None
    reason: str
    verdicts: tuple[ProgramVerdict, ...]
    decisive: int | None  # position of the program that decided (first deny, else first unknown)


class _Stop(Exception):
    def __init__(self, index: int | None, reason: str) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason


class _Ptr(Struct, frozen=True):
    region: str  # "ctx" | "stack" (stack offsets are relative to r10, i.e. negative)
    off: int


def evaluate(
    insns: Sequence[Insn] | bytes,
    dev_type: str,
    major: int,
    minor: int,
    access: str,
    *,
    step_limit: int = DEFAULT_STEP_LIMIT,
) -> ProgramVerdict:
    """Run the program on the ctx the kernel builds for this request (one combined access mask)."""
    req = DeviceRequest(dev_type, major, minor, access)
    return evaluate_ctx(insns, req.access_type, major, minor, step_limit=step_limit)


def evaluate_ctx(
    insns: Sequence[Insn] | bytes,
    access_type: int,
    major: int,
    minor: int,
    *,
    step_limit: int = DEFAULT_STEP_LIMIT,
) -> ProgramVerdict:
    """Like :func:`evaluate` with a raw ``access_type`` word (for contexts the kernel never builds)."""
    prog = I.decode(insns) if isinstance(insns, (bytes, bytearray, memoryview)) else list(insns)
    return _Machine(prog, make_ctx(access_type, major, minor), step_limit).run()


def evaluate_all(
    programs: Sequence[Sequence[Insn] | bytes],
    dev_type: str,
    major: int,
    minor: int,
    access: str,
    *,
    step_limit: int = DEFAULT_STEP_LIMIT,
) -> ProgramsVerdict:
    """Apply the kernel's all-must-allow rule over the effective programs of a cgroup.

    A definite deny from any program decides (the kernel runs all and any 0 means EPERM), even
    if another program is UNKNOWN; "allowed" needs every program to allow.  No programs: allowed
    (on a hybrid host the cgroup v1 devices controller may still refuse; that is not BPF).
    """
    verdicts = tuple(evaluate(p, dev_type, major, minor, access, step_limit=step_limit) for p in programs)
    req = DeviceRequest(dev_type, major, minor, access)
    if not verdicts:
        return ProgramsVerdict(True, f"{req}: no device programs in effect", (), None)
    for pos, v in enumerate(verdicts):
        if v.allowed is False:
            return ProgramsVerdict(False, f"{req}: denied by program #{pos}: {v.reason}", verdicts, pos)
    for pos, v in enumerate(verdicts):
        if v.allowed is None:
            return ProgramsVerdict(None, f"{req}: unknown, program #{pos}: {v.reason}", verdicts, pos)
    return ProgramsVerdict(True, f"{req}: allowed by all {len(verdicts)} program(s)", verdicts, None)


def explain(insns: Sequence[Insn] | bytes, verdict: ProgramVerdict) -> list[str]:
    """Evidence lines: each conditional jump on the path (taken or not) and the decisive slot."""
    prog = I.decode(insns) if isinstance(insns, (bytes, bytearray, memoryview)) else list(insns)
    slots = I.by_slot(prog)
    lines: list[str] = []
    path = verdict.path
    for pos, idx in enumerate(path):
        ins = slots.get(idx)
        if ins is None or ins.cls not in (I.JMP, I.JMP32) or ins.op in (I.OP_CALL, I.OP_EXIT, I.OP_JA):
            continue
        if pos + 1 < len(path):
            taken = path[pos + 1] != ins.next_index
            lines.append(f"{I.format_insn(ins)}    ; {'taken' if taken else 'not taken'}")
    if verdict.index is not None and verdict.index in slots:
        tail = f"r0 = {verdict.return_value}" if verdict.return_value is not None else verdict.reason
        lines.append(f"{I.format_insn(slots[verdict.index])}    ; {tail}")
    return lines


def _signed(v: int, bits: int) -> int:
    return v - (1 << bits) if v >> (bits - 1) & 1 else v


def _condition(op: int, a: int, b: int, bits: int) -> bool:
    if op == I.OP_JNE:
        return a != b
    if op == I.OP_JEQ:
        return a == b
    if op == I.OP_JSET:
        return (a & b) != 0
    if op == I.OP_JGT:
        return a > b
    if op == I.OP_JGE:
        return a >= b
    if op == I.OP_JLT:
        return a < b
    if op == I.OP_JLE:
        return a <= b
    sa, sb = _signed(a, bits), _signed(b, bits)
    if op == I.OP_JSGT:
        return sa > sb
    if op == I.OP_JSGE:
        return sa >= sb
    if op == I.OP_JSLT:
        return sa < sb
    return sa <= sb  # OP_JSLE; callers pass conditional ops only


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


class _Machine:
    def __init__(self, prog: list[Insn], ctx: bytes, step_limit: int) -> None:
        self.prog = prog
        self.slots = I.by_slot(prog)
        self.n_slots = prog[-1].next_index if prog else 0
        self.ctx = ctx
        self.step_limit = step_limit
        # r0-r10 plus r11: BPF_REG_AX, the kernel's scratch register in constant-blinded xlated code
        self.regs: list[int | _Ptr | None] = [None] * NUM_REGS
        self.regs[1] = _Ptr("ctx", 0)
        self.regs[10] = _Ptr("stack", 0)
        # each stack byte: int (data), ("ptr", _Ptr, byte_no) for a spilled pointer, or None
        self.stack: list[object] = [None] * STACK_SIZE
        self.path: list[int] = []
        self.steps = 0

    def run(self) -> ProgramVerdict:
        pc = 0
        try:
            if not self.prog:
                raise _Stop(None, "empty program")
            while True:
                ins = self.slots.get(pc)
                if ins is None:
                    raise _Stop(pc, f"control reached slot {pc}, which is not the start of an instruction")
                self.steps += 1
                if self.steps > self.step_limit:
                    raise _Stop(pc, f"step limit {self.step_limit} exceeded")
                if len(self.path) < MAX_PATH:
                    self.path.append(pc)
                result = self.step(ins)
                if isinstance(result, tuple):
                    return self._finish(ins, result[1])
                pc = result
        except _Stop as stop:
            return ProgramVerdict(None, stop.reason, stop.index, None, tuple(self.path), self.steps)

    def _finish(self, ins: Insn, r0: int) -> ProgramVerdict:
        ret = r0 & _M32  # bpf_prog_run() hands the kernel the low 32 bits of r0
        allowed = ret != 0
        note = "" if r0 in (0, 1) else " (outside [0,1]: the verifier would have rejected this program)"
        reason = f"{'allowed' if allowed else 'denied'}: exit at slot {ins.index} returned {r0}{note}"
        return ProgramVerdict(allowed, reason, ins.index, r0, tuple(self.path), self.steps)

    # -- helpers -------------------------------------------------------------------------

    def get(self, reg: int, ins: Insn) -> int | _Ptr:
        if reg >= NUM_REGS:
            raise _Stop(ins.index, f"invalid register r{reg}")
        v = self.regs[reg]
        if v is None:
            raise _Stop(ins.index, f"read of uninitialised r{reg}")
        return v

    def put(self, reg: int, value: int | _Ptr, ins: Insn) -> None:
        if reg == 10:
            raise _Stop(ins.index, "write to the read-only frame pointer r10")
        if reg >= NUM_REGS:
            raise _Stop(ins.index, f"invalid register r{reg}")
        self.regs[reg] = value

    def scalar(self, reg: int, ins: Insn) -> int:
        v = self.get(reg, ins)
        if isinstance(v, _Ptr):
            raise _Stop(ins.index, f"r{reg} holds a {v.region} pointer where a number is needed")
        return v

    def jump(self, ins: Insn, target: int) -> int:
        if not 0 <= target < self.n_slots:
            raise _Stop(ins.index, f"jump to slot {target} is outside the program (0..{self.n_slots - 1})")
        return target

    # -- one instruction -------------------------------------------------------------------

    def step(self, ins: Insn) -> int | tuple[str, int]:
        c = ins.cls
        if c in (I.ALU, I.ALU64):
            self.alu(ins)
        elif c in (I.JMP, I.JMP32):
            return self.jmp(ins)
        elif c == I.LDX:
            self.ldx(ins)
        elif c in (I.ST, I.STX):
            self.store(ins)
        elif c == I.LD:
            if not ins.wide:
                raise _Stop(ins.index, "legacy packet load (LD ABS/IND) is not valid in device programs")
            if ins.src != I.LDDW_PLAIN:
                raise _Stop(ins.index, f"lddw with src_reg={ins.src} refers to a map or other object")
            self.put(ins.dst, ins.imm & _M64, ins)
        else:  # pragma: no cover - 3 bits, all classes handled
            raise _Stop(ins.index, f"unknown opcode {ins.code:#04x}")
        nxt = ins.next_index
        if nxt >= self.n_slots:
            raise _Stop(ins.index, "execution runs off the end of the program")
        return nxt

    def alu(self, ins: Insn) -> None:
        wide = ins.cls == I.ALU64
        bits = 64 if wide else 32
        mask = _M64 if wide else _M32
        op, dst = ins.op, ins.dst
        if op not in _ALU_OPS:
            raise _Stop(ins.index, f"unknown ALU operation in opcode {ins.code:#04x}")
        if ins.off != 0 and not (op in (I.OP_DIV, I.OP_MOD) and ins.off == 1) and op != I.OP_MOV:
            raise _Stop(ins.index, f"opcode {ins.code:#04x} with off={ins.off} is not a defined operation")
        if op == I.OP_END:
            self.put(dst, self.end(ins), ins)
            return
        if op == I.OP_MOV:
            self.put(dst, self.mov(ins, wide, mask), ins)
            return

        if op in (I.OP_XOR, I.OP_SUB) and ins.uses_reg_source and ins.src == dst:
            # x ^ x == x - x == 0 whatever x holds: the kernel's constant blinding zeroes registers this
            # way (it rewrites "r0 = 0" into "r0 ^= r0"), so it must not count as an uninitialised read.
            self.put(dst, 0, ins)
            return
        a_raw = self.get(dst, ins)
        if op == I.OP_NEG:
            if ins.uses_reg_source:
                raise _Stop(ins.index, f"neg with a register source (opcode {ins.code:#04x}) is not defined")
            b_raw: int | _Ptr = 0
        elif ins.uses_reg_source:
            b_raw = self.get(ins.src, ins)
        else:
            b_raw = ins.imm & _M64  # imm is sign-extended to 64 bits, then truncated for 32-bit ops

        if isinstance(a_raw, _Ptr) or isinstance(b_raw, _Ptr):
            self.put(dst, self.pointer_arith(ins, wide, a_raw, b_raw), ins)
            return

        a, b = a_raw & mask, b_raw & mask
        shift_mask = bits - 1
        if op == I.OP_ADD:
            r = a + b
        elif op == I.OP_SUB:
            r = a - b
        elif op == I.OP_MUL:
            r = a * b
        elif op == I.OP_DIV:
            if ins.off == 0:
                r = 0 if b == 0 else a // b
            else:
                sa, sb = _signed(a, bits), _signed(b, bits)
                r = 0 if sb == 0 else _trunc_div(sa, sb)
        elif op == I.OP_MOD:
            if ins.off == 0:
                r = a if b == 0 else a % b
            else:
                sa, sb = _signed(a, bits), _signed(b, bits)
                r = sa if sb == 0 else sa - sb * _trunc_div(sa, sb)
        elif op == I.OP_OR:
            r = a | b
        elif op == I.OP_AND:
            r = a & b
        elif op == I.OP_XOR:
            r = a ^ b
        elif op == I.OP_LSH:
            r = a << (b & shift_mask)
        elif op == I.OP_RSH:
            r = a >> (b & shift_mask)
        elif op == I.OP_ARSH:
            r = _signed(a, bits) >> (b & shift_mask)
        else:  # OP_NEG; the opcode was validated on entry
            r = -a
        self.put(dst, r & mask, ins)  # 32-bit results are zero-extended into the 64-bit register

    def mov(self, ins: Insn, wide: bool, mask: int) -> int | _Ptr:
        if not ins.uses_reg_source:
            if ins.off != 0:
                raise _Stop(ins.index, f"mov imm with off={ins.off} is not defined")
            return ins.imm & mask
        v = self.get(ins.src, ins)
        if isinstance(v, _Ptr):
            if wide and ins.off == 0:
                return v
            raise _Stop(ins.index, f"32-bit or sign-extending move of a {v.region} pointer")
        if ins.off == 0:
            return v & mask
        if ins.off in (8, 16, 32) and not (ins.off == 32 and not wide):
            return _signed(v & ((1 << ins.off) - 1), ins.off) & mask
        raise _Stop(ins.index, f"mov with off={ins.off} is not defined")

    def end(self, ins: Insn) -> int:
        v = self.scalar(ins.dst, ins)
        width = ins.imm
        if width not in (16, 32, 64):
            raise _Stop(ins.index, f"byte swap of width {width} is not defined")
        nbytes = width // 8
        low = v & ((1 << width) - 1)
        if ins.cls == I.ALU64:
            swap = True  # bswap: unconditional
        else:
            swap = ins.uses_reg_source != (sys.byteorder == "big")  # to_be on LE hosts, to_le on BE
        if not swap:
            return low
        return int.from_bytes(low.to_bytes(nbytes, "little"), "big")

    def pointer_arith(self, ins: Insn, wide: bool, a: int | _Ptr, b: int | _Ptr) -> _Ptr:
        if not wide:
            raise _Stop(ins.index, "32-bit arithmetic on a pointer")
        if isinstance(a, _Ptr) and not isinstance(b, _Ptr) and ins.op in (I.OP_ADD, I.OP_SUB):
            delta = _signed(b, 64)
            return _Ptr(a.region, a.off + delta if ins.op == I.OP_ADD else a.off - delta)
        if isinstance(b, _Ptr) and not isinstance(a, _Ptr) and ins.op == I.OP_ADD:
            return _Ptr(b.region, b.off + _signed(a, 64))
        raise _Stop(ins.index, f"unsupported pointer arithmetic (opcode {ins.code:#04x})")

    def jmp(self, ins: Insn) -> int | tuple[str, int]:
        op, wide = ins.op, ins.cls == I.JMP
        if op == I.OP_EXIT:
            if not wide:
                raise _Stop(ins.index, f"unknown opcode {ins.code:#04x}")
            r0 = self.regs[0]
            if r0 is None:
                raise _Stop(ins.index, "exit with r0 uninitialised")
            if isinstance(r0, _Ptr):
                raise _Stop(ins.index, "exit returning a pointer")
            return ("exit", r0)
        if op == I.OP_CALL:
            if not wide:
                raise _Stop(ins.index, f"unknown opcode {ins.code:#04x}")
            what = {0: "helper function", 1: "BPF subprogram", 2: "kfunc"}.get(ins.src, "call")
            raise _Stop(ins.index, f"{what} call #{ins.imm} is outside what is evaluated exactly")
        if op == I.OP_JA:
            return self.jump(ins, ins.jump_target())  # type: ignore[arg-type]
        if op not in I.COND_JUMP_OPS:
            raise _Stop(ins.index, f"unknown jump operation in opcode {ins.code:#04x}")

        bits = 64 if wide else 32
        mask = _M64 if wide else _M32
        a = self.scalar(ins.dst, ins) & mask
        b = (self.scalar(ins.src, ins) if ins.uses_reg_source else ins.imm & _M64) & mask
        taken = _condition(op, a, b, bits)
        return self.jump(ins, ins.jump_target() if taken else ins.next_index)  # type: ignore[arg-type]

    def ldx(self, ins: Insn) -> None:
        if ins.mode not in (I.MODE_MEM, I.MODE_MEMSX):
            raise _Stop(ins.index, f"unsupported load mode in opcode {ins.code:#04x}")
        size = I.SIZE_BYTES[ins.size]
        if ins.mode == I.MODE_MEMSX and size == 8:
            raise _Stop(ins.index, "sign-extending 8-byte load is not defined")
        base = self.get(ins.src, ins)
        if not isinstance(base, _Ptr):
            raise _Stop(ins.index, f"load through r{ins.src}, which holds a number, not a ctx or stack pointer")
        addr = base.off + ins.off
        if base.region == "ctx":
            if addr < 0 or addr + size > CTX_SIZE:
                raise _Stop(ins.index, f"ctx load of {size} bytes at offset {addr} is outside the 12-byte ctx")
            raw = self.ctx[addr : addr + size]
            self.put(ins.dst, self._load_value(raw, ins), ins)
            return
        cells = self._stack_cells(ins, addr, size)
        if all(isinstance(cell, int) for cell in cells):
            self.put(ins.dst, self._load_value(bytes(cells), ins), ins)  # type: ignore[arg-type]
            return
        first = cells[0]
        if (
            size == 8
            and ins.mode == I.MODE_MEM
            and isinstance(first, tuple)
            and all(isinstance(c, tuple) and c[1] == first[1] and c[2] == k for k, c in enumerate(cells))
        ):
            self.put(ins.dst, first[1], ins)  # a whole spilled pointer read back
            return
        if any(cell is None for cell in cells):
            raise _Stop(ins.index, f"read of uninitialised stack at r10{addr:+d}")
        raise _Stop(ins.index, f"partial read of a spilled pointer at r10{addr:+d}")

    @staticmethod
    def _load_value(raw: bytes, ins: Insn) -> int:
        order = "big" if sys.byteorder == "big" else "little"
        if ins.mode == I.MODE_MEMSX:
            return int.from_bytes(raw, order, signed=True) & _M64
        return int.from_bytes(raw, order)

    def _stack_cells(self, ins: Insn, addr: int, size: int) -> list[object]:
        if addr < -STACK_SIZE or addr + size > 0:
            raise _Stop(ins.index, f"stack access of {size} bytes at r10{addr:+d} is outside the 512-byte frame")
        start = STACK_SIZE + addr
        return self.stack[start : start + size]

    def store(self, ins: Insn) -> None:
        if ins.mode != I.MODE_MEM:
            raise _Stop(ins.index, f"unsupported store mode in opcode {ins.code:#04x} (atomics are not evaluated)")
        size = I.SIZE_BYTES[ins.size]
        base = self.get(ins.dst, ins)
        if not isinstance(base, _Ptr):
            raise _Stop(ins.index, f"store through r{ins.dst}, which holds a number, not the stack pointer")
        if base.region != "stack":
            raise _Stop(ins.index, "store into the ctx (device ctx is read-only)")
        addr = base.off + ins.off
        self._stack_cells(ins, addr, size)  # bounds check
        start = STACK_SIZE + addr
        if ins.cls == I.ST:
            value: int | _Ptr = ins.imm & _M64
        else:
            value = self.get(ins.src, ins)
        if isinstance(value, _Ptr):
            if size != 8:
                raise _Stop(ins.index, "partial spill of a pointer")
            for k in range(8):
                self.stack[start + k] = ("ptr", value, k)
            return
        order = "big" if sys.byteorder == "big" else "little"
        data = (value & ((1 << (8 * size)) - 1)).to_bytes(size, order)
        for k in range(size):
            self.stack[start + k] = data[k]
