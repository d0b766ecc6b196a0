"""A pod the kubelet rejected at admission for its GPUs, as the API server shows it.

When the kubelet cannot admit a pod it records an Event and sets the pod's status at once
(`Kubelet.rejectPod`): phase `Failed`, the admit handler's reason, and the message
`"Pod was rejected: " + message`. A device-plugin allocation that fails (the device manager's
GetPreferredAllocation or Allocate call, an unhealthy or missing device) goes through
`pkg/kubelet/cm/admission.GetPodAdmitResult`: reason `UnexpectedAdmissionError`, message
`Allocate failed due to <error>, which is unexpected`. The status manager gives the status its
`startTime` when it first writes it, so a rejected pod's startTime is the time of the rejection
(one-second resolution). That status is on the pod whatever the kubelet's log verbosity; the kubelet
writes its own event line only at V3.

`gpu_rejection` keeps a rejection only when its words name a GPU: NVML's "GPU is lost", a GPU or MIG
device ID (`GPU-<uuid>`, a time-slicing / MPS replica `GPU-<uuid>::N`, `MIG-<uuid>`), or a GPU
resource (`nvidia.com/gpu`, its renamed replicas `nvidia.com/gpu.shared`, MIG slices
`nvidia.com/mig-<profile>`), and the pod asks for an `nvidia.com/` resource. A refusal for CPU,
memory or another extended resource, `OutOf<resource>` (the node's capacity, not a failing
allocation), and an allocation error that names no GPU (a plugin call that timed out) are not GPU
rejections. Pure: a pod is a decoded JSON object, garbage gives None, never an exception.
"""

from __future__ import annotations

import re
from typing import Any

from msgspec import Struct, field

from gpuwarden.parsers import lazyre
from gpuwarden.parsers.wallclock import rfc3339_epoch

#: pod.status.reason of a pod whose device allocation failed at admission (admission.ErrorReasonUnexpected)
UNEXPECTED = "UnexpectedAdmissionError"
#: Kubelet.rejectPod's prefix of pod.status.message
REJECTED_PREFIX = "Pod was rejected: "
#: the NVIDIA device plugin's whole GPUs, renamed replicas and MIG slices
GPU_RESOURCE_RE = lazyre.compile(r"^nvidia\.com/(?:gpu(?:\.[A-Za-z0-9_.-]+)?|mig-[A-Za-z0-9_.+-]+)$")
_RESOURCE_IN_TEXT = lazyre.compile(r"nvidia\.com/(?:gpu(?:\.[A-Za-z0-9_-]+)*|mig-[A-Za-z0-9_+-]+(?:\.[A-Za-z0-9_+-]+)*)")
_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_DEVICE_ID = lazyre.compile(rf"\b(?:MIG-)?GPU-{_UUID}(?:::[0-9]+)?|\bMIG-{_UUID}")
_LOST = lazyre.compile(r"GPU is lost", re.I)
#: a message is quoted up to this many characters
MAX_MESSAGE = 600


class Rejection(Struct, frozen=True):
    """One pod rejected at admission for a GPU."""

    namespace: str
    name: str
    uid: str
    #: epoch seconds of the rejection (status.startTime), else the pod's creation (the rejection came later)
    time: float | None
    time_source: str
    reason: str
    message: str
    #: the GPU resources the pod asks for
    resources: tuple[str, ...]
    #: what in the message names a GPU: "GPU is lost", device IDs, resource names
    names: tuple[str, ...] = field(default=())
    device_ids: tuple[str, ...] = field(default=())
    lost: bool = False

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def _requested(spec: dict) -> list[str]:
    out: list[str] = []
    for key in ("initContainers", "containers"):
        cs = spec.get(key)
        for c in cs if isinstance(cs, list) else []:
            res = c.get("resources") if isinstance(c, dict) else None
            for part in ("limits", "requests"):
                m = res.get(part) if isinstance(res, dict) else None
                for name in m if isinstance(m, dict) else []:
                    if isinstance(name, str) and name.startswith("nvidia.com/") and name not in out:
                        out.append(name)
    return out


def _time(pod: dict) -> tuple[float | None, str]:
    st = pod.get("status") if isinstance(pod.get("status"), dict) else {}
    md = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    for src, where in ((st.get("startTime"), "status.startTime"), (md.get("creationTimestamp"), "metadata.creationTimestamp")):
        t = rfc3339_epoch(src) if isinstance(src, str) else None
        if t is not None:
            return t, where
    return None, ""


def gpu_rejection(pod: Any) -> Rejection | None:
    """The pod's rejection at admission for a GPU, or None (not rejected, rejected for something else, garbage)."""
    if not isinstance(pod, dict):
        return None
    st = pod.get("status")
    md = pod.get("metadata")
    spec = pod.get("spec")
    if not isinstance(st, dict) or not isinstance(md, dict) or not isinstance(spec, dict):
        return None
    if st.get("phase") != "Failed" or st.get("reason") != UNEXPECTED:
        return None
    msg = st.get("message")
    if not isinstance(msg, str) or not msg:
        return None
    text = msg[len(REJECTED_PREFIX):] if msg.startswith(REJECTED_PREFIX) else msg
    requested = _requested(spec)
    if not requested:
        return None  # the pod asks for no NVIDIA resource: its refusal is not the GPU's
    lost = bool(_LOST.search(text))
    ids = tuple(dict.fromkeys(m.group(0) for m in _DEVICE_ID.finditer(text)))
    resources = tuple(dict.fromkeys(r for r in (m.group(0) for m in _RESOURCE_IN_TEXT.finditer(text))
                                    if GPU_RESOURCE_RE.match(r)))
    names = (("GPU is lost",) if lost else ()) + ids + resources
    if not names:
        return None
    t, where = _time(pod)
    return Rejection(str(md.get("namespace") or ""), str(md.get("name") or ""), str(md.get("uid") or ""), t, where,
                     UNEXPECTED, text[:MAX_MESSAGE], tuple(r for r in requested if GPU_RESOURCE_RE.match(r)) or tuple(requested),
                     names, ids, lost)


def gpu_rejections(pods: Any) -> list[Rejection]:
    """The GPU rejections among a list of pods (a list answer's `items`), oldest first; undated last."""
    got = [r for r in (gpu_rejection(p) for p in (pods if isinstance(pods, list) else [])) if r is not None]
    return sorted(got, key=lambda r: (r.time is None, r.time or 0.0, r.ref))
