"""eBPF instruction records: decode the kernel's 8-byte little-endian encoding, and print it.

Programs read back from the kernel (xlated code) are raw bytes; everything that reasons
about them (the evaluator, evidence in findings) wants typed records with jump targets in
slot units, which is what the kernel's relative offsets count.  ``lddw`` spans two slots.
"""

from __future__ import annotations

import struct
from typing import Iterable, Sequence

from msgspec import Struct

# instruction classes (low 3 bits of the opcode)
LD, LDX, ST, STX, ALU, JMP, JMP32, ALU64 = range(8)
CLASS_NAMES = ("ld", "ldx", "st", "stx", "alu", "jmp", "jmp32", "alu64")

# load/store: size and mode
SIZE_W, SIZE_H, SIZE_B, SIZE_DW = 0x00, 0x08, 0x10, 0x18
SIZE_BYTES = {SIZE_W: 4, SIZE_H: 2, SIZE_B: 1, SIZE_DW: 8}
SIZE_NAMES = {SIZE_W: "u32", SIZE_H: "u16", SIZE_B: "u8", SIZE_DW: "u64"}
MODE_IMM, MODE_ABS, MODE_IND, MODE_MEM, MODE_MEMSX, MODE_ATOMIC = 0x00, 0x20, 0x40, 0x60, 0x80, 0xC0

# source operand: immediate (K) or register (X)
SRC_K, SRC_X = 0x00, 0x08

# ALU/ALU64 operations
OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_OR, OP_AND, OP_LSH, OP_RSH = 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70
OP_NEG, OP_MOD, OP_XOR, OP_MOV, OP_ARSH, OP_END = 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0

# JMP/JMP32 operations
OP_JA, OP_JEQ, OP_JGT, OP_JGE, OP_JSET, OP_JNE, OP_JSGT, OP_JSGE = 0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70
OP_CALL, OP_EXIT, OP_JLT, OP_JLE, OP_JSLT, OP_JSLE = 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0

#: src_reg values of lddw that make it a relocation (map fd/id, map value, BTF id, func...), not a constant
LDDW_PLAIN = 0

_ALU_SYMBOLS = {
    OP_ADD: "+=", OP_SUB: "-=", OP_MUL: "*=", OP_DIV: "/=", OP_OR: "|=", OP_AND: "&=",
    OP_LSH: "<<=", OP_RSH: ">>=", OP_MOD: "%=", OP_XOR: "^=", OP_MOV: "=", OP_ARSH: "s>>=",
}
_JMP_SYMBOLS = {
    OP_JEQ: "==", OP_JGT: ">", OP_JGE: ">=", OP_JSET: "&", OP_JNE: "!=", OP_JSGT: "s>",
    OP_JSGE: "s>=", OP_JLT: "<", OP_JLE: "<=", OP_JSLT: "s<", OP_JSLE: "s<=",
}

#: conditional jump operations (everything in JMP/JMP32 except JA, CALL and EXIT)
COND_JUMP_OPS = frozenset(_JMP_SYMBOLS)

_SLOT = struct.Struct("<BBhi")


class InsnDecodeError(ValueError):
    """The bytes are not a whole number of instructions (or end inside a 16-byte lddw)."""


class Insn(Struct, frozen=True):
    """One instruction; ``index`` is its slot, the unit jump offsets count in."""

    index: int
    code: int
    dst: int
    src: int
    off: int
    imm: int  # signed 32-bit; for lddw the full 64-bit constant (unsigned)
    wide: bool = False  # lddw: occupies slots index and index+1

    @property
    def cls(self) -> int:
        return self.code & 0x07

    @property
    def op(self) -> int:
        """ALU/JMP operation bits (meaningless for loads/stores)."""
        return self.code & 0xF0

    @property
    def uses_reg_source(self) -> bool:
        return bool(self.code & SRC_X)

    @property
    def size(self) -> int:
        """Load/store size bits."""
        return self.code & 0x18

    @property
    def mode(self) -> int:
        """Load/store mode bits."""
        return self.code & 0xE0

    @property
    def slots(self) -> int:
        return 2 if self.wide else 1

    @property
    def next_index(self) -> int:
        return self.index + self.slots

    def jump_target(self) -> int | None:
        """Slot a taken jump lands on (None for non-jumps, calls and exit)."""
        if self.cls not in (JMP, JMP32) or self.op in (OP_CALL, OP_EXIT):
            return None
        if self.cls == JMP32 and self.op == OP_JA:
            return self.index + 1 + self.imm  # gotol: 32-bit offset lives in imm
        return self.index + 1 + self.off

    def is_exit(self) -> bool:
        return self.cls == JMP and self.op == OP_EXIT

    def __str__(self) -> str:
        return format_insn(self)


def decode(data: bytes) -> list[Insn]:
    """Decode a program; jump offsets stay relative, ``index`` says where each one sits."""
    if len(data) % 8:
        raise InsnDecodeError(f"{len(data)} bytes is not a multiple of 8")
    out: list[Insn] = []
    n = len(data) // 8
    i = 0
    while i < n:
        code, regs, off, imm = _SLOT.unpack_from(data, i * 8)
        dst, src = regs & 0x0F, regs >> 4
        if code == (LD | MODE_IMM | SIZE_DW):
            if i + 1 >= n:
                raise InsnDecodeError(f"lddw at slot {i} is cut off by the end of the program")
            _, _, _, hi = _SLOT.unpack_from(data, (i + 1) * 8)
            value = ((hi & 0xFFFFFFFF) << 32) | (imm & 0xFFFFFFFF)
            out.append(Insn(i, code, dst, src, off, value, wide=True))
            i += 2
            continue
        out.append(Insn(i, code, dst, src, off, imm))
        i += 1
    return out


def encode(insns: Iterable[Insn]) -> bytes:
    """Inverse of :func:`decode` (slot indices are ignored; order is what counts)."""
    parts: list[bytes] = []
    for ins in insns:
        regs = ((ins.src & 0x0F) << 4) | (ins.dst & 0x0F)
        if ins.wide:
            lo, hi = ins.imm & 0xFFFFFFFF, (ins.imm >> 32) & 0xFFFFFFFF
            parts.append(_SLOT.pack(ins.code, regs, ins.off, _s32(lo)))
            parts.append(_SLOT.pack(0, 0, 0, _s32(hi)))
        else:
            parts.append(_SLOT.pack(ins.code, regs, ins.off, _s32(ins.imm & 0xFFFFFFFF)))
    return b"".join(parts)


def reindex(insns: Iterable[Insn]) -> list[Insn]:
    """Give instructions consecutive slot indices (after building or splicing programs)."""
    out: list[Insn] = []
    i = 0
    for ins in insns:
        out.append(Insn(i, ins.code, ins.dst, ins.src, ins.off, ins.imm, ins.wide))
        i += ins.slots
    return out


def by_slot(insns: Sequence[Insn]) -> dict[int, Insn]:
    return {ins.index: ins for ins in insns}


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def _reg(n: int, wide: bool) -> str:
    return f"{'r' if wide else 'w'}{n}"


def _pc(off: int) -> str:
    return f"pc{off:+d}"


def format_insn(ins: Insn) -> str:
    """Readable text in bpftool's xlated style, prefixed by slot and opcode."""
    return f"{ins.index:4d}: ({ins.code:02x}) {_text(ins)}"


def format_program(insns: Sequence[Insn]) -> str:
    return "\n".join(format_insn(i) for i in insns)


def _text(ins: Insn) -> str:
    c = ins.cls
    if c in (ALU, ALU64):
        return _alu_text(ins)
    if c in (JMP, JMP32):
        return _jmp_text(ins)
    if c == LDX:
        if ins.mode in (MODE_MEM, MODE_MEMSX):
            sx = "s" if ins.mode == MODE_MEMSX else "u"
            ty = SIZE_NAMES[ins.size].replace("u", sx, 1)
            return f"r{ins.dst} = *({ty} *)(r{ins.src} {ins.off:+d})"
    if c == ST and ins.mode == MODE_MEM:
        return f"*({SIZE_NAMES[ins.size]} *)(r{ins.dst} {ins.off:+d}) = {ins.imm}"
    if c == STX and ins.mode == MODE_MEM:
        return f"*({SIZE_NAMES[ins.size]} *)(r{ins.dst} {ins.off:+d}) = r{ins.src}"
    if c == STX and ins.mode == MODE_ATOMIC:
        return f"atomic op {ins.imm:#x} on *({SIZE_NAMES[ins.size]} *)(r{ins.dst} {ins.off:+d}) with r{ins.src}"
    if c == LD and ins.wide:
        if ins.src == LDDW_PLAIN:
            return f"r{ins.dst} = {ins.imm:#x} ll"
        return f"r{ins.dst} = pseudo(src={ins.src}) {ins.imm:#x} ll"
    if c == LD and ins.mode in (MODE_ABS, MODE_IND):
        return f"legacy packet load ({'abs' if ins.mode == MODE_ABS else 'ind'}) imm={ins.imm}"
    return f"unknown opcode {ins.code:#04x} dst=r{ins.dst} src=r{ins.src} off={ins.off} imm={ins.imm}"


def _alu_text(ins: Insn) -> str:
    wide = ins.cls == ALU64
    d = _reg(ins.dst, wide)
    op = ins.op
    if op == OP_NEG:
        return f"{d} = -{d}"
    if op == OP_END:
        if wide:
            return f"r{ins.dst} = bswap{ins.imm} r{ins.dst}"
        return f"r{ins.dst} = {'be' if ins.uses_reg_source else 'le'}{ins.imm} r{ins.dst}"
    sym = _ALU_SYMBOLS.get(op)
    if sym is None:
        return f"unknown alu op {ins.code:#04x}"
    if op in (OP_DIV, OP_MOD) and ins.off == 1:
        sym = "s" + sym
    operand = _reg(ins.src, wide) if ins.uses_reg_source else str(ins.imm)
    if op == OP_MOV and ins.off in (8, 16, 32) and ins.uses_reg_source:
        return f"{d} = (s{ins.off}){_reg(ins.src, wide)}"
    return f"{d} {sym} {operand}"


def _jmp_text(ins: Insn) -> str:
    wide = ins.cls == JMP
    op = ins.op
    if op == OP_EXIT and wide:
        return "exit"
    if op == OP_CALL and wide:
        kind = {0: "helper", 1: "bpf-to-bpf", 2: "kfunc"}.get(ins.src, f"src={ins.src}")
        return f"call {kind} {ins.imm}"
    if op == OP_JA:
        return f"goto {_pc(ins.off if wide else ins.imm)}"
    sym = _JMP_SYMBOLS.get(op)
    if sym is None:
        return f"unknown jump op {ins.code:#04x}"
    d = _reg(ins.dst, wide)
    if ins.uses_reg_source:
        operand = _reg(ins.src, wide)
    else:
        operand = f"{ins.imm:#x}" if ins.imm >= 0 else str(ins.imm)
    return f"if {d} {sym} {operand} goto {_pc(ins.off)}"
