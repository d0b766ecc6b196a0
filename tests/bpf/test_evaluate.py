"""Interpreter semantics on hand-assembled programs: ALU/JMP widths, ctx and stack, UNKNOWN cases."""

from __future__ import annotations

import os

import pytest

from gpuwarden.bpf import insn as I
from gpuwarden.bpf.evaluate import (
    DeviceRequest, access_for_open, access_mask, evaluate, evaluate_all, evaluate_ctx, explain,
)
from gpuwarden.bpf.insn import Insn

M64 = (1 << 64) - 1


def ins(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> Insn:
    return Insn(0, code, dst, src, off, imm)


def prog(*items: Insn) -> list[Insn]:
    return I.reindex(items)


def mov64(dst: int, imm: int) -> Insn:
    return ins(I.ALU64 | I.OP_MOV | I.SRC_K, dst, imm=imm)


def lddw(dst: int, value: int, src: int = 0) -> Insn:
    return Insn(0, I.LD | I.MODE_IMM | I.SIZE_DW, dst, src, 0, value & M64, wide=True)


EXIT = ins(I.JMP | I.OP_EXIT)


def r0_after(*body: Insn, req: tuple = ("c", 1, 2, "rw")) -> int | None:
    v = evaluate(prog(*body, EXIT), *req)
    assert v.known, v.reason
    return v.return_value


# -- ALU ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op, a, b, wide, expected",
    [
        (I.OP_ADD, M64, 1, True, 0),
        (I.OP_ADD, M64, 1, False, 0),  # w-add wraps at 32 bits and clears the upper half
        (I.OP_ADD, 0xFFFF_FFFF_0000_0001, 1, False, 2),
        (I.OP_SUB, 0, 1, True, M64),
        (I.OP_SUB, 0, 1, False, 0xFFFF_FFFF),
        (I.OP_MUL, 0x1_0000_0001, 0x1_0000_0001, True, 0x2_0000_0001),
        (I.OP_MUL, 0x8000_0000, 2, False, 0),
        (I.OP_DIV, 100, 7, True, 14),
        (I.OP_DIV, 100, 0, True, 0),  # division by zero yields 0
        (I.OP_DIV, 0x1_0000_0064, 7, False, 14),
        (I.OP_MOD, 100, 7, True, 2),
        (I.OP_MOD, 100, 0, True, 100),  # modulo by zero leaves dst
        (I.OP_MOD, 0x1_0000_0064, 0, False, 100),  # ... truncated to 32 bits for w-ops
        (I.OP_OR, 0xF0, 0x0F, True, 0xFF),
        (I.OP_AND, 0xFFFF_FFFF_FFFF_0002, 0xFFFF, False, 2),
        (I.OP_XOR, 0xFF, 0x0F, True, 0xF0),
        (I.OP_LSH, 1, 63, True, 1 << 63),
        (I.OP_LSH, 1, 65, True, 2),  # shift count masked to 6 bits
        (I.OP_LSH, 1, 33, False, 2),  # ... and to 5 bits for w-ops
        (I.OP_RSH, 0x0002_0000, 16, False, 2),
        (I.OP_RSH, M64, 60, True, 0xF),
        (I.OP_ARSH, 1 << 63, 63, True, M64),
        (I.OP_ARSH, 0x8000_0000, 31, False, 0xFFFF_FFFF),
    ],
)
def test_alu_register_operand(op: int, a: int, b: int, wide: bool, expected: int) -> None:
    cls = I.ALU64 if wide else I.ALU
    got = r0_after(lddw(0, a), lddw(1, b), ins(cls | op | I.SRC_X, 0, 1))
    assert got == expected


def test_alu_immediate_is_sign_extended_for_64_bit_ops() -> None:
    assert r0_after(mov64(0, 0), ins(I.ALU64 | I.OP_ADD | I.SRC_K, 0, imm=-1)) == M64
    assert r0_after(mov64(0, 0), ins(I.ALU | I.OP_ADD | I.SRC_K, 0, imm=-1)) == 0xFFFF_FFFF
    assert r0_after(mov64(0, -1)) == M64
    assert r0_after(ins(I.ALU | I.OP_MOV | I.SRC_K, 0, imm=-1)) == 0xFFFF_FFFF


def test_neg_and_signed_div_mod_and_movsx() -> None:
    assert r0_after(mov64(0, 5), ins(I.ALU64 | I.OP_NEG, 0)) == (-5) & M64
    assert r0_after(mov64(0, 5), ins(I.ALU | I.OP_NEG, 0)) == (-5) & 0xFFFF_FFFF
    sdiv = ins(I.ALU64 | I.OP_DIV | I.SRC_K, 0, off=1, imm=2)
    smod = ins(I.ALU64 | I.OP_MOD | I.SRC_K, 0, off=1, imm=3)
    assert r0_after(mov64(0, -7), sdiv) == (-3) & M64
    assert r0_after(mov64(0, -7), smod) == (-1) & M64
    movsx8 = ins(I.ALU64 | I.OP_MOV | I.SRC_X, 0, 1, off=8)
    assert r0_after(mov64(1, 0x80), movsx8) == (-128) & M64


def test_byte_swaps() -> None:
    to_be16 = ins(I.ALU | I.OP_END | I.SRC_X, 0, imm=16)
    to_le32 = ins(I.ALU | I.OP_END | I.SRC_K, 0, imm=32)
    bswap64 = ins(I.ALU64 | I.OP_END | I.SRC_K, 0, imm=64)
    assert r0_after(lddw(0, 0x1122_3344_5566_7788), to_be16) == 0x8877
    assert r0_after(lddw(0, 0x1122_3344_5566_7788), to_le32) == 0x5566_7788
    assert r0_after(lddw(0, 0x1122_3344_5566_7788), bswap64) == 0x8877_6655_4433_2211


# -- JMP ----------------------------------------------------------------------------------------


def branch(code: int, a: int, b: int | None = None, imm: int = 0) -> bool:
    """True if the conditional jump is taken."""
    body = [lddw(2, a)]
    if b is not None:
        body.append(lddw(3, b))
        jump = ins(code | I.SRC_X, 2, 3, off=2)
    else:
        jump = ins(code | I.SRC_K, 2, off=2, imm=imm)
    v = evaluate(prog(*body, jump, mov64(0, 0), EXIT, mov64(0, 1), EXIT), "c", 1, 1, "r")
    assert v.known, v.reason
    return bool(v.allowed)


@pytest.mark.parametrize(
    "code, a, b, taken",
    [
        (I.JMP | I.OP_JEQ, 5, 5, True),
        (I.JMP | I.OP_JNE, 5, 5, False),
        (I.JMP | I.OP_JGT, M64, 1, True),  # unsigned
        (I.JMP | I.OP_JSGT, M64, 1, False),  # signed: -1 > 1 is false
        (I.JMP | I.OP_JGE, 3, 3, True),
        (I.JMP | I.OP_JSGE, (-3) & M64, (-4) & M64, True),
        (I.JMP | I.OP_JLT, 1, M64, True),
        (I.JMP | I.OP_JSLT, M64, 1, True),
        (I.JMP | I.OP_JLE, 4, 4, True),
        (I.JMP | I.OP_JSLE, 0, (-1) & M64, False),
        (I.JMP | I.OP_JSET, 0b1010, 0b0100, False),
        (I.JMP | I.OP_JSET, 0b1010, 0b0010, True),
        (I.JMP32 | I.OP_JEQ, 0x1_0000_0005, 5, True),  # upper halves ignored
        (I.JMP | I.OP_JEQ, 0x1_0000_0005, 5, False),
        (I.JMP32 | I.OP_JSGT, 0xFFFF_FFFF, 1, False),  # w: -1 signed
        (I.JMP32 | I.OP_JGT, 0xFFFF_FFFF, 1, True),
    ],
)
def test_conditional_jumps(code: int, a: int, b: int, taken: bool) -> None:
    assert branch(code, a, b) is taken


def test_jump_immediate_sign_extension_differs_by_width() -> None:
    assert branch(I.JMP | I.OP_JEQ, M64, imm=-1) is True
    assert branch(I.JMP | I.OP_JEQ, 0xFFFF_FFFF, imm=-1) is False  # 64-bit: imm is 0xffff...ffff
    assert branch(I.JMP32 | I.OP_JEQ, 0xFFFF_FFFF, imm=-1) is True


# -- ctx and stack --------------------------------------------------------------------------------


def load(size: int, off: int, base: int = 1, dst: int = 0) -> Insn:
    return ins(I.LDX | I.MODE_MEM | size, dst, base, off)


@pytest.mark.parametrize(
    "size, off, expected",
    [
        (I.SIZE_W, 0, (6 << 16) | 2),
        (I.SIZE_H, 0, 2),  # type: low half on little-endian
        (I.SIZE_H, 2, 6),  # access: high half
        (I.SIZE_B, 0, 2),
        (I.SIZE_B, 2, 6),
        (I.SIZE_B, 3, 0),
        (I.SIZE_W, 4, 195),
        (I.SIZE_W, 8, 255),
        (I.SIZE_B, 8, 255),
        (I.SIZE_DW, 0, (195 << 32) | (6 << 16) | 2),
        (I.SIZE_DW, 4, (255 << 32) | 195),
    ],
)
def test_ctx_loads_of_every_width(size: int, off: int, expected: int) -> None:
    assert r0_after(load(size, off), req=("c", 195, 255, "rw")) == expected


def test_ctx_layout_for_block_mknod() -> None:
    v = evaluate(prog(load(I.SIZE_W, 0), EXIT), "b", 8, 0, "m")
    assert v.return_value == (1 << 16) | 1


def test_ctx_pointer_arithmetic() -> None:
    assert r0_after(ins(I.ALU64 | I.OP_ADD | I.SRC_K, 1, imm=4), load(I.SIZE_W, 4), req=("c", 3, 77, "r")) == 77


def test_stack_store_and_load_back() -> None:
    body = [
        ins(I.ST | I.MODE_MEM | I.SIZE_W, 10, off=-8, imm=0x1234),
        ins(I.ST | I.MODE_MEM | I.SIZE_W, 10, off=-4, imm=-1),
        load(I.SIZE_DW, -8, base=10),
    ]
    assert r0_after(*body) == 0xFFFF_FFFF_0000_1234
    body = [load(I.SIZE_W, 4, dst=2), ins(I.STX | I.MODE_MEM | I.SIZE_H, 10, 2, off=-2), load(I.SIZE_H, -2, base=10)]
    assert r0_after(*body, req=("c", 0x1_00C3, 0, "r")) == 0x00C3


def test_spilled_ctx_pointer_can_be_filled_and_used() -> None:
    body = [
        ins(I.STX | I.MODE_MEM | I.SIZE_DW, 10, 1, off=-16),
        mov64(1, 0),
        load(I.SIZE_DW, -16, base=10, dst=6),
        load(I.SIZE_W, 8, base=6),
    ]
    assert r0_after(*body, req=("c", 1, 42, "r")) == 42


def test_lddw_constant() -> None:
    assert r0_after(lddw(0, 0xDEAD_BEEF_0000_0001)) == 0xDEAD_BEEF_0000_0001


# -- verdicts, return values, evidence ------------------------------------------------------------


def test_return_value_low_32_bits_decide() -> None:
    v = evaluate(prog(lddw(0, 1 << 32), EXIT), "c", 1, 3, "r")
    assert v.allowed is False and "outside [0,1]" in v.reason
    v = evaluate(prog(mov64(0, 2), EXIT), "c", 1, 3, "r")
    assert v.allowed is True


def test_verdict_points_at_decisive_exit_and_explains_path() -> None:
    p = prog(
        load(I.SIZE_W, 4, dst=4),
        ins(I.JMP | I.OP_JNE | I.SRC_K, 4, off=2, imm=195),
        mov64(0, 1),
        EXIT,
        mov64(0, 0),
        EXIT,
    )
    v = evaluate(p, "c", 509, 0, "rw")
    assert (v.allowed, v.index, v.return_value, v.path) == (False, 5, 0, (0, 1, 4, 5))
    lines = explain(p, v)
    assert lines[0].endswith("if r4 != 0xc3 goto pc+2    ; taken")
    assert lines[-1].endswith("exit    ; r0 = 0")
    v = evaluate(p, "c", 195, 0, "rw")
    assert (v.allowed, v.index) == (True, 3)
    assert "not taken" in explain(p, v)[0]


# -- UNKNOWN, never a guess ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, fragment",
    [
        ([ins(I.JMP | I.OP_CALL, imm=1), EXIT], "helper function call #1"),
        ([lddw(1, 7, src=1), mov64(0, 1), EXIT], "map"),
        ([ins(I.LD | I.MODE_ABS | I.SIZE_W, imm=0), EXIT], "packet load"),
        ([ins(0xE4, 0), EXIT], "unknown ALU operation"),
        ([ins(0xF5), EXIT], "unknown jump operation"),
        ([ins(I.JMP | I.OP_JA, off=5), EXIT], "outside the program"),
        ([mov64(0, 1)], "runs off the end"),
        ([EXIT], "r0 uninitialised"),
        ([ins(I.ALU64 | I.OP_MOV | I.SRC_X, 0, 2), EXIT], "uninitialised r2"),
        ([ins(I.JMP | I.OP_JA, off=-1)], "step limit"),
        ([ins(I.ST | I.MODE_MEM | I.SIZE_W, 1, imm=0), mov64(0, 1), EXIT], "ctx"),
        ([load(I.SIZE_W, 12), EXIT], "outside the 12-byte ctx"),
        ([load(I.SIZE_W, -8, base=10), EXIT], "uninitialised stack"),
        ([load(I.SIZE_W, 0, base=3), EXIT], "uninitialised"),
        ([mov64(10, 0), EXIT], "frame pointer"),
        ([ins(I.ALU | I.OP_MOV | I.SRC_X, 2, 1), mov64(0, 1), EXIT], "pointer"),
        ([ins(I.ALU64 | I.OP_MOV | I.SRC_X, 0, 1), EXIT], "pointer"),
        ([ins(I.JMP | I.OP_JEQ | I.SRC_K, 1, imm=0, off=0), mov64(0, 1), EXIT], "pointer"),
        ([ins(I.STX | I.MODE_ATOMIC | I.SIZE_DW, 10, 1, off=-8), EXIT], "atomics"),
    ],
)
def test_unsupported_or_undefined_yields_unknown(body: list[Insn], fragment: str) -> None:
    v = evaluate(prog(*body), "c", 195, 255, "rw", step_limit=1000)
    assert v.allowed is None
    assert fragment in v.reason
    assert v.index is not None


def test_r11_is_the_kernels_scratch_register() -> None:
    # what constant blinding emits for "r2 != 195": r11 = rnd ^ 195; r11 ^= rnd; if r2 != r11
    body = [
        load(I.SIZE_W, 4, dst=2),
        mov64(11, 0x1234 ^ 195),
        ins(I.ALU64 | I.OP_XOR | I.SRC_K, 11, imm=0x1234),
        ins(I.JMP | I.OP_JNE | I.SRC_X, 2, 11, off=2),
        mov64(0, 1), EXIT, mov64(0, 0), EXIT,
    ]
    assert evaluate(prog(*body), "c", 195, 0, "rw").allowed is True
    assert evaluate(prog(*body), "c", 196, 0, "rw").allowed is False


@pytest.mark.parametrize("op", [I.OP_XOR, I.OP_SUB])
@pytest.mark.parametrize("cls", [I.ALU, I.ALU64])
def test_self_xor_and_self_sub_zero_even_an_uninitialised_register(op: int, cls: int) -> None:
    # blinding turns "r0 = 0" into "r0 ^= r0" with r0 never written before
    v = evaluate(prog(ins(cls | op | I.SRC_X, 0, 0), EXIT), "c", 195, 255, "rw")
    assert (v.allowed, v.return_value) == (False, 0)
    assert r0_after(mov64(0, 7), mov64(6, 7), ins(cls | op | I.SRC_X, 0, 6)) == 0


@pytest.mark.parametrize("body", [
    [mov64(12, 1), mov64(0, 1), EXIT],
    [ins(I.ALU64 | I.OP_MOV | I.SRC_X, 0, 15), EXIT],
    [ins(I.ALU64 | I.OP_NEG | I.SRC_X, 0, 1), EXIT],
])
def test_invalid_registers_and_encodings_are_unknown_not_crashes(body: list[Insn]) -> None:
    v = evaluate(prog(mov64(0, 0), *body), "c", 1, 1, "r")
    assert v.allowed is None and v.index == 1


def test_empty_program_is_unknown() -> None:
    assert evaluate([], "c", 1, 1, "r").allowed is None


def test_jump_into_the_middle_of_lddw_is_unknown() -> None:
    p = prog(ins(I.JMP | I.OP_JA, off=1), lddw(0, 1), EXIT)
    v = evaluate(p, "c", 1, 1, "r")
    assert v.allowed is None and "not the start of an instruction" in v.reason


def test_evaluate_accepts_raw_bytes() -> None:
    code = I.encode(prog(mov64(0, 1), EXIT))
    assert evaluate(code, "b", 7, 0, "m").allowed is True
    assert evaluate_ctx(code, 0, 0, 0).allowed is True


# -- all programs must allow ------------------------------------------------------------------------

ALLOW = prog(mov64(0, 1), EXIT)
DENY = prog(mov64(0, 0), EXIT)
UNKNOWN = prog(ins(I.JMP | I.OP_CALL, imm=5), EXIT)


@pytest.mark.parametrize(
    "programs, allowed, decisive",
    [
        ([], True, None),
        ([ALLOW], True, None),
        ([ALLOW, ALLOW], True, None),
        ([ALLOW, DENY], False, 1),
        ([UNKNOWN, DENY], False, 1),  # a definite deny decides even next to an unknown
        ([ALLOW, UNKNOWN], None, 1),
    ],
)
def test_evaluate_all(programs: list, allowed: bool | None, decisive: int | None) -> None:
    cv = evaluate_all(programs, "c", 195, 255, "rw")
    assert cv.allowed is allowed
    assert cv.decisive == decisive
    assert len(cv.verdicts) == len(programs)


# -- requests --------------------------------------------------------------------------------------


def test_request_validation_and_ctx() -> None:
    assert DeviceRequest("c", 195, 255, "wr").access_type == (6 << 16) | 2
    assert str(DeviceRequest("b", 8, 0, "mw")) == "b 8:0 wm"
    for bad in [("a", 1, 1, "r"), ("c", -1, 1, "r"), ("c", 1, 1 << 32, "r"), ("c", 1, 1, ""), ("c", 1, 1, "x")]:
        with pytest.raises(ValueError):
            DeviceRequest(*bad)
    assert access_mask("rwm") == 7


def test_access_for_open_matches_kernel_acc_mode() -> None:
    assert access_for_open(os.O_RDONLY) == "r"
    assert access_for_open(os.O_WRONLY) == "w"
    assert access_for_open(os.O_RDWR) == "rw"
    assert access_for_open(os.O_RDONLY | os.O_TRUNC) == "rw"
    assert access_for_open(os.O_PATH) == ""
