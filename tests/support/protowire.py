"""Protobuf wire bytes built by hand from field numbers: what the upstream .proto says, independent
of the generated code under test (the wire-compatibility tests of tests/grpcapi)."""

from __future__ import annotations


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def vi(field: int, n: int) -> bytes:
    """A varint field (wire type 0)."""
    return varint(field << 3) + varint(n)


def ld(field: int, payload: bytes | str) -> bytes:
    """A length-delimited field (wire type 2): a string, bytes or an embedded message."""
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(field << 3 | 2) + varint(len(data)) + data
