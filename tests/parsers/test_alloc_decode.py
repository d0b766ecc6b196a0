"""decode_alloc reads a ContainerAllocateResponse without protobuf: it must agree with protobuf
(the generated module, when installed) on valid messages and on garbage alike."""

from __future__ import annotations

import random

import pytest

from gpuwarden.parsers.kubelet_checkpoint import AllocSpec, decode_alloc

pb = pytest.importorskip("gpuwarden.grpcapi.deviceplugin_v1beta1_pb2")


def reference(raw: bytes) -> AllocSpec | None:
    msg = pb.ContainerAllocateResponse()
    try:
        msg.ParseFromString(raw)
    except Exception:
        return None
    return AllocSpec(tuple((d.container_path, d.host_path, d.permissions) for d in msg.devices), dict(msg.envs),
                     tuple(c.name for c in msg.cdi_devices),
                     tuple((m.container_path, m.host_path, m.read_only) for m in msg.mounts), dict(msg.annotations))


def valid(rng: random.Random) -> bytes:
    m = pb.ContainerAllocateResponse()
    for _ in range(rng.randrange(4)):
        m.envs[rng.choice(["A", "NVIDIA_VISIBLE_DEVICES", "é"])] = rng.choice(["x", "GPU-1", "∂"])
    for _ in range(rng.randrange(3)):
        d = m.devices.add()
        d.container_path, d.host_path, d.permissions = rng.choice(["/dev/nvidia0", ""]), "/dev/nvidia0", "rw"
    for _ in range(rng.randrange(2)):
        x = m.mounts.add()
        x.container_path, x.host_path, x.read_only = "/a", "/b", rng.random() < 0.5
    for _ in range(rng.randrange(3)):
        m.annotations[rng.choice(["k", "cdi.k8s.io/nvidia-device-plugin_x"])] = rng.choice(["v", "nvidia.com/gpu=0"])
    for _ in range(rng.randrange(2)):
        m.cdi_devices.add().name = "nvidia.com/gpu=0"
    return m.SerializeToString()


def mutate(rng: random.Random, raw: bytes) -> bytes:
    b = bytearray(raw)
    r = rng.random()
    if r < 0.3 and b:
        for _ in range(rng.randrange(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif r < 0.45:
        b = b[:rng.randrange(len(b) + 1)]
    elif r < 0.6:
        b = bytearray(rng.randrange(256) for _ in range(rng.randrange(40)))
    elif r < 0.7:  # tags of every wire type, groups included
        b += bytes(rng.choice([0x08, 0x10, 0x18, 0x1a, 0x23, 0x24, 0x2c, 0x0b, 0x0c, 0x35, 0x39, 0x3f, 0x00, 0x80, 0xff])
                   for _ in range(rng.randrange(1, 6)))
    elif r < 0.8 and b:
        i = rng.randrange(len(b))
        b = b[:i] + bytes([rng.randrange(256)]) + b[i:]
    return bytes(b)


def test_agrees_with_protobuf_on_random_input() -> None:
    rng = random.Random(20261122)
    for _ in range(20_000):
        raw = mutate(rng, valid(rng))
        assert decode_alloc(raw) == (reference(raw) if raw else None), raw.hex()


@pytest.mark.parametrize("hexdata", ["0000", "0001", "23003524", "2324", "23", "3b3c", "3b00013c", "3b0001", "3b3b3c3c",
                                     "3b3b3c", "3b2c", "3b3c3c", "0b3b3c0c", "1a023b3c", "1a020000", "0a033b003c",
                                     "ffffffff0f", "0a0a0a011a12054750552d310a070a02c3a9880125"])
def test_agrees_with_protobuf_on_edge_cases(hexdata: str) -> None:
    raw = bytes.fromhex(hexdata)
    assert decode_alloc(raw) == reference(raw)
