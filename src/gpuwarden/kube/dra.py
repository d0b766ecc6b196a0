"""The API side of dynamic resource allocation (resource.k8s.io): what a node's DRA world looks like
to the scheduler, read at the cost of the node's own objects, and the one write gpuwarden makes
there, a DeviceTaintRule on one device.

Reads (each selected, never a cluster-wide list per node):
- the node's ResourceSlices of one driver: `fieldSelector=spec.nodeName=<node>,spec.driver=<driver>`
  (both are selectable fields of kube-apiserver's resourceslices);
- the ResourceClaims of the node's pods: one GET per claim named in the pod's
  `status.resourceClaimStatuses` (the kubelet prepares exactly those);
- a pod's FailedPrepareDynamicResources Events: field-selected by `involvedObject` and `reason`,
  in the pod's namespace;
- gpuwarden's own DeviceTaintRules of the node: label-selected (`gpuwarden.io/node=<node>`).
The pods' `status.containerStatuses[].allocatedResourcesStatus` (KEP-4680) come with the pods the
agent lists anyway (`device_health`).

DeviceTaintRule is resource.k8s.io/v1alpha3 from Kubernetes 1.33, v1beta2 from 1.36 and v1 from
1.37 (KEP-5055); `taint_rule_version` asks the server which it serves, newest first.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Iterable
from urllib.parse import quote

from msgspec import Struct, field

from gpuwarden.kube.errors import KubeError

GROUP = "resource.k8s.io"
#: the NVIDIA DRA driver's name, which is also its kubelet plugin's socket directory
GPU_DRIVER = "gpu.nvidia.com"
SLICES = f"/apis/{GROUP}/v1/resourceslices"
#: newest first: the version of DeviceTaintRule a server serves (1.37: v1; 1.36: v1beta2; 1.33: v1alpha3)
TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
FAILED_PREPARE = "FailedPrepareDynamicResources"
#: gpuwarden's DeviceTaintRules carry these: the node label selects a node's own rules, the device
#: annotation names the device as the finding did
NODE_LABEL = "gpuwarden.io/node"
MANAGED_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpuwarden"
DEVICE_ANNOTATION = "gpuwarden.io/device"
FINDING_ANNOTATION = "gpuwarden.io/finding"
TAINT_KEY = "gpuwarden.io/unhealthy"
EFFECTS = ("NoSchedule", "NoExecute")


def _q(s: str) -> str:
    return quote(s, safe="")


class DeviceRef(Struct, frozen=True):
    """One device as ResourceSlices and DeviceTaintRules name it: driver, pool, device name."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"

    @classmethod
    def parse(cls, resource_id: str) -> "DeviceRef | None":
        """`<driver>/<pool>/<device>`, the resourceID of allocatedResourcesStatus (None on garbage).
        The pool may itself contain slashes; the driver and the device may not."""
        driver, _, rest = str(resource_id).partition("/")
        pool, _, device = rest.rpartition("/")
        if not (driver and pool and device):
            return None
        return cls(driver, pool, device)


class SliceDevice(Struct, frozen=True):
    ref: DeviceRef
    slice_name: str
    uuid: str = ""  # the driver's "uuid" attribute (the GPU's NVML UUID), when it publishes one
    taints: tuple[dict, ...] = ()
    pci: str = ""  # the "pcieBusID" attribute, normalised by `pci_key`

    def names(self) -> set[str]:
        """What a finding may call this GPU: its UUID or its PCI address."""
        return {n for n in (self.uuid, self.pci) if n}


_PCI = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([0-9a-f]{2})(?:\.[0-7])?$")


def pci_key(text: str) -> str:
    """`0000:3b:00` for any spelling of a PCI address (NVML's `00000000:3B:00.0`, sysfs's
    `0000:3b:00.0`, the kernel's `PCI:0000:3b:00`); "" when it is none."""
    m = _PCI.search(str(text).strip().lower().removeprefix("pci:"))
    if not m:
        return ""
    return f"{int(m.group(1) or '0', 16):04x}:{m.group(2)}:{m.group(3)}"


class NodeSlices(Struct):
    """A node's ResourceSlices of one driver, with the devices of each pool's newest generation."""

    node: str
    driver: str
    slices: list[dict] = field(default_factory=list)
    devices: list[SliceDevice] = field(default_factory=list)
    #: pool name -> the highest generation seen (the scheduler ignores older slices of a pool)
    generations: dict[str, int] = field(default_factory=dict)

    def names(self) -> list[str]:
        return sorted(str(_d(s.get("metadata")).get("name", "")) for s in self.slices)

    def created(self) -> list[str]:
        """The slices' creationTimestamps as written."""
        return [str(_d(s.get("metadata")).get("creationTimestamp") or "") for s in self.slices]

    def device(self, name: str, pool: str = "") -> SliceDevice | None:
        for d in self.devices:
            if d.ref.device == name and (not pool or d.ref.pool == pool):
                return d
        return None


def _d(v: Any) -> dict:
    """v when it is a mapping, else {}: API objects are read as they come, garbage included."""
    return v if isinstance(v, dict) else {}


def _l(v: Any) -> list:
    return v if isinstance(v, list) else []


def _int(v: Any, default: int = 0) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _attr_string(attrs: Any, name: str) -> str:
    """A device attribute's string value (`{"uuid": {"string": "GPU-…"}}`); "" when absent or not a string."""
    if not isinstance(attrs, dict):
        return ""
    for key in (name, f"{GPU_DRIVER}/{name}"):
        v = attrs.get(key)
        if isinstance(v, dict) and isinstance(v.get("string"), str):
            return v["string"]
    return ""


def parse_slices(node: str, driver: str, slices: Iterable[Any]) -> NodeSlices:
    """The devices of a node's slices (pure: garbage items are skipped, never raised on)."""
    out = NodeSlices(node, driver)
    good = [s for s in slices if isinstance(s, dict) and isinstance(s.get("spec"), dict)]
    out.slices = good
    for s in good:
        pool = _d(s["spec"].get("pool"))
        name = str(pool.get("name") or "")
        out.generations[name] = max(out.generations.get(name, 0), _int(pool.get("generation")))
    for s in good:
        spec = s["spec"]
        pool = _d(spec.get("pool"))
        pname = str(pool.get("name") or "")
        if _int(pool.get("generation")) < out.generations.get(pname, 0):
            continue
        for d in _l(spec.get("devices")):
            if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not d["name"]:
                continue
            taints = tuple(t for t in _l(d.get("taints")) if isinstance(t, dict) and t.get("key"))
            attrs = d.get("attributes")
            out.devices.append(SliceDevice(DeviceRef(str(spec.get("driver") or driver), pname, d["name"]),
                                           str(_d(s.get("metadata")).get("name") or ""),
                                           _attr_string(attrs, "uuid"), taints,
                                           pci_key(_attr_string(attrs, "pcieBusID"))))
    return out


def node_slices(kube: Any, node: str, driver: str = GPU_DRIVER) -> NodeSlices:
    """The node's ResourceSlices of `driver`, field-selected (O(this node), not O(cluster))."""
    items = kube.iter_items(SLICES, field_selector=f"spec.nodeName={node},spec.driver={driver}", cached=True)
    return parse_slices(node, driver, items)


def pod_claims(kube: Any, pod: dict) -> list[dict]:
    """The ResourceClaims a pod was given (`status.resourceClaimStatuses`), one GET each; a claim
    that is gone is left out."""
    md = _d(pod.get("metadata"))
    ns = md.get("namespace") or ""
    out = []
    for st in _l(_d(pod.get("status")).get("resourceClaimStatuses")):
        name = st.get("resourceClaimName") if isinstance(st, dict) else None
        if not name or not ns:
            continue
        claim = kube.get_or_none(f"/apis/{GROUP}/v1/namespaces/{_q(ns)}/resourceclaims/{_q(name)}")
        if claim is not None:
            out.append(claim)
    return out


def claim_devices(claim: dict) -> list[DeviceRef]:
    """The devices a claim was allocated (`status.allocation.devices.results`)."""
    alloc = _d(_d(_d(claim).get("status")).get("allocation"))
    out = []
    for r in _l(_d(alloc.get("devices")).get("results")):
        if isinstance(r, dict) and r.get("driver") and r.get("pool") and r.get("device"):
            out.append(DeviceRef(str(r["driver"]), str(r["pool"]), str(r["device"])))
    return out


def reserved_for(claim: dict) -> list[str]:
    """The pod UIDs a claim is reserved for."""
    return [str(r.get("uid")) for r in _l(_d(_d(claim).get("status")).get("reservedFor"))
            if isinstance(r, dict) and r.get("resource") == "pods" and r.get("uid")]


class DeviceHealth(Struct, frozen=True):
    """One device's health as the kubelet wrote it into a pod's status (KEP-4680)."""

    pod: str  # namespace/name
    pod_uid: str
    container: str
    claim: str  # "claim:<claim>/<request>" as the kubelet names it
    ref: DeviceRef
    health: str  # Healthy | Unhealthy | Unknown


def device_health(pods: Iterable[Any]) -> list[DeviceHealth]:
    """Every DRA device health entry of the pods' containers (`allocatedResourcesStatus`); entries
    of the device-plugin world (`nvidia.com/gpu`) and garbage are skipped."""
    out = []
    for pod in pods:
        md, st = _d(_d(pod).get("metadata")), _d(_d(pod).get("status"))
        ref = f"{md.get('namespace', '')}/{md.get('name', '')}"
        for cs in _l(st.get("containerStatuses")) + _l(st.get("initContainerStatuses")):
            for ars in _l(_d(cs).get("allocatedResourcesStatus")):
                if not str(_d(ars).get("name", "")).startswith("claim:"):
                    continue
                for r in _l(ars.get("resources")):
                    dev = DeviceRef.parse(str(_d(r).get("resourceID", "")))
                    if dev is not None:
                        out.append(DeviceHealth(ref, str(md.get("uid", "")), str(cs.get("name", "")),
                                                str(ars["name"]), dev, str(r.get("health") or "Unknown")))
    return out


def prepare_failures(kube: Any, pod: dict) -> list[dict]:
    """The pod's FailedPrepareDynamicResources Events (the kubelet could not prepare its claims),
    field-selected in the pod's namespace."""
    md = pod.get("metadata") or {}
    if not md.get("namespace") or not md.get("name"):
        return []
    sel = f"involvedObject.kind=Pod,involvedObject.name={md['name']},reason={FAILED_PREPARE}"
    if md.get("uid"):
        sel += f",involvedObject.uid={md['uid']}"
    return kube.list_events(md["namespace"], field_selector=sel)


# -- DeviceTaintRules -----------------------------------------------------------------------------


def taint_rule_version(kube: Any) -> str | None:
    """The newest resource.k8s.io version that serves devicetaintrules; None when none does."""
    for v in TAINT_RULE_VERSIONS:
        try:
            doc = kube.get_or_none(f"/apis/{GROUP}/{v}")
        except KubeError as exc:
            if exc.status in (403, 404, 405):
                continue
            raise
        if doc and any(r.get("name") == "devicetaintrules" for r in doc.get("resources") or []):
            return v
    return None


def taint_rules_path(version: str, name: str = "") -> str:
    return f"/apis/{GROUP}/{version}/devicetaintrules" + (f"/{_q(name)}" if name else "")


_DNS = re.compile(r"[^a-z0-9-]+")


def taint_rule_name(device: DeviceRef) -> str:
    """A stable DNS-1123 name for gpuwarden's rule on one device: readable, and unique through a
    hash of the full reference (a long node or device name is cut, never confused with another)."""
    digest = hashlib.sha256(str(device).encode()).hexdigest()[:10]
    stem = _DNS.sub("-", f"{device.pool}-{device.device}".lower()).strip("-")[:40].strip("-")
    return f"gpuwarden-{stem}-{digest}" if stem else f"gpuwarden-{digest}"


def taint_rule(device: DeviceRef, node: str, effect: str = "NoSchedule", key: str = TAINT_KEY,
               value: str = "", finding: str = "", version: str = "v1beta2") -> dict:
    """The DeviceTaintRule that fences exactly one device (driver, pool and device all set)."""
    if effect not in EFFECTS:
        raise ValueError(f"device taint effect must be one of {EFFECTS}, not {effect!r}")
    taint = {"key": key, "effect": effect}
    if value:
        taint["value"] = value
    return {
        "apiVersion": f"{GROUP}/{version}", "kind": "DeviceTaintRule",
        "metadata": {"name": taint_rule_name(device),
                     "labels": {NODE_LABEL: node, MANAGED_LABEL: MANAGED_BY},
                     "annotations": {DEVICE_ANNOTATION: str(device), **({FINDING_ANNOTATION: finding} if finding else {})}},
        "spec": {"deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.device},
                 "taint": taint},
    }


def own_taint_rules(kube: Any, node: str, version: str) -> list[dict]:
    """gpuwarden's DeviceTaintRules of this node (label-selected), each with its apiVersion (list
    items carry none)."""
    out = []
    for r in kube.iter_items(taint_rules_path(version), label_selector=f"{NODE_LABEL}={node},{MANAGED_LABEL}={MANAGED_BY}",
                             cached=True):
        r.setdefault("apiVersion", f"{GROUP}/{version}")
        r.setdefault("kind", "DeviceTaintRule")
        out.append(r)
    return out


def rule_device(rule: dict) -> DeviceRef | None:
    """The one device a rule selects, or None when it selects more (or less) than one."""
    sel = _d(_d(_d(rule).get("spec")).get("deviceSelector"))
    if not (sel.get("driver") and sel.get("pool") and sel.get("device")):
        return None
    return DeviceRef(str(sel["driver"]), str(sel["pool"]), str(sel["device"]))


def create_taint_rule(kube: Any, rule: dict) -> str:
    """POST a DeviceTaintRule built by `taint_rule`; says what was done. Idempotent: a rule of the
    same name (ours on the same device) is left as it is."""
    version = str(rule.get("apiVersion", "")).rpartition("/")[2]
    name = (rule.get("metadata") or {}).get("name", "")
    dev = rule_device(rule)
    taint = (rule.get("spec") or {}).get("taint") or {}
    try:
        kube.request("POST", taint_rules_path(version), rule)
    except KubeError as exc:
        if exc.conflict:
            return f"device {dev} already has DeviceTaintRule {name}"
        raise
    return f"created DeviceTaintRule {name} ({taint.get('key')}:{taint.get('effect')}) on device {dev}"


def delete_taint_rule(kube: Any, rule: dict) -> str:
    """DELETE a DeviceTaintRule read back from the API (with its uid as a precondition: a rule
    created since under the same name is not ours to remove)."""
    version = str(rule.get("apiVersion", "") or "").rpartition("/")[2]
    md = rule.get("metadata") or {}
    name, uid = md.get("name", ""), md.get("uid", "")
    body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}} if uid else None
    try:
        kube.request("DELETE", taint_rules_path(version, name), body)
    except KubeError as exc:
        if exc.not_found:
            return f"DeviceTaintRule {name} is gone already"
        raise
    return f"deleted DeviceTaintRule {name} of device {rule_device(rule)}"


def fence_device(kube: Any, device: DeviceRef, node: str, effect: str = "NoSchedule", key: str = TAINT_KEY,
                 value: str = "", finding: str = "") -> str:
    """Fence one GPU: create gpuwarden's DeviceTaintRule on exactly this device, in the newest
    version the server serves. The one-call form for other remedies (a lost GPU's fence)."""
    version = taint_rule_version(kube)
    if version is None:
        raise KubeError(404, "NotFound", f"the API server serves no devicetaintrules in {GROUP}")
    return create_taint_rule(kube, taint_rule(device, node, effect, key, value, finding, version))


def unfence_device(kube: Any, device: DeviceRef, node: str) -> str:
    """Remove gpuwarden's DeviceTaintRule of this device (found by the node's label), if any."""
    version = taint_rule_version(kube)
    if version is None:
        raise KubeError(404, "NotFound", f"the API server serves no devicetaintrules in {GROUP}")
    for r in own_taint_rules(kube, node, version):
        if rule_device(r) == device:
            return delete_taint_rule(kube, r)
    return f"device {device} has no DeviceTaintRule of gpuwarden"
