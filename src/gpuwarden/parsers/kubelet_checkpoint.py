"""The device manager's checkpoint (`device-plugins/kubelet_internal_checkpoint`).

It records which pod/container got which device IDs of which resource and the
plugin's Allocate response (base64 protobuf), i.e. the DeviceSpecs the runtime
was told to add to the container's device cgroup. Two layouts exist: DeviceIDs
as a list (before kubelet 1.20) or as a NUMA-node -> list map. Newer kubelets
add `BootID` beside `Data` (outside the checksummed part), the boot the file was
written in (kubernetes pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go).
"""

from __future__ import annotations

import base64
import binascii
import json

from msgspec import Struct, field


class DeviceEntry(Struct, frozen=True):
    """One container's devices in the kubelet's device-manager checkpoint."""
    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    alloc_resp: bytes = b""


class Checkpoint(Struct):
    """The kubelet's device-manager checkpoint: allocations and registered devices."""
    entries: list[DeviceEntry] = field(default_factory=list)
    registered: dict[str, list[str]] = field(default_factory=dict)
    boot_id: str = ""  # "" when the kubelet predates the field


def base_device_id(dev_id: str) -> str:
    """A device plugin's device ID without its replica suffix: time-slicing and MPS advertise each GPU
    as `<uuid>::<n>` (`GPU-…::3` -> `GPU-…`)."""
    return dev_id.split("::", 1)[0]


def parse(text: str) -> Checkpoint | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    data = doc.get("Data", doc) if isinstance(doc, dict) else None
    if not isinstance(data, dict):
        return None
    cp = Checkpoint()
    if isinstance(doc, dict) and isinstance(doc.get("BootID"), str):
        cp.boot_id = doc["BootID"]
    entries = data.get("PodDeviceEntries")
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict):
            continue
        ids = e.get("DeviceIDs") or []
        flat: list[str] = []
        if isinstance(ids, dict):
            for v in ids.values():
                flat.extend(str(x) for x in _as_list(v))
        elif isinstance(ids, list):
            flat = [str(x) for x in ids]
        raw = b""
        if isinstance(e.get("AllocResp"), str):
            try:
                raw = base64.b64decode(e["AllocResp"], validate=False)
            except (binascii.Error, ValueError):
                raw = b""
        cp.entries.append(DeviceEntry(str(e.get("PodUID", "")), str(e.get("ContainerName", "")),
                                      str(e.get("ResourceName", "")), tuple(flat), raw))
    reg = data.get("RegisteredDevices") or {}
    if isinstance(reg, dict):
        cp.registered = {str(k): [str(x) for x in _as_list(v)] for k, v in reg.items()}
    return cp


def _as_list(v: object) -> list:
    """A JSON list, or nothing: garbage of another type must not raise (or iterate a string)."""
    return v if isinstance(v, list) else []


class AllocSpec(Struct, frozen=True):
    """What a plugin's Allocate returned for one container: device nodes, env, CDI devices, mounts, annotations.

    Mounts carry the volume-mounts device-list strategy, annotations the cdi-annotations one.
    """

    devices: tuple[tuple[str, str, str], ...]  # (container_path, host_path, permissions)
    envs: dict[str, str]
    cdi_devices: tuple[str, ...]
    mounts: tuple[tuple[str, str, bool], ...] = ()  # (container_path, host_path, read_only)
    annotations: dict[str, str] = field(default_factory=dict)


def decode_alloc(raw: bytes) -> AllocSpec | None:
    """Decode a ContainerAllocateResponse (protobuf wire format); None when it is not one.

    Decoded here rather than with the generated module: importing protobuf costs `gpuwarden
    check` ~30 ms, more than the rest of a small node's check (docs/performance.md). The fields
    (deviceplugin v1beta1): envs = 1 (map<string,string>), mounts = 2 (Mount), devices = 3
    (DeviceSpec: container_path = 1, host_path = 2, permissions = 3), annotations = 4 (map),
    cdi_devices = 5 (CDIDevice: name = 1). As protobuf (upb) does, unknown fields and fields of an
    unexpected wire type are skipped (a map entry holding one is dropped), the last value of a
    repeated scalar wins, and truncated
    data, bad tags and strings that are not UTF-8 make the whole message invalid
    (tests/parsers/test_alloc_decode.py compares both on random input).
    """
    if not raw:
        return None
    try:
        msg = _message(bytes(raw), 0, len(raw), _ALLOC)
    except (ValueError, IndexError, UnicodeDecodeError, RecursionError):
        return None
    envs: dict[str, str] = dict(msg.get(1, []))  # later keys win, as in protobuf
    devices = tuple((d.get(1, ""), d.get(2, ""), d.get(3, "")) for d in msg.get(3, []))
    mounts = tuple((m.get(1, ""), m.get(2, ""), m.get(3, False)) for m in msg.get(2, []))
    return AllocSpec(devices, envs, tuple(c.get(1, "") for c in msg.get(5, [])), mounts, dict(msg.get(4, [])))


# field number -> ("str" | "bool" | ("msg", schema, repeated) | ("map",)); a message decodes to a
# dict: scalars by field number (last wins), repeated messages as lists, maps as [(k, v)]
_STR, _BOOL = "str", "bool"
_MOUNT = {1: _STR, 2: _STR, 3: _BOOL}
_DEVICE = {1: _STR, 2: _STR, 3: _STR}
_CDI = {1: _STR}
_ENTRY = {1: _STR, 2: _STR}
_ALLOC = {1: ("map",), 2: ("msg", _MOUNT), 3: ("msg", _DEVICE), 4: ("map",), 5: ("msg", _CDI)}


def _varint(b: bytes, i: int, end: int, limit: int = 10) -> tuple[int, int]:
    v = shift = 0
    for _ in range(limit):
        if i >= end:
            raise ValueError("truncated varint")
        x = b[i]
        i += 1
        v |= (x & 0x7F) << shift
        if not x & 0x80:
            return v & 0xFFFFFFFFFFFFFFFF, i
        shift += 7
    raise ValueError("varint too long")


def _tag(b: bytes, i: int, end: int) -> tuple[int, int, int]:
    v, i = _varint(b, i, end, 5)
    if v > 0xFFFFFFFF or (v >> 3) == 0:
        raise ValueError("bad tag")
    return v >> 3, v & 7, i


def _skip(b: bytes, i: int, end: int, field: int, wt: int, depth: int = 0) -> int:
    if wt == 0:
        return _varint(b, i, end)[1]
    if wt == 1 or wt == 5:
        i += 8 if wt == 1 else 4
    elif wt == 2:
        n, i = _varint(b, i, end, 5)
        if n > 0x7FFFFFFF:
            raise ValueError("bad length")
        i += n
    elif wt == 3:  # a group: values until its end-group tag (field 0 is allowed inside, as upb does)
        if depth > 64:
            raise ValueError("groups too deep")
        while True:
            v, i = _varint(b, i, end, 5)
            if v > 0xFFFFFFFF:
                raise ValueError("bad tag")
            if v & 7 == 4:
                if v >> 3 != field:
                    raise ValueError("unmatched end group")
                return i
            i = _skip(b, i, end, v >> 3, v & 7, depth + 1)
    else:  # 4: an end-group without its start; 6, 7: no such wire type
        raise ValueError("bad wire type")
    if i > end:
        raise ValueError("truncated field")
    return i


def _message(b: bytes, i: int, end: int, schema: dict) -> dict:
    out: dict = {}
    while i < end:
        field, wt, i = _tag(b, i, end)
        kind = schema.get(field)
        if kind == _STR and wt == 2:
            n, i = _varint(b, i, end, 5)
            if i + n > end:
                raise ValueError("truncated string")
            out[field] = b[i:i + n].decode("utf-8")
            i += n
        elif kind == _BOOL and wt == 0:
            v, i = _varint(b, i, end)
            out[field] = bool(v)
        elif isinstance(kind, tuple) and wt == 2:
            n, i = _varint(b, i, end, 5)
            if i + n > end:
                raise ValueError("truncated message")
            sub = _message(b, i, i + n, _ENTRY if kind[0] == "map" else kind[1])
            if kind[0] == "map":
                if not sub.get(-1):  # upb keeps an entry with unknown fields as unknown data
                    out.setdefault(field, []).append((sub.get(1, ""), sub.get(2, "")))
            else:
                out.setdefault(field, []).append(sub)
            i += n
        else:
            i = _skip(b, i, end, field, wt)
            out[-1] = True  # saw an unknown field (or a known one of another wire type)
    if i != end:
        raise ValueError("field past the end")
    return out
