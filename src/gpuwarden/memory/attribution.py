"""Who holds the host memory no counter shows: the candidates and the evidence that separates them.

No /proc counter maps the driver's uncharged pages to a process. The candidates are the processes
holding NVIDIA device files (`DeviceHolder`, grouped per pod into `Suspect`s); `attribute` lists them
for the ledger and `separate` weighs what tells them apart (docs/memory.md, section 7).
"""

from __future__ import annotations

import re
from typing import Sequence

from msgspec import Struct, field

from gpuwarden.memory.ledger import CgroupSplit, GiB, NodeLedger, PodMemory, Thrash, human
from gpuwarden.memory.trend import Trend
from gpuwarden.parsers import lazyre

#: GPU infrastructure that holds NVIDIA device files open without owning workload memory (comm is cut at 15 chars)
INFRA_NAMES = ("nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "nvidia-device-plugin", "nvidia-smi",
               "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "gpu-feature-discovery", "dcgmi",
               "nvidia-dcgm", "gpuwarden", "nvidia-gpu-device-plugin", "k8s-device-plugin")
_COMPUTE_DEV = lazyre.compile(r"^/dev/(nvidia[0-9]+|nvidia-uvm)$")


def is_infra(name: str) -> bool:
    n = name[:15]
    return any(n == x[:15] for x in INFRA_NAMES)


class DeviceHolder(Struct, frozen=True):
    """A process with NVIDIA device files open."""

    pid: int
    name: str
    devices: tuple[str, ...]
    cgroup: str = ""  # its cgroup path (memory or unified), as /proc/<pid>/cgroup shows it
    pod_uid: str | None = None
    container_id: str | None = None
    start_s: float | None = None  # seconds after boot it started (/proc/<pid>/stat starttime)
    kernel_s: float | None = None  # CPU seconds it spent in the kernel (/proc/<pid>/stat stime)
    faults: int | None = None  # minflt + majflt (/proc/<pid>/stat)
    dev_maps: tuple[int, int] | None = None  # (count, bytes) of its NVIDIA/DRM device mappings (/proc/<pid>/maps)

    @property
    def infra(self) -> bool:
        return is_infra(self.name)

    @property
    def compute(self) -> bool:
        """Holds a GPU or nvidia-uvm (a context), not just nvidiactl."""
        return any(_COMPUTE_DEV.match(d) for d in self.devices)

    def to_json(self) -> dict:
        return {"pid": self.pid, "name": self.name, "devices": list(self.devices), "cgroup": self.cgroup,
                "pod_uid": self.pod_uid, "container_id": self.container_id, "start_s": self.start_s,
                "kernel_s": self.kernel_s, "faults": self.faults,
                "dev_maps": None if self.dev_maps is None else list(self.dev_maps)}


class Suspect(Struct):
    """A pod or process that may hold the memory no cgroup counts."""
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
    start_s: dict[int, float] = field(default_factory=dict)  # pid -> seconds after boot it started
    kernel_s: dict[int, float] = field(default_factory=dict)  # pid -> CPU seconds in the kernel

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


class Attribution(Struct):
    """Who holds the uncounted memory, and how sure we are."""
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
        if h.start_s is not None:
            s.start_s[h.pid] = h.start_s
        if h.kernel_s is not None:
            s.kernel_s[h.pid] = h.kernel_s
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
            s.start_s.update({h.pid: h.start_s} if h.start_s is not None else {})
            s.kernel_s.update({h.pid: h.kernel_s} if h.kernel_s is not None else {})
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

class GpuProcess(Struct, frozen=True):
    """A process on a GPU, from nvidia-smi."""
    pid: int
    type: str  # "G", "C", "C+G" (NVML / nvidia-smi)
    used: int | None  # GPU memory it holds
    gpu: str  # index or bus id

    @property
    def graphics(self) -> bool:
        return "G" in self.type


class GpuMemory(Struct, frozen=True):
    """A GPU's memory use, from nvidia-smi."""
    gpu: str
    used: int | None
    free: int | None
    total: int | None
    uuid: str = ""
    minor: int | None = None  # /dev/nvidia<minor>

    def full(self, ratio: float) -> bool:
        return self.free is not None and bool(self.total) and self.free < ratio * self.total  # type: ignore[operator]


class GpuView(Struct, frozen=True):
    """What NVML (live or recorded) or nvidia-smi says about GPU processes and memory."""

    source: str
    processes: tuple[GpuProcess, ...] = ()
    memory: tuple[GpuMemory, ...] = ()

    def full(self, ratio: float) -> tuple[str, ...]:
        return tuple(m.gpu for m in self.memory if m.full(ratio))

    def gpu_of(self, ident: str) -> str | None:
        """The view's id of a GPU named by UUID, index or /dev/nvidiaN minor (as "minor:N")."""
        for m in self.memory:
            if ident in (m.gpu, m.uuid) or (m.minor is not None and ident == f"minor:{m.minor}"):
                return m.gpu
        return None


class Candidate(Struct):
    """One candidate holder and the evidence for and against it."""

    suspect: Suspect
    gpus: tuple[str, ...] = ()
    gpus_from: str = ""
    score: int = 0
    eliminated: str = ""  # why it cannot hold the memory ("" while it can)
    graphics: bool = False  # NVML lists a process of it as a graphics client (type G or C+G)
    decisive: list[str] = field(default_factory=list)  # evidence that separates it from every other candidate
    pro: list[str] = field(default_factory=list)
    con: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        s = self.suspect
        return {"ref": s.ref, "key": s.key, "kind": s.kind, "namespace": s.namespace, "name": s.name, "uid": s.uid,
                "graphics": self.graphics, "gpus": list(self.gpus), "gpus_from": self.gpus_from,
                "score": self.score, "eliminated": self.eliminated, "decisive": self.decisive, "for": self.pro,
                "against": self.con}


class Separation(Struct):
    """Who holds it, as sure as the evidence allows: one confidence for the finding, stated once."""

    method: str  # "sole-holder" | "graphics" | "arrival" | "freed" | "tracking" | "elimination" | "ranking" | "none"
    confidence: str  # "high" | "medium" | "low" | "none"
    holder: Suspect | None  # named only when one candidate remains or the evidence clearly separates it
    evidence: list[str] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)  # every candidate, the remaining ones first
    separate_by: str = ""  # when several remain: what would tell them apart

    @property
    def remaining(self) -> list[Suspect]:
        return [c.suspect for c in self.candidates if not c.eliminated]

    def to_json(self) -> dict:
        return {"method": self.method, "confidence": self.confidence, "holder": self.holder.ref if self.holder else None,
                "remaining": [s.ref for s in self.remaining], "separate_by": self.separate_by,
                "evidence": self.evidence, "candidates": [c.to_json() for c in self.candidates]}


#: a candidate is named at high confidence only this many points ahead of the next one, with decisive evidence
CLEAR_LEAD = 2


def candidate_gpus(s: Suspect, view: GpuView, alloc: dict[str, tuple[str, ...]]) -> tuple[tuple[str, ...], str]:
    """The GPUs a candidate uses: NVML's per-GPU process lists, else the kubelet's allocation, else its device files."""
    nv = sorted({p.gpu for p in view.processes if p.pid in s.pids})
    if nv:
        return tuple(nv), "NVML's per-GPU process lists"
    ids = [view.gpu_of(i) for i in alloc.get(s.uid, ())]
    if any(ids):
        return tuple(sorted({i for i in ids if i})), "the kubelet's device allocation"
    minors = [view.gpu_of("minor:" + d[len("/dev/nvidia"):]) for d in s.devices if re.match(r"^/dev/nvidia[0-9]+$", d)]
    if any(minors):
        return tuple(sorted({i for i in minors if i})), "its /dev/nvidiaN files"
    if len(view.memory) == 1 and any(_COMPUTE_DEV.match(d) for d in s.devices):
        return (view.memory[0].gpu,), "the node's only GPU"
    return (), ""


def separate(suspects: list[Suspect], scan_complete: bool, view: GpuView | None, trend: Trend | None,
             full_ratio: float = 0.05, alloc: dict[str, tuple[str, ...]] | None = None) -> Separation:
    """Name the holder of the uncharged memory among the candidates by combining the evidence for and against each.

    Eliminated: compute-only clients of a full GPU (their allocations fail rather than spill; unified memory is
    charged) and graphics clients whose GPUs had free memory in every sample. Ranked by what remains: a graphics
    client of a full GPU (+2), a process that appeared as the growth began (+2), memory back when it left (+3),
    present and unchanged while nothing grew (-1), growth while it was absent (-2), compute-only on a GPU with free
    memory (-1). High confidence only when one candidate remains, or the first leads by `CLEAR_LEAD` with evidence
    no other candidate has; otherwise the remaining candidates are named with what would separate them.
    """
    if not suspects:
        return Separation("none", "none" if scan_complete else "low", None,
                          ["no workload outside the GPU infrastructure holds NVIDIA device files"])
    alloc = alloc or {}
    full = set(view.full(full_ratio)) if view is not None else set()
    ev: list[str] = []
    if view is not None:
        for m in view.memory:
            if m.free is not None and m.total:
                ev.append(f"GPU {m.gpu}: {human(m.free)} of {human(m.total)} free"
                          + (" (full: graphics objects spill to host memory)" if m.gpu in full else ""))
    by_pid = {p.pid: p for p in view.processes} if view is not None else {}
    presence = trend.presence if trend is not None else {}
    cands: list[Candidate] = []
    for s in suspects:
        c = Candidate(s)
        cands.append(c)
        procs = [by_pid[p] for p in s.pids if p in by_pid]
        if view is not None:
            c.gpus, c.gpus_from = candidate_gpus(s, view, alloc)
        on_full = [g for g in c.gpus if g in full]
        graphics = [p for p in procs if p.graphics]
        c.graphics = bool(graphics)
        figures = ", ".join(f"pid {p.pid} type {p.type} on GPU {p.gpu}" + (f" holding {human(p.used)}" if p.used else "")
                            for p in procs)
        if figures:
            ev.append(f"{s.ref}: NVML lists {figures}")
        if s.kernel_s:
            ev.append(f"{s.ref}: " + ", ".join(f"pid {p} spent {k:.2f} s in the kernel" for p, k in s.kernel_s.items()))
        p = presence.get(s.key)
        if view is not None and procs and not graphics and on_full:
            c.eliminated = (f"compute-only client (NVML type {'/'.join(sorted({x.type for x in procs}))}) of full GPU "
                            f"{', '.join(on_full)}: its allocations fail rather than spill, and unified memory is "
                            "charged to its cgroup")
        elif graphics and c.gpus and not on_full and p is not None and p.full_seen == 0:
            c.eliminated = (f"graphics client whose GPU {', '.join(c.gpus)} had free memory in every sample: its "
                            "objects stayed in GPU memory")
        if graphics and on_full:
            c.score += 2
            c.pro.append(f"graphics client (NVML type {graphics[0].type}) of full GPU {', '.join(on_full)}: its "
                         "objects spill to host memory that no cgroup is charged for")
        elif graphics:
            c.con.append(f"graphics client, but GPU {', '.join(c.gpus) or '?'} has free memory now "
                         "(its objects spill only when the GPU is full; earlier fullness is unknown)")
        elif procs and not c.eliminated:
            c.score -= 1
            c.con.append("compute-only client of a GPU with free memory: its allocations stay in GPU memory, "
                         "and unified memory is charged to its cgroup")
        if p is not None:
            if p.arrived_as_growth_began:
                c.score += 2
                c.pro.append("a process of it appeared just before the uncharged memory began to grow "
                             "(the agent's samples)")
            if p.quiet_before:
                c.score -= 1
                c.con.append(f"present, with the same processes, in {p.quiet_before} interval(s) before the growth "
                             "in which nothing grew")
            if p.growth_without:
                c.score -= 2
                c.con.append(f"the memory grew in {p.growth_without} interval(s) while it was absent")
            elif p.growth_with and p.arrived is not None:
                c.pro.append(f"the memory grew only while it was present ({p.growth_with} interval(s))")
        tr = trend.tracking if trend is not None else None
        if tr is not None and tr.holder == s.key:
            c.score += 3
            c.decisive.append(f"its own signals tracked the growth ({tr.strength}): {tr.why}")
            c.pro.append(c.decisive[-1])
        elif tr is not None and tr.holder is not None:
            c.con.append("its own signals did not track the growth (kernel time, faults, device mappings)")
        for f in (trend.freed if trend is not None else []):
            if f.key == s.key:
                c.score += 3
                c.decisive.append(f"{human(f.bytes)} came back when it left")
                c.pro.append(c.decisive[-1])
        if c.eliminated:
            c.con.insert(0, c.eliminated)
    # what only one remaining candidate has is decisive, unless a candidate present during the growth has just left
    # and what it held has not come back yet: the one left is then "alone" only because the other went (run 23)
    left = [c for c in cands if not c.eliminated]
    here = {c.suspect.key for c in cands}
    freed_keys = {f.key for f in (trend.freed if trend is not None else [])}
    # left while the memory grew, and not yet given back; or left and gave memory back (it was a holder): either
    # way the one left is not "alone" on the evidence (run 24: the scenario's one-shot reading, 1.6 GiB back)
    departed = sorted(trend.refs.get(k, k) for k, p in (trend.presence if trend is not None else {}).items()
                      if k not in here and (p.growth_with > 0 or k in freed_keys))
    # the one whose own signals tracked the growth has left too (evicted, killed, exited): run 23 on the H200
    tr = trend.tracking if trend is not None else None
    tracked_gone = (next((t.ref for t in tr.tracks if t.key == tr.holder), tr.holder)
                    if tr is not None and tr.holder is not None and tr.holder not in here else None)
    for c in left if not (departed or tracked_gone) else []:
        others = [o for o in left if o is not c]
        if c.pro and c.pro[0].startswith("graphics client") and not any(o.pro and o.pro[0].startswith("graphics client")
                                                                        for o in others):
            c.decisive.append("the only graphics client of a full GPU")
        pc = presence.get(c.suspect.key)
        if pc is not None and pc.arrived_as_growth_began and others and all(
                (po := presence.get(o.suspect.key)) is not None and not po.arrived_as_growth_began
                and po.quiet_before for o in others):
            c.decisive.append("it arrived as the growth began, while the others were present before and nothing grew")
    left.sort(key=lambda c: (-c.score, c.suspect.ref))
    cands = left + [c for c in cands if c.eliminated]
    for c in cands:
        ev.append(f"{c.suspect.ref}: " + ("ELIMINATED, " + c.eliminated if c.eliminated else
                                          f"score {c.score:+d}; for: {'; '.join(c.pro) or 'nothing'}; "
                                          f"against: {'; '.join(c.con) or 'nothing'}"))
    if tr is not None and tr.tracks:
        ev += ["per-process signals against the growth: " + x for x in tr.evidence]
    # a candidate that left while the memory grew (or gave memory back as it left) leaves the others "alone" only
    # because it went: what it held is freed as its processes go, and nobody is named on being what is left
    if tracked_gone is not None or (departed and not (left and left[0].decisive)):
        strength = tr.strength if tr is not None else ""
        why = (f"{tracked_gone}, whose own signals tracked the growth ({strength}), no longer holds NVIDIA device "
               "files: what it held is freed as its processes go; the others did not track the growth, and none is "
               "named on being what is left" if tracked_gone is not None else
               f"{', '.join(departed)} held NVIDIA device files while the memory grew (or gave memory back when it "
               "left) and has left; what it held is freed as its processes go, so whoever remains is not named on "
               "being what is left")
        return Separation("none", "medium", None, [why] + ev, cands,
                          "the memory coming back now that it left (the next samples)")
    sole = len(suspects) == 1
    if len(left) == 1 and (sole or view is not None):
        h = left[0]
        conf = "high" if scan_complete else "medium"
        if sole:
            why = (f"{h.suspect.ref} is the only workload holding NVIDIA device files"
                   + ("" if scan_complete else " among the processes scanned (scan incomplete)"))
            method = "sole-holder"
        else:
            why = (f"{h.suspect.ref} is the only candidate left: "
                   + "; ".join(f"{c.suspect.ref} is a {c.eliminated}" for c in cands if c.eliminated))
            method = "graphics" if h.pro and h.pro[0].startswith("graphics client") else "elimination"
        return Separation(method, conf, h.suspect, [why] + ev, cands)
    if left and (len(left) == 1 or left[0].score - left[1].score >= CLEAR_LEAD) and left[0].decisive:
        h = left[0]
        d = h.decisive
        method = ("freed" if any("came back" in x for x in d) else "tracking" if any("tracked the growth" in x for x in d)
                  else "arrival" if any("arrived" in x for x in d) else "graphics")
        conf = "high" if scan_complete else "medium"
        why = (f"{h.suspect.ref} is separated from " + ", ".join(c.suspect.ref for c in left[1:])
               + f" by the evidence: {'; '.join(d)} (score {h.score:+d} against {left[1].score:+d})"
               if len(left) > 1 else f"{h.suspect.ref}: {'; '.join(d)}")
        return Separation(method, conf, h.suspect, [why] + ev, cands)
    if not left:
        return Separation("none", "low", None, ["every workload holding NVIDIA device files is ruled out ("
                                                + "; ".join(f"{c.suspect.ref}: {c.eliminated}" for c in cands)
                                                + "): the holder may be outside them (a process that exited, "
                                                  "another driver)"] + ev, cands,
                          "per-process accounting of the driver's allocations")
    need = ("NVML's per-process list (graphics vs compute)" if view is None else
            "the agent's history (which process appeared just before the memory began to grow, and whether it "
            "came back when one exited)" if trend is None else
            "one candidate's own signals (kernel time, faults, device mappings) moving with the growth while the "
            "others' do not, over more samples; stopping one of them and seeing the memory come back; or "
            "per-process accounting of the driver's allocations (kprobes/fentry; not available on this kernel)")
    refs = ", ".join(c.suspect.ref for c in left)
    return Separation("none", "medium" if len(left) <= 3 else "low", None,
                      [f"{len(left)} candidates remain ({refs}) and nothing read separates them; what would: {need}"]
                      + ev, cands, need)


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
                minor = g.get("minor")
                mem.append(GpuMemory(gid, m.get("used"), m.get("free"), m.get("total"), str(g.get("uuid") or ""),
                                     minor if isinstance(minor, int) else None))
        return GpuView("NVML " + ("(recorded)" if recorded else "probe"), tuple(procs), tuple(mem))
    smi_gpus = getattr(smi, "gpus", None)
    if not smi_gpus:
        return None
    return GpuView("nvidia-smi -q -x",
                   tuple(GpuProcess(p.pid, p.type, p.used, g.bus_id) for g in smi_gpus for p in g.processes),
                   tuple(GpuMemory(g.bus_id, g.fb_used, g.fb_free, g.fb_total, g.uuid, g.minor) for g in smi_gpus))


# --------------------------------------------------------------------------- all together

class MemoryLedger(Struct):
    """The node's memory ledger: split, thrash and attribution together."""
    node: NodeLedger
    split: CgroupSplit
    thrash: Thrash
    attribution: Attribution

    @property
    def gap(self) -> int:
        """The remainder that matters: uncharged when the cgroup split is known, else the whole remainder."""
        if self.split.uncharged_unexplained is not None:
            return self.split.uncharged_unexplained
        return self.node.unexplained

    def to_json(self) -> dict:
        return {"node": self.node.to_json(), "cgroups": self.split.to_json(), "thrash": self.thrash.to_json(),
                "attribution": self.attribution.to_json(), "gap": self.gap}
