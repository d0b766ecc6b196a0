"""The device manager's checkpoint (`device-plugins/kubelet_internal_checkpoint`).

It records which pod/container got which device IDs of which resource and the
plugin's Allocate response (base64 protobuf), i.e. the DeviceSpecs the runtime
was told to add to the container's device cgroup. Two layouts exist: DeviceIDs
as a list (before kubelet 1.20) or as a NUMA-node -> list map.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceEntry:
    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    alloc_resp: bytes = b""


@dataclass
class Checkpoint:
    entries: list[DeviceEntry] = field(default_factory=list)
    registered: dict[str, list[str]] = field(default_factory=dict)


def parse(text: str) -> Checkpoint | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    data = doc.get("Data", doc) if isinstance(doc, dict) else None
    if not isinstance(data, dict):
        return None
    cp = Checkpoint()
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


@dataclass(frozen=True)
class AllocSpec:
    """The device nodes, env and CDI devices a plugin returned for one container."""

    devices: tuple[tuple[str, str, str], ...]  # (container_path, host_path, permissions)
    envs: dict[str, str]
    cdi_devices: tuple[str, ...]


def decode_alloc(raw: bytes) -> AllocSpec | None:
    """Decode a ContainerAllocateResponse with the generated protobuf module, when available."""
    if not raw:
        return None
    try:
        from gpuwarden.grpcapi import deviceplugin_v1beta1_pb2 as pb
    except ImportError:
        return None
    msg = pb.ContainerAllocateResponse()
    try:
        msg.ParseFromString(raw)
    except Exception:
        return None
    return AllocSpec(
        tuple((d.container_path, d.host_path, d.permissions) for d in msg.devices),
        dict(msg.envs),
        tuple(c.name for c in getattr(msg, "cdi_devices", [])),
    )
