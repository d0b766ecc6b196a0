"""gpuwarden's NodeCondition vocabulary, shared by the agent that sets the conditions and the
controller, `fleet` and `kubectl gpuwarden` that read them: the condition types, the rule family
each covers, and the condition/Event reason of a finding code ("GPU-DEV-001" <-> "GpuDev001").

reason = the finding code in CamelCase, which satisfies apimachinery's condition-reason format
`[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?`; message = one line (`one_line`).
"""

from __future__ import annotations

import re

#: condition type -> what it covers (docs/agent.md)
CONDITION_TYPES: dict[str, str] = {
    "GPUDeviceAccess": "a GPU container's device cgroup denies a GPU device node it needs (GPU-DEV-*)",
    "GPUDriver": "the NVIDIA driver stack: module, NVML, firmware, persistence (GPU-DRV-*)",
    "GPUDevicePlugin": "the device plugin, the kubelet's device manager and the container runtime (GPU-K8S-*)",
    "GPUUnchargedMemory": "host memory taken by driver allocations no memory cgroup is charged for (GPU-NODE-*)",
    "GPUHardware": "the GPUs themselves: Xid, ECC, NVLink, PCIe, missing GPUs (GPU-HW-*)",
}

#: rule family -> condition type; codes of an unknown family go by their prefix
FAMILY_TO_TYPE: dict[str, str] = {
    "device-access": "GPUDeviceAccess",
    "driver": "GPUDriver",
    "kubelet": "GPUDevicePlugin",
    "plugin": "GPUDevicePlugin",
    "device-plugin": "GPUDevicePlugin",
    "runtime": "GPUDevicePlugin",
    "mps": "GPUDevicePlugin",
    "kubernetes": "GPUDevicePlugin",
    "memory": "GPUUnchargedMemory",
    "node-memory": "GPUUnchargedMemory",
    "node": "GPUUnchargedMemory",
    "node-resource": "GPUUnchargedMemory",
    "hardware": "GPUHardware",
}
PREFIX_TO_TYPE: dict[str, str] = {
    "GPU-DEV": "GPUDeviceAccess",
    "GPU-DRV": "GPUDriver",
    "GPU-K8S": "GPUDevicePlugin",
    "GPU-NODE": "GPUUnchargedMemory",
    "GPU-HW": "GPUHardware",
}
DEFAULT_TYPE = "GPUDevicePlugin"

REASON_RE = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
MAX_MESSAGE = 1024


def condition_type(code: str, family: str = "") -> str:
    if family in FAMILY_TO_TYPE:
        return FAMILY_TO_TYPE[family]
    for prefix, t in PREFIX_TO_TYPE.items():
        if code.upper().startswith(prefix + "-"):
            return t
    return DEFAULT_TYPE


def reason_for(code: str) -> str:
    """"GPU-DEV-001" -> "GpuDev001", "GPU-K8S-001" -> "GpuK8s001" (valid condition/event reasons)."""
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", code) if p]
    out = "".join(p if p.isdigit() else p[:1].upper() + p[1:].lower() for p in parts)
    if not out or not out[0].isalpha():
        out = "Gpu" + out
    assert REASON_RE.match(out), out
    return out


def healthy_reason(ctype: str) -> str:
    return f"No{ctype}Problem"


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


_REASON_CODE = re.compile(r"^Gpu([A-Z][a-z0-9]*?)(\d+)$")


def code_from_reason(reason: str) -> str | None:
    """"GpuDev001" -> "GPU-DEV-001" (the inverse of `reason_for` for catalog codes)."""
    m = _REASON_CODE.match(reason or "")
    if not m:
        return None
    return f"GPU-{m.group(1).upper()}-{m.group(2)}"
