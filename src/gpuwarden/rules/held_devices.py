"""The device IDs a broken GPU takes down with it: whole, replicas, MIG slices, and the pods holding them.

k8s-device-plugin#1929: the replicas (time-slicing, MPS: `<uuid>::N`) and MIG slices of a broken GPU
are not all marked unhealthy. The findings that say a GPU is lost or unusable (GPU-K8S-012,
GPU-HW-002, GPU-DRV-005) name them from the kubelet's checkpoint, and name the pods that hold them.
"""

from __future__ import annotations

from typing import Any

from msgspec import Struct

from gpuwarden import xid as xidtable
from gpuwarden.facts import NodeFacts
from gpuwarden.facts.xids import GpuRef
from gpuwarden.findings import Affected, Evidence
from gpuwarden.parsers.kubelet_checkpoint import base_device_id

#: device IDs and pods quoted per GPU
MAX_QUOTED = 4


class HeldDevices(Struct, frozen=True):
    """The device IDs the kubelet's checkpoint holds of one broken GPU (k8s-device-plugin#1929: the
    replicas and MIG slices of a broken GPU are broken too), and the pods holding them."""

    ids: tuple[str, ...] = ()  # the GPU's own IDs: whole, replicas `<uuid>::N`, MIG UUIDs it provably owns
    replicas: int = 0
    mig: int = 0
    mig_slices: int | None = None  # MIG devices nvidia-smi lists under the GPU
    mig_unplaced: tuple[str, ...] = ()  # MIG UUIDs of the node whose parent is not established
    pods: tuple[str, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    affected: tuple[Affected, ...] = ()

    def phrase(self) -> str:
        """" and its 4 replica(s) (held by pod(s) ml/a, ml/b)"; " (held by pod(s) ml/a)" for a whole GPU;
        empty when the checkpoint holds nothing of it."""
        parts = ([f"{self.replicas} replica(s)"] if self.replicas else []) + (
            [f"{self.mig} MIG slice(s)"] if self.mig else
            [f"{self.mig_slices} MIG slice(s) (MIG device UUIDs: parent not established)"]
            if self.mig_slices and self.mig_unplaced else [f"{self.mig_slices} MIG slice(s)"] if self.mig_slices else [])
        held = f"held by pod(s) {', '.join(self.pods[:MAX_QUOTED])}" if self.pods else ""
        if not parts:
            return f" ({held})" if held else ""
        return f" and its {' / '.join(parts)}" + (f" ({held})" if held else "")

    def data(self) -> dict[str, Any]:
        return {"devices": list(self.ids), "replicas": self.replicas, "mig": self.mig, "mig_slices": self.mig_slices,
                "mig_not_established": list(self.mig_unplaced), "pods": list(self.pods)}


def held_devices(facts: NodeFacts, ref: GpuRef) -> HeldDevices:
    """Every device ID of the kubelet's checkpoint (RegisteredDevices of nvidia.com/*, PodDeviceEntries)
    that belongs to GPU `ref`: its UUID, its replicas (`<uuid>::N`, parsers.kubelet_checkpoint.base_device_id)
    and its MIG devices. nvidia-smi -q lists a GPU's MIG devices but names no MIG UUID, so a MIG UUID's
    parent is established only when one GPU of the node runs MIG; otherwise it is "not established"."""
    kub = facts.maybe("kubelet")
    cp = kub.checkpoint if kub is not None else None
    driver = facts.maybe("driver")
    smi = list(driver.smi.gpus) if driver is not None and driver.smi is not None else []
    own = next((g for g in smi if xidtable.pci_key(g.bus_id) == ref.key), None)
    slices = own.mig_devices if own is not None else None
    mig_gpus = [xidtable.pci_key(g.bus_id) for g in smi if (g.mig_devices or 0) > 0]
    if cp is None:
        return HeldDevices(mig_slices=slices)
    reg = {i: r for r, ids in cp.registered.items() if r.startswith("nvidia.com/") for i in ids}
    held = {i for e in cp.entries if e.resource.startswith("nvidia.com/") for i in e.device_ids}
    uuid = ref.uuid.lower()
    mine = sorted(i for i in set(reg) | held if uuid and base_device_id(i).lower() == uuid)
    migs = sorted(i for i in set(reg) | held if i.upper().startswith("MIG-"))
    placed, unplaced = [], []
    if migs and mig_gpus == [ref.key]:
        placed = migs  # the node's only GPU running MIG: every MIG device is one of its slices
    elif migs and not (own is not None and not own.mig_devices and own.mig_current.lower() != "enabled"):
        unplaced = migs  # several GPUs run MIG, or nvidia-smi does not show this one: never guessed
    ids = mine + placed
    ev: list[Evidence] = []
    if ids:
        shown = ", ".join(ids[:MAX_QUOTED]) + (f" (+{len(ids) - MAX_QUOTED})" if len(ids) > MAX_QUOTED else "")
        ev.append(Evidence(kub.checkpoint_path, f"{len(ids)} device ID(s) of GPU {ref.uuid or ref.key}: {shown}"
                           + (" (the node's only GPU with MIG devices in nvidia-smi -q)" if placed else "")))
    if unplaced:
        ev.append(Evidence(kub.checkpoint_path, f"{len(unplaced)} MIG device(s) on a node where {len(mig_gpus)} GPUs run "
                                                "MIG: which are this GPU's is not established (nvidia-smi -q names no "
                                                "MIG device UUID)"))
    ctrs = facts.maybe("containers")
    pods: list[str] = []
    aff: list[Affected] = []
    for e in cp.entries:
        mine_here = sorted(set(e.device_ids) & set(ids))
        if not mine_here:
            continue
        pod = ctrs.pod_by_uid(e.pod_uid) if ctrs is not None else None
        who = f"{pod.namespace}/{pod.name}" if pod is not None else f"pod {e.pod_uid}"
        if who not in pods:
            pods.append(who)
            aff.append(Affected("pod", pod.name if pod is not None else e.pod_uid, pod.namespace if pod is not None else "",
                                e.pod_uid, detail=f"container {e.container} holds {', '.join(mine_here[:2])} of the broken GPU"))
        ev.append(Evidence(kub.checkpoint_path, f"PodDeviceEntries: {who} container {e.container} holds "
                                                f"{', '.join(mine_here[:MAX_QUOTED])} ({e.resource})"))
    return HeldDevices(tuple(ids), sum(1 for i in mine if "::" in i), len(placed), slices, tuple(unplaced),
                       tuple(pods), tuple(ev[:MAX_QUOTED + 2]), tuple(aff))
