"""Decoding, encoding and printing of eBPF instructions."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gpuwarden.bpf import insn as I

FIXTURE = Path(__file__).parent / "fixtures" / "cgroup_device_xlated.json"


def _fixture_codes() -> list[bytes]:
    doc = json.loads(FIXTURE.read_text())
    recs = {**doc["programs"], **doc["extra"]}
    return [bytes.fromhex("".join(r[k])) for r in recs.values() for k in ("submitted", "xlated")]


def test_decode_encode_roundtrip_on_recorded_programs() -> None:
    for code in _fixture_codes():
        insns = I.decode(code)
        assert I.encode(insns) == code
        assert [i.index for i in insns] == list(range(len(code) // 8))  # no lddw in these


def test_lddw_takes_two_slots_and_keeps_64_bits() -> None:
    code = bytes.fromhex("1801000078563412" "00000000f0debc9a" "bf10000000000000" "9500000000000000")
    insns = I.decode(code)
    assert [(i.index, i.wide) for i in insns] == [(0, True), (2, False), (3, False)]
    assert insns[0].imm == 0x9ABCDEF012345678 and insns[0].dst == 1
    assert insns[1].next_index == 3
    assert I.encode(insns) == code
    assert "r1 = 0x9abcdef012345678 ll" in I.format_insn(insns[0])


def test_decode_rejects_partial_instructions() -> None:
    with pytest.raises(I.InsnDecodeError):
        I.decode(b"\x95" + b"\0" * 6)
    with pytest.raises(I.InsnDecodeError):
        I.decode(bytes.fromhex("1801000078563412"))  # lddw without its second half


def test_random_bytes_roundtrip() -> None:
    rng = random.Random(1234)
    for _ in range(200):
        slots = []
        for _ in range(rng.randrange(1, 20)):
            code = rng.randrange(256)
            if code == 0x18:
                code = 0x95
            slots.append(bytes([code]) + rng.randbytes(7))
        data = b"".join(slots)
        assert I.encode(I.decode(data)) == data


@pytest.mark.parametrize(
    "hexcode, text",
    [
        ("6112000000000000", "r2 = *(u32 *)(r1 +0)"),
        ("6912000000000000", "r2 = *(u16 *)(r1 +0)"),
        ("54020000ffff0000", "w2 &= 65535"),
        ("7403000010000000", "w3 >>= 16"),
        ("bc31000000000000", "w1 = w3"),
        ("5d31020000000000", "if r1 != r3 goto pc+2"),
        ("5e63040000000000", "if w3 != w6 goto pc+4"),
        ("55040300c3000000", "if r4 != 0xc3 goto pc+3"),
        ("b700000001000000", "r0 = 1"),
        ("b400000000000000", "w0 = 0"),
        ("0500010000000000", "goto pc+1"),
        ("9500000000000000", "exit"),
        ("8500000001000000", "call helper 1"),
        ("7b1af8ff00000000", "*(u64 *)(r10 -8) = r1"),
        ("620af0ff07000000", "*(u32 *)(r10 -16) = 7"),
        ("1502ffffffffffff", "if r2 == -1 goto pc-1"),
        ("c700000003000000", "r0 s>>= 3"),
        ("87000000ffffffff", "r0 = -r0"),
    ],
)
def test_format_reads_like_bpftool(hexcode: str, text: str) -> None:
    (ins,) = I.decode(bytes.fromhex(hexcode))
    assert I.format_insn(ins) == f"   0: ({ins.code:02x}) {text}"


def test_jump_targets() -> None:
    ja, jne, gotol, ex = I.decode(bytes.fromhex("0500030000000000" "5502fdff02000000" "0600000005000000" "9500000000000000"))
    assert ja.jump_target() == 4
    assert jne.jump_target() == 1 + 1 - 3
    assert gotol.jump_target() == 2 + 1 + 5  # JMP32|JA: offset in imm
    assert ex.jump_target() is None and ex.is_exit()


def test_reindex_counts_wide_slots() -> None:
    insns = I.decode(bytes.fromhex("1801000001000000" "0000000000000000" "9500000000000000"))
    moved = I.reindex(reversed(insns))
    assert [(i.index, i.wide) for i in moved] == [(0, False), (1, True)]
