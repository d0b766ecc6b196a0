"""Who holds the host memory no counter shows: the candidates and the evidence that separates them.

No /proc counter maps the driver's uncharged pages to a process. The candidates are the processes
holding NVIDIA device files (`DeviceHolder`, grouped per pod into `Suspect`s); `attribute` lists them
for the ledger and `separate` weighs what tells them apart (docs/memory.md, section 7).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from gpuwarden.memory.ledger import GiB, PodMemory, human
from gpuwarden.memory.trend import Trend

#: GPU infrastructure that holds NVIDIA device files open without owning workload memory (comm is cut at 15 chars)
INFRA_NAMES = ("nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "nvidia-device-plugin", "nvidia-smi",
               "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "gpu-feature-discovery", "dcgmi",
               "nvidia-dcgm", "gpuwarden", "nvidia-gpu-device-plugin", "k8s-device-plugin")
_COMPUTE_DEV = re.compile(r"^/dev/(nvidia\d+|nvidia-uvm)$")


def is_infra(name: str) -> bool:
    n = name[:15]
    return any(n == x[:15] for x in INFRA_NAMES)


@dataclass(frozen=True)
class DeviceHolder:
    """A process with NVIDIA device files open."""

    pid: int
    name: str
    devices: tuple[str, ...]
    cgroup: str = ""  # its cgroup path (memory or unified), as /proc/<pid>/cgroup shows it
    pod_uid: str | None = None
    container_id: str | None = None

    @property
    def infra(self) -> bool:
        return is_infra(self.name)

    @property
    def compute(self) -> bool:
        """Holds a GPU or nvidia-uvm (a context), not just nvidiactl."""
        return any(_COMPUTE_DEV.match(d) for d in self.devices)

    def to_json(self) -> dict:
        return {"pid": self.pid, "name": self.name, "devices": list(self.devices), "cgroup": self.cgroup,
                "pod_uid": self.pod_uid, "container_id": self.container_id}


@dataclass
class Suspect:
    kind: str  # "pod" | "process"
    name: str
    namespace: str = ""
    uid: str = ""
    pids: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    kernel_other: int | None = None  # charged to its own cgroup beyond slab/stacks/page tables
    charged: int | None = None
    limit: int | None = None
    reasons: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """Stable across checks: the pod's UID, else "pid:N" (the agent's memory history keys candidates by it)."""
        return self.uid if self.kind == "pod" and self.uid else f"pid:{self.pids[0]}" if self.pids else self.ref

    @property
    def ref(self) -> str:
        if self.kind == "pod":
            return f"{self.namespace}/{self.name}" if self.name else f"pod {self.uid}"
        return f"{self.name} (pid {', '.join(map(str, self.pids))})"

    def to_json(self) -> dict:
        return {"kind": self.kind, "ref": self.ref, "uid": self.uid, "pids": self.pids, "names": self.names,
                "devices": self.devices, "kernel_other": self.kernel_other, "charged": self.charged,
                "limit": self.limit, "reasons": self.reasons}


@dataclass
class Attribution:
    confidence: str  # "high" | "medium" | "low" | "none"
    explanation: str
    suspects: list[Suspect] = field(default_factory=list)  # holders of the uncharged remainder, most likely first
    charged: list[Suspect] = field(default_factory=list)  # pods whose own cgroup is charged driver memory
    infrastructure: list[DeviceHolder] = field(default_factory=list)
    scan_complete: bool = True

    def to_json(self) -> dict:
        return {"confidence": self.confidence, "explanation": self.explanation, "scan_complete": self.scan_complete,
                "suspects": [s.to_json() for s in self.suspects], "charged": [s.to_json() for s in self.charged],
                "infrastructure": [h.to_json() for h in self.infrastructure]}


def _pod_suspect(pod: PodMemory | None, uid: str, holders: list[DeviceHolder]) -> Suspect:
    s = Suspect("pod", pod.name if pod else "", pod.namespace if pod else "", uid)
    if pod is not None:
        s.kernel_other = pod.cgroup.kernel_other
        s.charged = pod.cgroup.current
        s.limit = pod.cgroup.limit
    for h in holders:
        s.pids.append(h.pid)
        if h.name not in s.names:
            s.names.append(h.name)
        s.devices.extend(d for d in h.devices if d not in s.devices)
    return s


def attribute(holders: Sequence[DeviceHolder], pods: Sequence[PodMemory] = (), gap: int | None = None,
              gap_threshold: int = 4 * GiB, charged_threshold: int = 2 * GiB,
              scan_complete: bool = True) -> Attribution:
    """Who probably holds the memory, and how sure that is.

    Pods whose own cgroup is charged `kernel` memory beyond its known parts are named with certainty for
    that amount (the kernel says so). For the uncharged remainder there is no per-process counter; the
    candidates are the processes holding NVIDIA device files, GPU infrastructure (persistenced, device
    plugin, DCGM, MPS) set aside: one candidate while the remainder is large is *high* confidence, two
    or three *medium* (ranked: GPU/uvm holders first, then by process count), more or none *low*.
    An incomplete /proc scan lowers the confidence one step.
    """
    by_uid = {p.uid: p for p in pods}
    infra = [h for h in holders if h.infra]
    work = [h for h in holders if not h.infra]
    groups: dict[str, list[DeviceHolder]] = {}
    for h in work:
        groups.setdefault(h.pod_uid or f"pid:{h.pid}", []).append(h)
    suspects: list[Suspect] = []
    for key, hs in groups.items():
        if key.startswith("pid:"):
            h = hs[0]
            s = Suspect("process", h.name, pids=[h.pid], names=[h.name], devices=list(h.devices))
            s.reasons.append("host process (in no pod) holding " + ", ".join(h.devices))
        else:
            s = _pod_suspect(by_uid.get(key), key, hs)
            s.reasons.append(f"{len(hs)} process(es) holding " + ", ".join(s.devices))
        suspects.append(s)
    suspects.sort(key=lambda s: (not any(_COMPUTE_DEV.match(d) for d in s.devices), -len(s.pids), s.ref))

    charged: list[Suspect] = []
    for p in pods:
        ko = p.cgroup.kernel_other
        if ko is not None and ko >= charged_threshold:
            s = _pod_suspect(p, p.uid, [h for h in work if h.pod_uid == p.uid])
            s.reasons.append(f"its cgroup is charged {human(ko)} of kernel memory beyond slab, stacks and page tables "
                             f"({p.cgroup.source})")
            charged.append(s)
    charged.sort(key=lambda s: -(s.kernel_other or 0))

    large = gap is not None and gap >= gap_threshold
    n = len(suspects)
    if n == 0:
        conf = "none" if scan_complete else "low"
        why = ("no process outside the GPU infrastructure has NVIDIA device files open"
               + ("" if scan_complete else " among the processes scanned (scan incomplete)"))
    elif n == 1:
        conf = "high" if large else "medium"
        why = (f"{suspects[0].ref} is the only workload with NVIDIA device files open"
               + (f" while {human(gap)} is held outside every counter" if large else ""))
    elif n <= 3:
        conf = "medium"
        why = f"{n} workloads have NVIDIA device files open; ranked GPU/uvm holders first: " + \
              ", ".join(s.ref for s in suspects)
    else:
        conf = "low"
        why = f"{n} workloads have NVIDIA device files open; the driver does not say which one holds the pages"
    if not scan_complete and conf in ("high", "medium"):
        conf = {"high": "medium", "medium": "low"}[conf]
        why += " (the /proc scan stopped early, so another holder may exist)"
    if infra:
        why += "; set aside as GPU infrastructure: " + ", ".join(f"{h.name} ({h.pid})" for h in infra)
    return Attribution(conf, why, suspects, charged, infra, scan_complete)



# --------------------------------------------------------------------------- the GPUs' view

@dataclass(frozen=True)
class GpuProcess:
    pid: int
    type: str  # "G", "C", "C+G" (NVML / nvidia-smi)
    used: int | None  # GPU memory it holds
    gpu: str  # index or bus id

    @property
    def graphics(self) -> bool:
        return "G" in self.type


@dataclass(frozen=True)
class GpuMemory:
    gpu: str
    used: int | None
    free: int | None
    total: int | None

    def full(self, ratio: float) -> bool:
        return self.free is not None and bool(self.total) and self.free < ratio * self.total  # type: ignore[operator]


@dataclass(frozen=True)
class GpuView:
    """What NVML (live or recorded) or nvidia-smi says about GPU processes and memory."""

    source: str
    processes: tuple[GpuProcess, ...] = ()
    memory: tuple[GpuMemory, ...] = ()


@dataclass
class Separation:
    method: str  # "sole-holder" | "graphics" | "history" | "none"
    confidence: str  # "high" | "medium" | "low" | "none"
    holder: Suspect | None
    evidence: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"method": self.method, "confidence": self.confidence, "holder": self.holder.ref if self.holder else None,
                "evidence": self.evidence}


def _graphics_owners(suspects: list[Suspect], view: GpuView) -> dict[str, list[GpuProcess]]:
    by_pid = {p.pid: p for p in view.processes}
    out: dict[str, list[GpuProcess]] = {}
    for s in suspects:
        g = [by_pid[pid] for pid in s.pids if pid in by_pid and by_pid[pid].graphics]
        if g:
            out[s.ref] = g
    return out


def separate(suspects: list[Suspect], scan_complete: bool, view: GpuView | None, trend: Trend | None,
             full_ratio: float = 0.05) -> Separation:
    """Name the holder of the uncharged memory among the candidates, with the evidence that separates them."""
    if not suspects:
        return Separation("none", "none" if scan_complete else "low", None,
                          ["no workload outside the GPU infrastructure holds NVIDIA device files"])
    ev: list[str] = []
    full = [m for m in (view.memory if view else ()) if m.full(full_ratio)]
    if view is not None:
        for m in view.memory:
            if m.free is not None and m.total:
                ev.append(f"GPU {m.gpu}: {human(m.free)} of {human(m.total)} free"
                          + (" (full: graphics objects spill to host memory)" if m in full else ""))
    owners = _graphics_owners(suspects, view) if view is not None else {}
    for ref, procs in owners.items():
        ev.append(f"{ref}: NVML lists " + ", ".join(f"pid {p.pid} as type {p.type}"
                                                     + (f" holding {human(p.used)} of GPU memory" if p.used else "")
                                                     for p in procs))
    if trend is not None:
        if trend.growth_intervals:
            ev.append(f"agent history: the gap grew in {trend.growth_intervals} interval(s); present in every one: "
                      + (", ".join(trend.refs.get(k, k) for k in trend.present_in_growth) or "no candidate"))
        for f in trend.freed:
            ev.append(f"agent history: {human(f.bytes)} came back when {f.ref} left")
    if len(suspects) == 1:
        conf = "high" if scan_complete else "medium"
        return Separation("sole-holder", conf, suspects[0],
                          [f"{suspects[0].ref} is the only workload holding NVIDIA device files"
                           + ("" if scan_complete else " among the processes scanned (scan incomplete)")] + ev)
    if len(owners) == 1:
        ref = next(iter(owners))
        holder = next(x for x in suspects if x.ref == ref)
        conf = "high" if full else "medium"
        why = (f"{ref} is the only candidate with graphics clients; the others are compute-only, whose "
               "allocations fail rather than spill when the GPU is full")
        if not full:
            why += "; no GPU is full now, so the spill may date from earlier"
        return Separation("graphics", conf, holder, [why] + ev)
    if trend is not None:
        k = trend.implicated()
        holder = next((x for x in suspects if x.key == k), None) if k else None
        if holder is not None:
            conf = "high" if trend.growth_intervals >= 3 else "medium"
            return Separation("history", conf, holder,
                              [f"{holder.ref} was present in every interval in which the gap grew; the other "
                               "candidates were not"] + ev)
    refs = ", ".join(x.ref for x in suspects)
    need = ("NVML's per-process list (graphics vs compute)" if view is None else
            "the agent's history (which one was present whenever the memory grew)" if trend is None else
            "per-process accounting of the driver's allocations (kprobes; not available on this kernel)")
    return Separation("none", "medium" if len(suspects) <= 3 else "low", None,
                      [f"{len(suspects)} workloads hold NVIDIA device files ({refs}) and nothing read separates them; "
                       f"what would: {need}"] + ev)




def gpu_view_from(nvml: dict | None, recorded: bool = False, smi: object = None) -> GpuView | None:
    """GPU processes (graphics/compute) and memory: the NVML probe's value (live or recorded), else nvidia-smi's
    parsed XML (`parsers.nvidia_smi`)."""
    gpus = nvml.get("gpus") if isinstance(nvml, dict) else None
    if isinstance(gpus, list) and any(isinstance(g, dict) and "processes" in g for g in gpus):
        procs, mem = [], []
        for g in gpus:
            if not isinstance(g, dict):
                continue
            gid = str(g.get("index", "?"))
            for p in g.get("processes") or []:
                if isinstance(p, dict) and isinstance(p.get("pid"), int):
                    procs.append(GpuProcess(p["pid"], str(p.get("type", "")), p.get("used"), gid))
            m = g.get("memory")
            if isinstance(m, dict):
                mem.append(GpuMemory(gid, m.get("used"), m.get("free"), m.get("total")))
        return GpuView("NVML " + ("(recorded)" if recorded else "probe"), tuple(procs), tuple(mem))
    smi_gpus = getattr(smi, "gpus", None)
    if not smi_gpus:
        return None
    return GpuView("nvidia-smi -q -x",
                   tuple(GpuProcess(p.pid, p.type, p.used, g.bus_id) for g in smi_gpus for p in g.processes),
                   tuple(GpuMemory(g.bus_id, g.fb_used, g.fb_free, g.fb_total) for g in smi_gpus))
