"""The two DRA checkpoints of a node: the kubelet's claim state and the NVIDIA DRA driver's.

The kubelet's `dra_manager_state` (kubernetes pkg/kubelet/cm/dra/state): `{"Data": "<JSON>",
"Checksum": N}` whose Data is `{"kind": "DRACheckpoint", "apiVersion":
"checkpoint.dra.kubelet.k8s.io/v1", "Entries": [{ClaimUID, ClaimName, Namespace, PodUIDs: {uid: {}},
DriverState: {driver: {Devices: [{PoolName, DeviceName, RequestNames, CDIDeviceIDs}]}}}]}` (kubelet
1.31+); before, `{"version": "v1", "entries": [{DriverName, ClaimUID, ClaimName, Namespace,
PodUIDs, CDIDevices: {driver: [ids]}}], "checksum": N}`.

The driver's `plugins/gpu.nvidia.com/checkpoint.json` (dra-driver-nvidia-gpu
cmd/gpu-kubelet-plugin/checkpointv.go): `{"checksum", "v1", "v2": {"preparedClaims": {claimUID:
{checkpointState, name, namespace, preparedDevices: [{devices: [{gpu: {info: {uuid}, device:
{DeviceName, PoolName, Requests, CDIDeviceIDs}}} | {mig: {concrete: {...}, device: {...}}}]}]}},
"nodeBootID"}}`; a V1-only file lists `preparedClaims` without names or state.

Checksums are not verified (gpuwarden reads, never trusts, and reports what it read); garbage gives
None or fewer entries, never an exception. A shape neither writer can produce (a JSON object with a
key twice; the kubelet's entries, which it keeps in a map by claim UID, naming a claim twice) is
damage: the file gives no claim, and its `problem` says so once, whatever the number of repeats.
"""

from __future__ import annotations

import json
from collections import Counter

from msgspec import Struct, field


class ClaimDevice(Struct, frozen=True):
    """A device allocated to a resource claim."""
    driver: str
    pool: str
    device: str  # e.g. "gpu-0"
    cdi_ids: tuple[str, ...]  # e.g. "k8s.gpu.nvidia.com/claim=<uid>-gpu-0"
    uuid: str = ""  # the GPU's UUID (driver checkpoint only; a MIG device's parent)
    kind: str = ""  # "gpu" | "mig" | "vfio" | "" (driver checkpoint only)


class KubeletClaim(Struct):
    """A claim in the kubelet's DRA manager checkpoint."""
    uid: str
    name: str
    namespace: str
    pod_uids: tuple[str, ...]
    devices: list[ClaimDevice] = field(default_factory=list)
    #: the drivers with allocation results in the claim; one without devices has not prepared it (yet)
    drivers: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.name else self.uid


class KubeletState(Struct):
    """The kubelet's DRA manager checkpoint: its claims, or why none is taken from it."""
    claims: list[KubeletClaim]
    problem: str = ""  # an impossible shape (then `claims` is empty)
    #: with a problem: the pods its entries name, whose containers nothing may be concluded about
    pod_uids: tuple[str, ...] = ()


class PreparedClaim(Struct):
    """A claim in a DRA driver's own checkpoint, with its prepare state."""
    uid: str
    name: str
    namespace: str
    state: str  # "PrepareStarted" | "PrepareCompleted" | "" (V1: completed)
    devices: list[ClaimDevice] = field(default_factory=list)


class DriverCheckpoint(Struct):
    """A DRA driver's checkpoint of prepared claims."""
    claims: dict[str, PreparedClaim]
    boot_id: str = ""
    problem: str = ""  # an impossible shape (then `claims` is empty)


def _obj(v: object) -> dict:
    return v if isinstance(v, dict) else {}


def _list(v: object) -> list:
    return v if isinstance(v, list) else []


def _pods(v: object) -> dict | list:
    """An entry's PodUIDs: a map (kubelet 1.31+) or a list."""
    return v if isinstance(v, (dict, list)) else []


def _strs(v: object) -> tuple[str, ...]:
    return tuple(str(x) for x in _list(v) if isinstance(x, (str, int)))


class _Repeated(ValueError):
    """A JSON object with a key twice: Go's encoder never writes one (json.loads would keep the last)."""


def _unique(pairs: list[tuple[str, object]]) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _Repeated(k)
            seen.add(k)
    return d


def _loads(text: str) -> tuple[object, str]:
    """(document, "") or (None, why it is impossible); (None, "") for what is not JSON."""
    try:
        return json.loads(text, object_pairs_hook=_unique), ""
    except _Repeated as exc:
        return None, f"a JSON object has the key {str(exc)[:80]!r} twice: no Go encoder writes that"
    except (ValueError, RecursionError):
        return None, ""


def _repeats(uids: list[str]) -> str:
    """Why a list of claim UIDs that must be unique is not, or ""."""
    twice = [(u, n) for u, n in Counter(uids).most_common() if n > 1]
    if not twice:
        return ""
    u, n = twice[0]
    return (f"{sum(n for _, n in twice) - len(twice)} entries repeat {len(twice)} claim UID(s) ({u[:64]!r} {n} "
            "times): the kubelet keeps this state in a map by claim UID, so it never writes a repeat")


def parse_kubelet(text: str) -> KubeletState | None:
    """The claims of a `dra_manager_state`, or None when it is not one."""
    doc, why = _loads(text)
    if why:
        return KubeletState([], why)
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("Data"), str):
        data, why = _loads(doc["Data"])
        if why:
            return KubeletState([], f"Data: {why}")
        if not isinstance(data, dict):
            return None
        entries, new = data.get("Entries"), True
    elif "entries" in doc or "version" in doc:
        entries, new = doc.get("entries"), False
    else:
        return None
    entries = [e for e in _list(entries) if isinstance(e, dict) and isinstance(e.get("ClaimUID"), str)]
    why = _repeats([e["ClaimUID"] for e in entries])
    if why:
        return KubeletState([], why, tuple(sorted({str(p) for e in entries for p in _pods(e.get("PodUIDs"))})))
    out: list[KubeletClaim] = []
    for e in entries:
        claim = KubeletClaim(e["ClaimUID"], str(e.get("ClaimName") or ""), str(e.get("Namespace") or ""),
                             tuple(sorted({str(p) for p in _pods(e.get("PodUIDs"))})))
        if new:
            claim.drivers = tuple(sorted(str(d) for d in _obj(e.get("DriverState"))))
            for driver, st in _obj(e.get("DriverState")).items():
                for d in _list(_obj(st).get("Devices")):
                    d = _obj(d)
                    claim.devices.append(ClaimDevice(str(driver), str(d.get("PoolName") or ""),
                                                     str(d.get("DeviceName") or ""), _strs(d.get("CDIDeviceIDs"))))
        else:
            claim.drivers = tuple(sorted({str(d) for d in _obj(e.get("CDIDevices"))} | (
                {e["DriverName"]} if isinstance(e.get("DriverName"), str) else set())))
            for driver, ids in _obj(e.get("CDIDevices")).items():
                claim.devices.append(ClaimDevice(str(driver), "", "", _strs(ids)))
        out.append(claim)
    return KubeletState(out)


def _prepared_device(raw: object, driver: str) -> ClaimDevice | None:
    raw = _obj(raw)
    for kind in ("gpu", "mig", "vfio"):
        part = raw.get(kind)
        if not isinstance(part, dict):
            continue
        dev = _obj(part.get("device"))
        uuid = ""
        if kind == "gpu":
            uuid = str(_obj(part.get("info")).get("uuid") or "")
        elif kind == "mig":
            c = _obj(part.get("concrete"))
            uuid = str(c.get("parentUUID") or c.get("ParentUUID") or "")
        return ClaimDevice(driver, str(dev.get("PoolName") or ""), str(dev.get("DeviceName") or ""),
                           _strs(dev.get("CDIDeviceIDs")), uuid, kind)
    return None


def parse_driver(text: str, driver: str = "gpu.nvidia.com") -> DriverCheckpoint | None:
    """The prepared claims of the NVIDIA DRA driver's checkpoint.json, or None when it is not one."""
    doc, why = _loads(text)
    if why:
        return DriverCheckpoint({}, problem=why)
    if not isinstance(doc, dict) or not ({"v1", "v2", "checksum"} & doc.keys()):
        return None
    v2, v1 = doc.get("v2"), doc.get("v1")
    body = v2 if isinstance(v2, dict) else _obj(v1)
    out = DriverCheckpoint({}, str(body.get("nodeBootID") or "") if isinstance(v2, dict) else "")
    for uid, pc in _obj(body.get("preparedClaims")).items():
        pc = _obj(pc)
        claim = PreparedClaim(str(uid), str(pc.get("name") or ""), str(pc.get("namespace") or ""),
                              str(pc.get("checkpointState") or ("" if isinstance(v2, dict) else "PrepareCompleted")))
        for group in _list(pc.get("preparedDevices")):
            for d in _list(_obj(group).get("devices")):
                dev = _prepared_device(d, driver)
                if dev is not None:
                    claim.devices.append(dev)
        out.claims[claim.uid] = claim
    return out
