"""Memory facts: /proc memory counters, memory cgroups, NVIDIA device holders, and the ledger built from them.

Only /proc/meminfo is essential; every other source (slabinfo is root-only,
PSI needs CONFIG_PSI, cgroups and pods may be absent) is recorded as a gap and
the ledger says what it could not split. The /proc/*/fd scan that finds
NVIDIA device holders is bounded in processes, descriptors and time, because a
node in trouble has thousands of processes and a slow /proc.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from msgspec import Struct, field
from msgspec.structs import asdict

from gpuwarden.facts.probes import result_field
from gpuwarden.facts.containers import pod_names
from gpuwarden.facts.node import FactUnavailable, NodeFacts, fact
from gpuwarden.memory import attribution as A
from gpuwarden.memory import cgroup_escape as E
from gpuwarden.memory import ledger as L
from gpuwarden.memory.tracking import ProcSignals
from gpuwarden.memory.trend import SAMPLES_FILE, SAMPLES_MAX_AGE_S, MemoryHistory, MemSample
from gpuwarden.parsers import lazyre, meminfo, memory_stat, plausible, pressure, proc_pid, slabinfo, vmstat, zoneinfo
from gpuwarden.parsers.memory_stat import Charges
from gpuwarden.root import Missing

CGROUP_ROOT = "/sys/fs/cgroup"
PSI_KINDS = ("memory", "io", "cpu")

#: bounds of the /proc/*/fd scan (override with settings.extra["memory.scan_max_pids"] etc.)
SCAN_MAX_PIDS = 4096
SCAN_MAX_FDS_PER_PID = 4096
SCAN_MAX_SECONDS = 3.0
#: clock ticks per second of /proc/<pid>/stat (USER_HZ: 100 on every Linux architecture Kubernetes runs on)
CLK_TCK = 100

_POD = lazyre.compile(r"pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})")
_CTR = lazyre.compile(r"^(?:cri-containerd-|docker-|crio-|cri-o-)?([0-9a-f]{64})(?:\.scope)?$")


class ScanInfo(Struct):
    """How far the NVIDIA device-holder scan got."""

    pids_listed: int = 0
    pids_scanned: int = 0
    fd_tables_read: int = 0
    denied: int = 0
    complete: bool = True
    reason: str = ""
    seconds: float = 0.0


class KubeletMemory(Struct):
    """kubelet's own memory cgroup: is it stalled, is it protected."""

    pid: int | None
    cgroup: str = ""
    pressure: pressure.Pressure | None = None
    pressure_source: str = ""
    memory_min: int | None = None
    memory_low: int | None = None
    protection_source: str = ""


class MemoryFacts(Struct):
    """The node's memory files, parsed: meminfo, slabinfo, zoneinfo, vmstat, PSI, cgroups."""
    meminfo: meminfo.MemInfo
    slabinfo: slabinfo.SlabInfo | None
    zoneinfo: zoneinfo.ZoneInfo | None
    vmstat: vmstat.VmStat | None
    psi: dict[str, pressure.Pressure]
    page_size: int
    cgroup_version: int | None
    memory_root: str | None  # node path of the memory hierarchy
    holders: list[A.DeviceHolder]
    scan: ScanInfo
    kubelet: KubeletMemory | None
    pods_source: str  # where the pod list came from
    ledger: A.MemoryLedger
    sources: dict[str, str] = field(default_factory=dict)  # what -> node path read
    escape: E.EscapeAssessment | None = None
    #: this check's sample for the agent's MemoryHistory (None without one); the agent records it
    sample: MemSample | None = None

    def to_json(self) -> dict[str, Any]:
        return {"ledger": self.ledger.to_json(), "page_size": self.page_size, "cgroup_version": self.cgroup_version,
                "memory_root": self.memory_root, "pods_source": self.pods_source,
                "scan": asdict(self.scan), "holders": [h.to_json() for h in self.holders],
                "escape": self.escape.to_json() if self.escape else None}


def _setting(facts: NodeFacts, key: str, default: Any) -> Any:
    v = facts.settings.extra.get(f"memory.{key}", default) if isinstance(facts.settings.extra, dict) else default
    return v if isinstance(v, type(default)) or (isinstance(default, float) and isinstance(v, int)) else default


def thresholds(facts: NodeFacts) -> L.ThrashThresholds:
    base = L.ThrashThresholds()
    return L.ThrashThresholds(**{name: float(_setting(facts, name, getattr(base, name))) for name in base.__struct_fields__})


def gap_threshold(facts: NodeFacts, total: int) -> int:
    """The remainder that counts as large: ratio of MemTotal AND an absolute floor."""
    s = facts.settings
    return max(int(s.unexplained_mem_min_bytes), int(s.unexplained_mem_ratio * total))


def escape_settings(facts: NodeFacts) -> E.EscapeSettings:
    base = E.EscapeSettings()
    return E.EscapeSettings(**{name: type(getattr(base, name))(_setting(facts, name, getattr(base, name)))
                               for name in base.__struct_fields__})


def gpu_view(facts: NodeFacts) -> A.GpuView | None:
    """GPU processes and memory: the NVML probe (live or recorded), else nvidia-smi's XML."""
    probes = facts.maybe("probes")
    n = getattr(probes, "nvml", None) if probes is not None else None
    value = result_field(n, "value") if n is not None and result_field(n, "status") == "ok" else None
    drv = facts.maybe("driver")
    return A.gpu_view_from(value, bool(getattr(probes, "recorded", False)), getattr(drv, "smi", None) if drv else None)


def signals_of(holders: list[A.DeviceHolder], view: A.GpuView | None, pids: list[int]) -> ProcSignals:
    """A candidate's per-process signals, summed over its processes (memory/tracking)."""
    by_pid = {h.pid: h for h in holders}
    used: dict[int, int] = {}
    for p in view.processes if view is not None else ():
        if p.used is not None:
            used[p.pid] = used.get(p.pid, 0) + p.used
    out = ProcSignals()
    for pid in pids:
        h = by_pid.get(pid)
        if h is None:
            continue
        out = out.plus(ProcSignals(None if h.kernel_s is None else round(h.kernel_s * CLK_TCK), h.faults,
                                   h.dev_maps[0] if h.dev_maps else None, h.dev_maps[1] if h.dev_maps else None,
                                   used.get(pid)))
    return out


def _sample(facts: NodeFacts, hist: MemoryHistory, thrash: L.Thrash, gap: int, suspects: list[A.Suspect],
            view: A.GpuView | None, full_ratio: float, holders: list[A.DeviceHolder] | None = None) -> MemSample:
    t = hist.clock() if hist.clock is not None else facts.now
    return MemSample(t, gap, thrash.mem_available, thrash.min_watermark, {s.key: s.ref for s in suspects},
                     {s.key: tuple(sorted(s.pids)) for s in suspects},
                     view.full(full_ratio) if view is not None and view.memory else None,
                     {s.key: signals_of(holders or [], view, s.pids) for s in suspects})


def recorded_history(facts: NodeFacts) -> MemoryHistory | None:
    """The agent's samples recorded on this node (SAMPLES_FILE), for a one-shot check: None when absent or stale."""
    text = facts.root.read_text(SAMPLES_FILE)
    if isinstance(text, Missing):
        return None
    try:
        hist = MemoryHistory.from_json(json.loads(text))
    except ValueError as exc:
        facts.gap(SAMPLES_FILE, str(exc))
        return None
    # the agent keeps sampling while a check runs: what it took after this check began is not history yet
    while hist.samples and hist.samples[-1].t >= facts.now:
        hist.samples.pop()
    if not hist.samples or facts.now - hist.samples[-1].t > SAMPLES_MAX_AGE_S:
        return None
    hist.source = SAMPLES_FILE
    return hist


def gpu_allocations(facts: NodeFacts) -> dict[str, tuple[str, ...]]:
    """pod uid -> the GPU ids the kubelet's device manager gave it (its checkpoint)."""
    kub = facts.maybe("kubelet")
    cp = getattr(kub, "checkpoint", None) if kub is not None else None
    out: dict[str, tuple[str, ...]] = {}
    for e in getattr(cp, "entries", None) or ():
        if e.resource.startswith("nvidia.com/"):
            out[e.pod_uid] = tuple(dict.fromkeys(out.get(e.pod_uid, ()) + tuple(e.device_ids)))
    return out


def pod_kernel_threshold(facts: NodeFacts) -> int:
    return int(_setting(facts, "pod_kernel_other_min_bytes", 2 * L.GiB))


# --------------------------------------------------------------------------- node-level sources

def _read_optional(facts: NodeFacts, path: str, why_missing: str) -> str | None:
    """Read a source whose absence is worth a gap line (slabinfo, zoneinfo, PSI …)."""
    r = facts.root.read_text(path)
    if isinstance(r, Missing):
        facts.gap(path, f"{r.kind}{': ' + r.detail if r.detail else ''}" + (f" ({why_missing})" if why_missing else ""))
        return None
    return r


def _problems_gap(facts: NodeFacts, path: str, problems: tuple[str, ...]) -> None:
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        facts.gap(path, f"partly unparsable: {problems[0]}{more}")


# --------------------------------------------------------------------------- cgroups

def _memory_root(facts: NodeFacts) -> tuple[str | None, int | None]:
    """The memory hierarchy: from the containers section's layout, else probed under /sys/fs/cgroup."""
    cf = facts.maybe("containers")
    if cf is not None:
        d = cf.layout.dir("memory", "")
        if d:
            return d.rstrip("/") or "/", cf.layout.version
    if not isinstance(facts.root.stat(f"{CGROUP_ROOT}/memory/memory.stat"), Missing):
        return f"{CGROUP_ROOT}/memory", 1
    ctl = facts.root.read_text(f"{CGROUP_ROOT}/cgroup.controllers")
    if not isinstance(ctl, Missing) and "memory" in ctl.split():
        return CGROUP_ROOT, 2
    if not isinstance(facts.root.stat(f"{CGROUP_ROOT}/memory"), Missing):
        return f"{CGROUP_ROOT}/memory", 1
    return None, None


def read_cgroup(facts: NodeFacts, d: str, quiet: bool = False) -> L.CgroupMemory | None:
    """One memory cgroup directory; None when its memory.stat is unreadable or not memory.stat."""
    r = facts.root.read_text(f"{d}/memory.stat")
    if isinstance(r, Missing):
        if not quiet or r.kind != "missing":
            facts.gap(r)
        return None
    st = memory_stat.parse(r)
    _problems_gap(facts, f"{d}/memory.stat", st.problems)

    def num(name: str) -> int | None:
        t = facts.root.read_text(f"{d}/{name}")
        return None if isinstance(t, Missing) else memory_stat.parse_bytes(t)

    if st.version == 2:
        pt = facts.root.read_text(f"{d}/memory.pressure")
        psi = None if isinstance(pt, Missing) else pressure.parse(pt)
        return L.CgroupMemory(d, memory_stat.charges(st), num("memory.current"), num("memory.max"), psi,
                              num("memory.min"), num("memory.low"), f"{d}/memory.stat")
    if st.version == 1:
        kmem = num("memory.kmem.usage_in_bytes")
        return L.CgroupMemory(d, memory_stat.charges(st, kmem), num("memory.usage_in_bytes"),
                              num("memory.limit_in_bytes"), None, None, None, f"{d}/memory.stat")
    facts.gap(f"{d}/memory.stat", "neither cgroup v1 nor v2 memory.stat (garbage?)")
    return None


def _add(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else a + b


def _sum_cgroups(path: str, parts: list[L.CgroupMemory]) -> L.CgroupMemory | None:
    """A pod whose own memory.stat is unreadable, as the sum of its containers'."""
    parts = [p for p in parts if p.charges is not None]
    if not parts:
        return None
    ver = parts[0].charges.version  # type: ignore[union-attr]
    acc: dict[str, int | None] = {}
    for p in parts:
        for name in Charges.__struct_fields__:
            if name != "version":
                acc[name] = _add(acc.get(name), getattr(p.charges, name))
    cur = None
    for p in parts:
        cur = _add(cur, p.current)
    limits = [p.limit for p in parts]
    limit = sum(limits) if limits and all(x is not None for x in limits) else None  # type: ignore[arg-type]
    return L.CgroupMemory(path, Charges(ver, **acc), cur, limit, None, None, None,
                          "sum of " + ", ".join(p.source for p in parts))


# --------------------------------------------------------------------------- NVIDIA device holders

def _pid_cgroup(text: str) -> tuple[str, str | None, str | None]:
    """(cgroup path, pod uid, container id) from /proc/<pid>/cgroup: the memory line, else v2, else any with a pod."""
    lines = proc_pid.cgroup_lines(text)
    pick = next((p for _, ctl, p in lines if "memory" in ctl), None)
    pick = pick or next((p for h, ctl, p in lines if h == "0" and not ctl), None)
    if pick is None or not _POD.search(pick):
        pick = next((p for _, _, p in lines if _POD.search(p)), pick or "")
    m = _POD.search(pick)
    uid = m.group(1).replace("_", "-").lower() if m else None
    last = pick.rstrip("/").rsplit("/", 1)[-1]
    c = _CTR.match(last)
    return pick, uid, c.group(1) if c else None


def _pod_rel(cgroup_path: str) -> str | None:
    """'kubepods/burstable/pod<uid>' from a process's cgroup path (namespaced '/../..' prefixes dropped)."""
    parts = [p for p in cgroup_path.split("/") if p and p != ".."]
    start = next((i for i, p in enumerate(parts) if p.startswith("kubepods")), None)
    end = next((i for i, p in enumerate(parts) if _POD.search(p)), None)
    if start is None or end is None or end < start:
        return None
    return "/".join(parts[start:end + 1])


def _name_of(facts: NodeFacts, pid: int) -> str:
    """comm, or the command's base name when comm is cut at 15 characters (nvidia-persiste…)."""
    t = facts.root.read_text(f"/proc/{pid}/comm")
    comm = t.strip() if not isinstance(t, Missing) else ""
    raw = facts.root.read_bytes(f"/proc/{pid}/cmdline", 4096)
    argv = proc_pid.cmdline(raw) if not isinstance(raw, Missing) else []
    base = os.path.basename(argv[0]) if argv else ""
    if base and (not comm or (len(comm) == 15 and base.startswith(comm))):
        return base
    return comm or base or "?"


#: the name a holder of gpuwarden's own (this process or a child of it in its cgroup: the NVML probe and event
#: children) is given: infrastructure (memory/attribution.INFRA_NAMES), never a candidate, whatever its comm says
OWN_NAME = "gpuwarden"


def _own_pid(facts: NodeFacts) -> int | None:
    """This process's pid as the root's procfs numbers it (/proc/self there), on a live root only: its own
    probe and event children hold /dev/nvidia* open and must never be taken for a tenant. A bundle or a
    procfs of another pid namespace has no /proc/self that is this process."""
    if not facts.root.live:
        return None
    me = facts.root.readlink("/proc/self")
    return int(me) if isinstance(me, str) and plausible.decimal(me) else None


def _fd_links(root: Any, pid: int, max_fds: int, cut: list[str]) -> list[str] | Missing:
    """Where a process's first `max_fds` descriptors point. A root that reads a directory's links through one
    open of it (HostRoot.readlinks) is asked so: not one confined open a descriptor (~600-900 a check on an
    idle VM, the largest part of the check's CPU)."""
    def first(names: list[str]) -> list[str]:
        fds = sorted((f for f in names if plausible.decimal(f)), key=int)
        if len(fds) > max_fds:
            cut.append(f"pid {pid}: only the first {max_fds} of {len(fds)} descriptors read")
        return fds[:max_fds]

    many = getattr(root, "readlinks", None)
    if many is not None:
        got = many(f"/proc/{pid}/fd", first)
        return got if isinstance(got, Missing) else [got[fd] for fd in sorted(got, key=int)]
    names = root.listdir(f"/proc/{pid}/fd")
    if isinstance(names, Missing):
        return names
    return [t for fd in first(names) if isinstance(t := root.readlink(f"/proc/{pid}/fd/{fd}"), str)]


def scan_holders(facts: NodeFacts) -> tuple[list[A.DeviceHolder], ScanInfo]:
    """Processes with /dev/nvidia* open, newest pids first (workloads start after the GPU daemons)."""
    max_pids = int(_setting(facts, "scan_max_pids", SCAN_MAX_PIDS))
    max_fds = int(_setting(facts, "scan_max_fds_per_pid", SCAN_MAX_FDS_PER_PID))
    max_s = float(_setting(facts, "scan_max_seconds", SCAN_MAX_SECONDS))
    info = ScanInfo()
    t0 = time.monotonic()
    names = facts.root.listdir("/proc")
    if isinstance(names, Missing):
        info.complete, info.reason = False, f"/proc cannot be listed: {names.kind}"
        facts.gap(names)
        return [], info
    pids = sorted((int(n) for n in names if plausible.decimal(n)), reverse=True)
    info.pids_listed = len(pids)
    own = _own_pid(facts)
    own_cgroup = None
    if own is not None:
        text = facts.root.read_text(f"/proc/{own}/cgroup")
        own_cgroup = _pid_cgroup(text)[0] if isinstance(text, str) else None
    holders: list[A.DeviceHolder] = []
    cut = []
    for pid in pids:
        if info.pids_scanned >= max_pids:
            cut.append(f"stopped after {max_pids} processes of {len(pids)}")
            break
        if facts.root.live and time.monotonic() - t0 > max_s:
            cut.append(f"stopped after {max_s:g} s ({info.pids_scanned} of {len(pids)} processes)")
            break
        info.pids_scanned += 1
        links = _fd_links(facts.root, pid, max_fds, cut)
        if isinstance(links, Missing):
            if links.kind == "denied":
                info.denied += 1
            continue
        info.fd_tables_read += 1
        devs: list[str] = []
        for target in links:
            if target.startswith("/dev/nvidia") and target not in devs:
                devs.append(target)
        if not devs:
            continue
        cg_text = facts.root.read_text(f"/proc/{pid}/cgroup")
        path, uid, cid = _pid_cgroup("" if isinstance(cg_text, Missing) else cg_text)
        st = facts.root.read_text(f"/proc/{pid}/stat")
        start = proc_pid.start_ticks(st) if isinstance(st, str) else None
        ktime = proc_pid.kernel_ticks(st) if isinstance(st, str) else None
        maps = facts.root.read_text(f"/proc/{pid}/maps") if uid else None  # pods' processes: the candidates
        # ours: this process, or a child of it still in its cgroup (a child moved into a pod's cgroup, as a
        # scenario's workers are, is that pod's; run 21/22 on the H200)
        mine = own is not None and (pid == own or (isinstance(st, str) and proc_pid.ppid(st) == own
                                                   and path == own_cgroup))
        holders.append(A.DeviceHolder(pid, OWN_NAME if mine else _name_of(facts, pid), tuple(sorted(devs)), path,
                                      uid, cid,
                                      None if start is None else start / CLK_TCK,
                                      None if ktime is None else ktime / CLK_TCK,
                                      proc_pid.faults(st) if isinstance(st, str) else None,
                                      proc_pid.device_maps(maps) if isinstance(maps, str) else None))
    info.seconds = round(time.monotonic() - t0, 3)
    if info.denied:
        cut.append(f"{info.denied} processes' descriptor tables were unreadable (not root?)")
    if info.fd_tables_read == 0 and pids:
        cut.append("no /proc/<pid>/fd table could be read" + ("" if facts.root.live else " (not in this bundle)"))
    if cut:
        info.complete, info.reason = False, "; ".join(cut)
        facts.gap("/proc/*/fd", info.reason)
    return sorted(holders, key=lambda h: h.pid), info


# --------------------------------------------------------------------------- pods

def _pods(facts: NodeFacts, mroot: str | None, holders: list[A.DeviceHolder]) -> tuple[list[L.PodMemory], str]:
    """Every pod from the containers section, plus pods of NVIDIA holders it does not know."""
    gpu_pids: dict[str, list[int]] = {}
    for h in holders:
        if h.pod_uid:
            gpu_pids.setdefault(h.pod_uid, []).append(h.pid)
    out: list[L.PodMemory] = []
    seen: set[str] = set()
    notes = []
    try:
        cf = facts.get("containers")
        why = ""
    except FactUnavailable as exc:
        cf, why = None, str(exc)
    if cf is not None:
        for pod in cf.pods:
            d = cf.layout.dir("memory", pod.cgroup)
            if not d:
                continue
            cg = read_cgroup(facts, d, quiet=True)
            if cg is None:
                parts = []
                for c in pod.containers:
                    cd = cf.layout.dir("memory", c.cgroup)
                    x = read_cgroup(facts, cd, quiet=True) if cd else None
                    if x is not None:
                        parts.append(x)
                cg = _sum_cgroups(d, parts)
            if cg is None:
                facts.gap(f"{d}/memory.stat", "pod memory cgroup unreadable")
                continue
            pids = set(gpu_pids.get(pod.uid, []))
            for c in pod.containers:
                pids.update(p for p in c.pids if any(h.pid == p for h in holders))
            out.append(L.PodMemory(pod.uid, pod.name, pod.namespace, cg, pod.qos, tuple(sorted(pids))))
            seen.add(pod.uid)
        notes.append(f"{len(out)} pods from the containers section")
    else:
        notes.append(f"containers section unavailable ({why}): only pods of NVIDIA device holders, "
                     "found through /proc/<pid>/cgroup")
    names = None
    extra = 0
    for h in holders:
        if not h.pod_uid or h.pod_uid in seen or mroot is None:
            continue
        rel = _pod_rel(h.cgroup)
        if rel is None:
            continue
        seen.add(h.pod_uid)
        cg = read_cgroup(facts, f"{mroot}/{rel}")
        if cg is None:
            continue
        names = names if names is not None else pod_names(facts)
        ns, name = names.get(h.pod_uid, ("", ""))
        qos = next((q for q in ("burstable", "besteffort") if q in rel), "guaranteed")
        out.append(L.PodMemory(h.pod_uid, name, ns, cg, qos, tuple(sorted(gpu_pids.get(h.pod_uid, [])))))
        extra += 1
    if extra:
        notes.append(f"{extra} pod(s) of NVIDIA device holders from /proc/<pid>/cgroup")
    return out, "; ".join(notes)


def _kubepods(facts: NodeFacts, mroot: str) -> L.CgroupMemory | None:
    cf = facts.maybe("containers")
    cands = [cf.kubepods] if cf is not None and cf.kubepods else []
    cands += [c for c in ("kubepods.slice", "kubepods") if c not in cands]
    for c in cands:
        if not isinstance(facts.root.stat(f"{mroot}/{c}"), Missing):
            return read_cgroup(facts, f"{mroot}/{c}")
    return None


# --------------------------------------------------------------------------- kubelet

def _kubelet(facts: NodeFacts, mroot: str | None, version: int | None) -> KubeletMemory | None:
    kf = facts.maybe("kubelet")
    pid = getattr(kf, "pid", None)
    if pid is None:
        procs = facts.maybe("processes")
        found = procs.by_name("kubelet") if procs is not None else []
        pid = found[0].pid if found else None
    path = ""
    if pid is not None:
        t = facts.root.read_text(f"/proc/{pid}/cgroup")
        if not isinstance(t, Missing):
            lines = proc_pid.cgroup_lines(t)
            path = next((p for h, ctl, p in lines if h == "0" and not ctl), "") or \
                next((p for _, ctl, p in lines if "name=systemd" in ctl or "memory" in ctl), "") or \
                next((p for _, _, p in lines), "")
    rel = "/".join(x for x in path.split("/") if x and x != "..") or "system.slice/kubelet.service"
    v2_roots = [CGROUP_ROOT] if version == 2 else [f"{CGROUP_ROOT}/unified"]
    out = KubeletMemory(pid, path or f"/{rel} (assumed)")
    for r in v2_roots:
        p = f"{r}/{rel}/memory.pressure"
        t = facts.root.read_text(p)
        if not isinstance(t, Missing):
            out.pressure, out.pressure_source = pressure.parse(t), p
            break
    if version == 2 and mroot:
        for name in ("memory.min", "memory.low"):
            t = facts.root.read_text(f"{mroot}/{rel}/{name}")
            if not isinstance(t, Missing):
                v = memory_stat.parse_bytes(t)
                if name == "memory.min":
                    out.memory_min = v if v is not None else (None if t.strip() == "max" else 0)
                else:
                    out.memory_low = v
                out.protection_source = f"{mroot}/{rel}"
    if pid is None and out.pressure is None and not out.protection_source:
        return None
    return out


# --------------------------------------------------------------------------- the section

@fact("memory")
def collect_memory(facts: NodeFacts) -> MemoryFacts:
    text = facts.root.read_text("/proc/meminfo")
    if isinstance(text, Missing):
        facts.gap(text)
        raise FactUnavailable(f"/proc/meminfo unreadable: {text.kind}{': ' + text.detail if text.detail else ''}")
    mi = meminfo.parse(text)
    _problems_gap(facts, "/proc/meminfo", mi.problems)
    sources = {"meminfo": "/proc/meminfo"}

    t = _read_optional(facts, "/proc/slabinfo", "NVIDIA slab caches not broken out; slabinfo is root-only")
    slab = slabinfo.parse(t) if t is not None else None
    if slab is not None:
        _problems_gap(facts, "/proc/slabinfo", slab.problems)
        sources["slabinfo"] = "/proc/slabinfo"
    t = _read_optional(facts, "/proc/zoneinfo", "no watermarks")
    zones = zoneinfo.parse(t) if t is not None else None
    if zones is not None:
        _problems_gap(facts, "/proc/zoneinfo", zones.problems)
        sources["zoneinfo"] = "/proc/zoneinfo"
    t = _read_optional(facts, "/proc/vmstat", "")
    vm = vmstat.parse(t) if t is not None else None
    if vm is not None:
        sources["vmstat"] = "/proc/vmstat"
    psi: dict[str, pressure.Pressure] = {}
    for kind in PSI_KINDS:
        p = f"/proc/pressure/{kind}"
        t = _read_optional(facts, p, "kernel without PSI, or booted with psi=0" if kind == "memory" else "")
        if t is not None:
            psi[kind] = pressure.parse(t)
            _problems_gap(facts, p, psi[kind].problems)
            sources[f"psi_{kind}"] = p

    page_size = os.sysconf("SC_PAGE_SIZE") if facts.root.live else L.page_size_from(mi)
    mroot, version = _memory_root(facts)
    if mroot is None:
        facts.gap(f"{CGROUP_ROOT}/memory", "no memory cgroup hierarchy found: no per-cgroup split")
    holders, scan = scan_holders(facts)
    pods, pods_source = _pods(facts, mroot, holders)
    root_cg = kube = None
    system: list[L.CgroupMemory] = []
    if mroot is not None:
        root_cg = read_cgroup(facts, mroot)
        kube = _kubepods(facts, mroot)
        for s in ("system.slice", "user.slice"):
            if not isinstance(facts.root.stat(f"{mroot}/{s}"), Missing):
                x = read_cgroup(facts, f"{mroot}/{s}", quiet=True)
                if x is not None:
                    system.append(x)
    kubelet = _kubelet(facts, mroot, version)

    node = L.node_ledger(mi, slab, page_size)
    split = L.cgroup_split(node, pods, kube, root_cg, system, reason=pods_source)
    thrash = L.thrash_precursors(mi, zones, psi.get("memory"), psi.get("io"), vm, None,
                                 kubelet.pressure if kubelet else None, page_size, thresholds(facts),
                                 {"kubelet": kubelet.pressure_source if kubelet and kubelet.pressure_source
                                  else "kubelet cgroup memory.pressure"})
    gap = split.uncharged_unexplained if split.uncharged_unexplained is not None else node.unexplained
    attribution = A.attribute(holders, pods, gap, gap_threshold(facts, node.total), pod_kernel_threshold(facts),
                              scan.complete)
    ledger = A.MemoryLedger(node, split, thrash, attribution)
    trend = sample = escape = None
    if node.reliable:
        hist = facts.settings.memory_history or recorded_history(facts)
        es = escape_settings(facts)
        view = gpu_view(facts)
        alloc = gpu_allocations(facts)
        if hist is not None:
            sample = _sample(facts, hist, thrash, gap, attribution.suspects, view, es.gpu_full_ratio, holders)
            gpus_of = {s.key: A.candidate_gpus(s, view, alloc)[0] for s in attribution.suspects} if view else None
            trend = hist.trend_with(sample, gpus_of)
        contexts = sum(1 for h in holders if h.compute)
        escape = E.assess(ledger, contexts, view, trend, es, alloc)
    return MemoryFacts(mi, slab, zones, vm, psi, page_size, version, mroot, holders, scan, kubelet, pods_source,
                       ledger, sources, escape, sample)
