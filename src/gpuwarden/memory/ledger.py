"""The node memory ledger: where every byte of MemTotal is, and how much is in no counter at all.

Pure functions of parsed text (no I/O), so a live node, a bundle and a test see
the same arithmetic. Four views of the same memory:

1. `node_ledger`: MemTotal split into the /proc/meminfo categories that do not
   overlap (see docs/memory.md for each field's kernel meaning and why some
   fields are left out), plus the **unexplained remainder**: pages that were
   allocated straight from the page allocator by a driver (incident 4: NVIDIA
   `nv_alloc_pages`) appear in no field.
2. `cgroup_split`: the same memory as the memory cgroups see it. Pages a driver
   charged to a pod as `kernel` (H200, driver 580: unified memory touched on
   the host) are in the remainder too, but the pod's limit covers them; what is
   in the remainder *and* charged to no cgroup is what no limit can stop.
3. `thrash_precursors`: whether the node is already reclaiming itself to death
   (PSI, MemAvailable against the min watermark, reclaim counters).
Who holds the remainder is `memory.attribution`'s job; its `MemoryLedger` bundles the four views
(there, so that this module imports nothing of the package above it).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from msgspec import Struct, field

from gpuwarden.parsers.memory_stat import Charges
from gpuwarden.parsers.meminfo import MemInfo
from gpuwarden.parsers.pressure import Pressure
from gpuwarden.parsers.slabinfo import SlabInfo
from gpuwarden.parsers.vmstat import VmRates, VmStat, rates
from gpuwarden.parsers.zoneinfo import ZoneInfo

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

#: meminfo fields every kernel since 2.6.32 prints before the optional tail; without one the ledger is meaningless
NV_SLAB_SOURCE = "slabinfo nvidia*/nv_*/uvm_* caches"
CORE_FIELDS = ("MemTotal", "MemFree", "Buffers", "Cached", "AnonPages", "KernelStack", "PageTables")


def human(n: int | float | None) -> str:
    """Bytes for people: 33.8 GiB, 15.9 MiB, 512 KiB."""
    if n is None:
        return "unknown"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{sign}{n / size:.1f} {unit}"
    return f"{sign}{int(n)} B"


def human_seconds(s: float) -> str:
    """A memory trend's time span for people: 12 s, 14 min, 2.5 h (coarse: a rate's horizon, not a timestamp)."""
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def page_size_from(meminfo: MemInfo) -> int:
    """Base page size guessed from the default huge page size (a PMD maps 512 pages of 4 KiB on x86-64,
    2048 of 16 KiB or 8192 of 64 KiB on arm64); 4 KiB when unknown."""
    hp = meminfo.get("Hugepagesize")
    return {512 * MiB: 64 * KiB, 32 * MiB: 16 * KiB}.get(hp or 0, 4 * KiB)


# --------------------------------------------------------------------------- node ledger

class Line(Struct, frozen=True):
    """One category of the ledger."""

    key: str
    bytes: int
    source: str  # the meminfo/slabinfo fields it comes from
    meaning: str  # what the kernel counts there, in one phrase
    part_of: str = ""  # for a breakdown line: the summed line (or "unexplained") it is part of

    def to_json(self) -> dict:
        d = {"key": self.key, "bytes": self.bytes, "source": self.source, "meaning": self.meaning}
        if self.part_of:
            d["part_of"] = self.part_of
        return d


class NodeLedger(Struct):
    """Where the node's memory is: meminfo's lines and what none of them counts."""
    total: int
    lines: list[Line]  # disjoint categories: sum(lines) + unexplained == total
    details: list[Line]  # breakdowns inside a line or inside the remainder; not summed
    unexplained: int  # negative when counters overlapped more than accounted for
    reliable: bool
    reason: str = ""  # why the remainder cannot be trusted
    missing: list[str] = field(default_factory=list)  # optional fields absent, counted as 0
    notes: list[str] = field(default_factory=list)
    page_size: int = 4096
    tracked_driver_pages: int | None = None  # objects of nvidia_pte_cache-like slabs (one per driver page)

    @property
    def explained(self) -> int:
        return sum(x.bytes for x in self.lines)

    @property
    def unexplained_ratio(self) -> float:
        return self.unexplained / self.total if self.total > 0 else 0.0

    @property
    def tracked_driver_bytes(self) -> int | None:
        return None if self.tracked_driver_pages is None else self.tracked_driver_pages * self.page_size

    def line(self, key: str) -> Line | None:
        for x in (*self.lines, *self.details):
            if x.key == key:
                return x
        return None

    def to_json(self) -> dict:
        return {
            "total": self.total, "explained": self.explained, "unexplained": self.unexplained,
            "unexplained_ratio": round(self.unexplained_ratio, 4), "reliable": self.reliable,
            "reason": self.reason, "page_size": self.page_size,
            "lines": [x.to_json() for x in self.lines], "details": [x.to_json() for x in self.details],
            "tracked_driver_pages": self.tracked_driver_pages, "missing": list(self.missing),
            "notes": list(self.notes),
        }


def node_ledger(meminfo: MemInfo, slabinfo: SlabInfo | None = None, page_size: int | None = None) -> NodeLedger:
    """Split MemTotal into non-overlapping meminfo categories and the unexplained remainder.

    Counted once each: MemFree, Cached (page cache *including* Shmem), Buffers, SwapCached, AnonPages
    (including AnonHugePages), SReclaimable, SUnreclaim (NVIDIA slab caches broken out), KReclaimable
    beyond SReclaimable, KernelStack, PageTables, SecPageTables, VmallocUsed minus KernelStack (stacks
    are vmalloc'd with CONFIG_VMAP_STACK), Percpu, HugeTLB pools, Zswap, and the small Bounce,
    WritebackTmp, HardwareCorrupted, Unaccepted and Balloon. Left out as subsets of those: Active/Inactive/
    Unevictable/Mlocked (LRU view of the same pages), Mapped, Dirty, Writeback, Shmem*, AnonHugePages,
    FileHugePages, NFS_Unstable, Cma*, Zswapped, HugePages_Free/Rsvd/Surp, DirectMap*.
    """
    ps = page_size or page_size_from(meminfo)
    g = meminfo.get
    total = g("MemTotal") or 0
    lines: list[Line] = []
    details: list[Line] = []
    missing: list[str] = []
    notes: list[str] = []

    def take(key: str, field_: str, meaning: str) -> None:
        v = g(field_)
        if v:
            lines.append(Line(key, v, f"meminfo {field_}", meaning))

    core_missing = [f for f in CORE_FIELDS if f not in meminfo]
    if "Slab" not in meminfo and not ("SReclaimable" in meminfo and "SUnreclaim" in meminfo):
        core_missing.append("Slab")

    take("free", "MemFree", "pages on the free lists")
    take("page_cache", "Cached", "page cache of files, plus shmem/tmpfs/SysV shm and shared anonymous mappings")
    shmem = g("Shmem")
    if shmem:
        details.append(Line("shmem", shmem, "meminfo Shmem",
                            "tmpfs, shared anonymous memory, SysV shm; "
                            "pinned host memory (cudaHostAlloc) on driver 580",
                            part_of="page_cache"))
    take("buffers", "Buffers", "page cache of block devices (filesystem metadata)")
    take("swap_cache", "SwapCached", "anonymous pages in the swap cache (those still mapped are also in AnonPages)")
    take("anon", "AnonPages", "anonymous pages mapped by processes (heap, stacks, private mappings)")
    thp = g("AnonHugePages")
    if thp:
        details.append(Line("anon_huge", thp, "meminfo AnonHugePages", "transparent huge pages", part_of="anon"))

    # slab, with the NVIDIA caches broken out of the unreclaimable part (they are created without SLAB_RECLAIM_ACCOUNT)
    nv_bytes = slabinfo.nvidia_bytes(ps) if slabinfo is not None else 0
    srec, sunr, slab = g("SReclaimable"), g("SUnreclaim"), g("Slab")
    if srec is not None and sunr is not None:
        nv = min(nv_bytes, sunr)
        take("slab_reclaimable", "SReclaimable", "slab the kernel can shrink (dentries, inodes …)")
        if sunr - nv:
            lines.append(Line("slab_unreclaimable", sunr - nv, "meminfo SUnreclaim" + (" − NVIDIA caches" if nv else ""),
                              "slab the kernel cannot shrink"))
        if nv:
            lines.append(Line("slab_nvidia", nv, NV_SLAB_SOURCE, "slab of the NVIDIA kernel modules"))
    elif slab is not None:
        nv = min(nv_bytes, slab)
        if slab - nv:
            lines.append(Line("slab", slab - nv, "meminfo Slab" + (" − NVIDIA caches" if nv else ""),
                              "kernel slab caches"))
        if nv:
            lines.append(Line("slab_nvidia", nv, NV_SLAB_SOURCE, "slab of the NVIDIA kernel modules"))
    if slabinfo is not None:
        for c in sorted(slabinfo.nvidia(), key=lambda c: -c.size_bytes(ps)):
            if c.size_bytes(ps) or c.active_objs:
                details.append(Line(f"slab:{c.name}", c.size_bytes(ps),
                                    f"slabinfo {c.name}: {c.active_objs} active objects of {c.objsize} B",
                                    "NVIDIA kernel-module cache", part_of="slab_nvidia"))
    krec = g("KReclaimable")
    if krec is not None and srec is not None and krec > srec:
        lines.append(Line("kreclaimable_other", krec - srec, "meminfo KReclaimable − SReclaimable",
                          "other reclaimable kernel allocations (e.g. ION/dma-buf pools)"))
    take("kernel_stack", "KernelStack", "kernel stacks of all tasks")
    take("page_tables", "PageTables", "page tables of user processes")
    take("sec_page_tables", "SecPageTables", "secondary page tables (KVM, IOMMU)")
    vm = g("VmallocUsed")
    if vm is None:
        missing.append("VmallocUsed")
    elif vm > 0:
        ks = g("KernelStack") or 0
        v = max(0, vm - ks)
        if v:
            lines.append(Line("vmalloc", v, "meminfo VmallocUsed − KernelStack",
                              "vmalloc'd pages (modules, kvmalloc fallbacks, BPF …) other than vmap'd kernel stacks"))
        notes.append("VmallocUsed includes vmap'd kernel stacks (CONFIG_VMAP_STACK, default on x86-64 and arm64); "
                     "KernelStack is subtracted from it to count them once")
    take("percpu", "Percpu", "per-CPU allocator chunks")
    hugetlb = g("Hugetlb")
    hp_total, hp_size = g("HugePages_Total"), g("Hugepagesize")
    if hugetlb is not None:
        if hugetlb:
            lines.append(Line("hugetlb", hugetlb, "meminfo Hugetlb", "HugeTLB pools of every size, free or used"))
    elif hp_total is not None and hp_size is not None:
        if hp_total:
            lines.append(Line("hugetlb", hp_total * hp_size, "meminfo HugePages_Total × Hugepagesize",
                              "HugeTLB pool of the default size, free or used"))
    else:
        missing.append("Hugetlb")
    take("zswap", "Zswap", "compressed pool of zswap")
    for key, fld, meaning in (("bounce", "Bounce", "bounce buffers for block I/O"),
                              ("writeback_tmp", "WritebackTmp", "FUSE temporary writeback buffers"),
                              ("hw_corrupted", "HardwareCorrupted", "pages poisoned by memory errors"),
                              ("unaccepted", "Unaccepted", "confidential-VM memory not yet accepted"),
                              ("balloon", "Balloon", "pages inflated into the hypervisor's balloon")):
        v = g(fld)
        if v:
            lines.append(Line(key, v, f"meminfo {fld}", meaning))

    explained = sum(x.bytes for x in lines)
    unexplained = total - explained

    # the LRU lists hold the same pages as Cached+Buffers+SwapCached+AnonPages; a big gap means a counter is off
    lru = [g(k) for k in ("Active", "Inactive", "Unevictable")]
    if all(v is not None for v in lru[:2]):
        content = sum(g(k) or 0 for k in ("Buffers", "Cached", "SwapCached", "AnonPages"))
        delta = content - sum(v or 0 for v in lru)
        if total and abs(delta) > 0.02 * total:
            notes.append(f"Buffers+Cached+SwapCached+AnonPages and the LRU lists (Active+Inactive+Unevictable) differ "
                         f"by {human(delta)}: pages isolated for reclaim or migration, or mapped swap-cache pages "
                         "counted twice")

    mapped, cached = g("Mapped"), g("Cached")
    if mapped is not None and cached is not None and mapped > cached:
        details.append(Line("mapped_not_cached", mapped - cached, "meminfo Mapped − Cached",
                            "pages mapped into processes as file pages that are not page cache: driver-owned pages "
                            "(UVM memory touched on the host shows here on driver 580)", part_of="unexplained"))

    tracked = None
    if slabinfo is not None and slabinfo.driver_page_trackers():
        tracked = slabinfo.tracked_driver_pages()
        names = ", ".join(c.name for c in slabinfo.driver_page_trackers())
        details.append(Line("driver_pages_tracked", tracked * ps,
                            f"slabinfo {names}: {tracked} active objects × {ps} B",
                            "host pages the NVIDIA driver allocated (one tracking object per page)",
                            part_of="unexplained"))

    reliable, reason = True, ""
    if total <= 0:
        reliable, reason = False, "meminfo has no usable MemTotal"
    elif core_missing:
        reliable, reason = False, f"meminfo lacks {', '.join(core_missing)} (cut short or not meminfo)"
    elif meminfo.truncated:
        reliable, reason = False, "meminfo was cut short: fields at its end (Hugetlb, VmallocUsed …) may be missing"
    elif "Hugetlb" in missing:
        notes.append("no Hugetlb/HugePages_Total field: HugeTLB pools, if any, are counted as unexplained")
    if reliable and unexplained < -0.02 * total:
        notes.append(f"categories exceed MemTotal by {human(-unexplained)}: fields read at different moments or "
                     "counted in two places")
    return NodeLedger(total, lines, details, unexplained, reliable, reason, missing, notes, ps, tracked)


# --------------------------------------------------------------------------- cgroup split

class CgroupMemory(Struct, frozen=True):
    """One memory cgroup as read from its directory."""

    path: str  # node path of the cgroup directory
    charges: Charges | None
    current: int | None = None  # memory.current (v2) / memory.usage_in_bytes (v1)
    limit: int | None = None  # memory.max / memory.limit_in_bytes; None = unlimited or unknown
    pressure: Pressure | None = None
    protection_min: int | None = None  # memory.min (v2)
    protection_low: int | None = None  # memory.low (v2)
    source: str = ""  # the memory.stat path read

    @property
    def kernel_other(self) -> int | None:
        return self.charges.kernel_other if self.charges else None

    @property
    def kernel(self) -> int | None:
        return self.charges.kernel if self.charges else None

    def to_json(self) -> dict:
        c = self.charges
        d = {"path": self.path, "source": self.source, "current": self.current, "limit": self.limit}
        if c is not None:
            d.update({"version": c.version, "anon": c.anon, "file": c.file, "shmem": c.shmem, "kernel": c.kernel,
                      "kernel_other": c.kernel_other, "slab": c.slab, "sock": c.sock,
                      "driver_mapped": c.driver_mapped})
        if self.pressure is not None and not self.pressure.empty:
            d["pressure"] = self.pressure.quote()
        if self.protection_min is not None:
            d["memory_min"] = self.protection_min
        return d


class PodMemory(Struct, frozen=True):
    """A pod's memory cgroup and its GPU processes."""
    uid: str
    name: str
    namespace: str
    cgroup: CgroupMemory
    qos: str = ""
    gpu_pids: tuple[int, ...] = ()  # pids of the pod holding NVIDIA device files open

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.name else f"pod {self.uid}"

    def to_json(self) -> dict:
        return {"uid": self.uid, "name": self.name, "namespace": self.namespace, "qos": self.qos,
                "gpu_pids": list(self.gpu_pids), "cgroup": self.cgroup.to_json()}


class CgroupSplit(Struct):
    """Memory charged to pods, the kubepods slice, root and system cgroups."""
    available: bool
    reason: str  # why the split is absent or partial
    pods: list[PodMemory] = field(default_factory=list)
    kubepods: CgroupMemory | None = None
    root: CgroupMemory | None = None
    system: list[CgroupMemory] = field(default_factory=list)
    #: kernel memory charged to cgroups that meminfo does not show (it is inside the remainder)
    charged_outside_meminfo: int | None = None
    charged_outside_source: str = ""
    #: True on v2 (`kernel` minus its known parts); False on v1 (whole kmem: an upper bound)
    exact: bool = False
    #: the remainder that no cgroup is charged for: what no memory limit can stop
    uncharged_unexplained: int | None = None

    def pods_kernel_other(self) -> list[tuple[PodMemory, int]]:
        out = [(p, p.cgroup.kernel_other) for p in self.pods if p.cgroup.kernel_other]
        return sorted(((p, k) for p, k in out if k is not None), key=lambda t: -t[1])

    def to_json(self) -> dict:
        return {
            "available": self.available, "reason": self.reason, "exact": self.exact,
            "charged_outside_meminfo": self.charged_outside_meminfo,
            "charged_outside_source": self.charged_outside_source,
            "uncharged_unexplained": self.uncharged_unexplained,
            "root": self.root.to_json() if self.root else None,
            "kubepods": self.kubepods.to_json() if self.kubepods else None,
            "system": [s.to_json() for s in self.system],
            "pods": [p.to_json() for p in self.pods],
        }


def _sum_opt(xs: Iterable[int | None]) -> int | None:
    vals = [x for x in xs if x is not None]
    return sum(vals) if vals else None


def cgroup_split(node: NodeLedger, pods: Sequence[PodMemory] = (), kubepods: CgroupMemory | None = None,
                 root: CgroupMemory | None = None, system: Sequence[CgroupMemory] = (),
                 reason: str = "") -> CgroupSplit:
    """The node's memory as the memory cgroups are charged for it.

    Kernel pages charged beyond slab/stacks/page tables/percpu/vmalloc are in no meminfo field, so they
    are part of the remainder; subtracting them leaves the part no cgroup pays for. The broadest cgroup
    read wins (root, then kubepods plus system cgroups, then the pods), so nothing is subtracted twice.
    On cgroup v1 the kernel charge cannot be split, so the whole kmem usage is subtracted: the uncharged
    figure is then a lower bound.
    """
    available = bool(pods) or kubepods is not None or root is not None
    split = CgroupSplit(available, reason or ("" if available else "no memory cgroup was readable"),
                        list(pods), kubepods, root, list(system))
    if not available:
        return split
    candidates: list[tuple[str, int | None, bool]] = []
    if root is not None and root.charges is not None and root.charges.version == 2:
        candidates.append((f"{root.source} kernel − slab/stacks/page tables/percpu/vmalloc", root.kernel_other, True))
    if kubepods is not None and kubepods.charges is not None:
        tops = [kubepods, *system]
        if kubepods.charges.version == 2:
            candidates.append(("kubepods and system cgroups: kernel − its known parts",
                               _sum_opt(c.kernel_other for c in tops), True))
        else:
            candidates.append(("kubepods and system cgroups: memory.kmem.usage_in_bytes (v1, not separable)",
                               _sum_opt(c.kernel for c in tops), False))
    if pods:
        v2 = all(p.cgroup.charges is not None and p.cgroup.charges.version == 2 for p in pods)
        vals = [p.cgroup.kernel_other if v2 else p.cgroup.kernel for p in pods]
        candidates.append(("pods: kernel − its known parts" if v2 else
                           "pods: memory.kmem.usage_in_bytes (v1, not separable)", _sum_opt(vals), v2))
    for source, value, exact in candidates:
        if value is not None:
            split.charged_outside_meminfo, split.charged_outside_source, split.exact = value, source, exact
            break
    if node.reliable:
        charged = split.charged_outside_meminfo or 0
        split.uncharged_unexplained = max(0, node.unexplained - charged)
    return split


# --------------------------------------------------------------------------- thrash precursors

class ThrashThresholds(Struct, frozen=True):
    """When the node counts as thrashing. Defaults and their reasons: docs/memory.md."""

    psi_full_avg10: float = 10.0  # % of time every task stalled on memory (systemd-oomd acts at 60 % over 30 s)
    psi_full_avg60: float = 5.0
    available_ratio: float = 0.05  # MemAvailable below 5 % of MemTotal: earlyoom's SIGKILL threshold
    available_to_min: float = 4.0  # MemAvailable within 4 × the summed min watermarks
    io_full_avg10: float = 20.0  # supporting only: a disk-bound workload also stalls on io
    majfault_per_s: float = 1000.0  # with two samples: re-reading evicted code and libraries


class MemorySignal(Struct, frozen=True):
    """One sign of memory pressure (PSI, kswapd, watermarks) and its source."""
    key: str
    strong: bool  # a precursor by itself; weak ones only support
    text: str
    source: str


class Thrash(Struct):
    """Whether the node thrashes now: the signals, watermarks and rates."""
    signals: list[MemorySignal]
    mem_available: int | None = None
    min_watermark: int | None = None
    low_watermark: int | None = None
    high_watermark: int | None = None
    rates: VmRates | None = None

    @property
    def present(self) -> bool:
        return any(s.strong for s in self.signals)

    @property
    def available_to_min(self) -> float | None:
        if self.mem_available is None or not self.min_watermark:
            return None
        return self.mem_available / self.min_watermark

    def to_json(self) -> dict:
        return {"present": self.present, "mem_available": self.mem_available, "min_watermark": self.min_watermark,
                "low_watermark": self.low_watermark, "high_watermark": self.high_watermark,
                "available_to_min": None if self.available_to_min is None else round(self.available_to_min, 3),
                "signals": [{"key": s.key, "strong": s.strong, "text": s.text, "source": s.source}
                            for s in self.signals]}


def thrash_rates(before: VmStat, after: VmStat, dt: float) -> VmRates:
    """Reclaim/refault rates between two /proc/vmstat samples taken dt seconds apart (the agent's input)."""
    return rates(before, after, dt)


def thrash_precursors(meminfo: MemInfo, zoneinfo: ZoneInfo | None = None, psi_memory: Pressure | None = None,
                      psi_io: Pressure | None = None, vmstat: VmStat | None = None, vm_rates: VmRates | None = None,
                      kubelet_pressure: Pressure | None = None, page_size: int | None = None,
                      thresholds: ThrashThresholds = ThrashThresholds(),
                      sources: dict[str, str] | None = None) -> Thrash:
    """Signs that reclaim is already stalling the node: the state in which incident 4's nodes went NotReady
    without the OOM killer ever firing. One vmstat sample is quoted as history only; rates need two."""
    src = {"meminfo": "/proc/meminfo", "zoneinfo": "/proc/zoneinfo", "psi_memory": "/proc/pressure/memory",
           "psi_io": "/proc/pressure/io", "vmstat": "/proc/vmstat", "kubelet": "kubelet cgroup memory.pressure"}
    src.update(sources or {})
    ps = page_size or page_size_from(meminfo)
    t = thresholds
    out = Thrash([], mem_available=meminfo.get("MemAvailable"))
    total = meminfo.get("MemTotal") or 0
    if zoneinfo is not None and zoneinfo.min_pages:
        out.min_watermark = zoneinfo.min_pages * ps
        out.low_watermark = (zoneinfo.low_pages or 0) * ps or None
        out.high_watermark = (zoneinfo.high_pages or 0) * ps or None
    avail = out.mem_available
    if avail is not None and total > 0 and avail < t.available_ratio * total:
        out.signals.append(MemorySignal("mem-available-low", True,
                                  f"MemAvailable {avail // KiB} kB is {100 * avail / total:.2f}% of MemTotal "
                                  f"{total // KiB} kB (below {100 * t.available_ratio:g}%)", src["meminfo"]))
    ratio = out.available_to_min
    if ratio is not None and ratio < t.available_to_min:
        out.signals.append(MemorySignal("near-min-watermark", True,
                                  f"MemAvailable {human(avail)} is {ratio:.2f}× the summed min watermark "
                                  f"{human(out.min_watermark)} (low {human(out.low_watermark)}, high "
                                  f"{human(out.high_watermark)}): reclaim runs on every allocation",
                                  f"{src['meminfo']}, {src['zoneinfo']}"))
    if psi_memory is not None and psi_memory.full is not None:
        f = psi_memory.full
        if f.avg10 >= t.psi_full_avg10 or f.avg60 >= t.psi_full_avg60:
            out.signals.append(MemorySignal("psi-memory-full", True, f"memory {psi_memory.quote()}", src["psi_memory"]))
    if kubelet_pressure is not None and kubelet_pressure.full is not None:
        f = kubelet_pressure.full
        if f.avg10 >= t.psi_full_avg10 or f.avg60 >= t.psi_full_avg60:
            out.signals.append(MemorySignal("psi-kubelet-full", True,
                                      f"kubelet's cgroup memory {kubelet_pressure.quote()}: kubelet itself is stalled",
                                      src["kubelet"]))
    if psi_io is not None and psi_io.full is not None and psi_io.full.avg10 >= t.io_full_avg10:
        out.signals.append(MemorySignal("psi-io-full", False, f"io {psi_io.quote()} (refaults re-read from disk)",
                                  src["psi_io"]))
    if vm_rates is not None:
        out.rates = vm_rates
        if vm_rates.pgmajfault is not None and vm_rates.pgmajfault >= t.majfault_per_s:
            out.signals.append(MemorySignal("majfault-rate", True,
                                      f"{vm_rates.pgmajfault:.0f} major faults/s over {vm_rates.dt:.0f} s",
                                      src["vmstat"]))
        if vm_rates.pgscan_kswapd:
            out.signals.append(MemorySignal("kswapd-scanning", False,
                                      f"kswapd scans {vm_rates.pgscan_kswapd:.0f} pages/s", src["vmstat"]))
    elif vmstat is not None:
        hist = [(k, v) for k, v in (("pgmajfault", vmstat.pgmajfault()), ("pgscan_kswapd", vmstat.pgscan_kswapd()),
                                    ("pgsteal", vmstat.pgsteal()), ("workingset_refault", vmstat.refaults()),
                                    ("allocstall", vmstat.allocstalls())) if v is not None]
        if (vmstat.pgscan_kswapd() or 0) > 0 or (vmstat.allocstalls() or 0) > 0:
            out.signals.append(MemorySignal("reclaim-history", False,
                                      " ".join(f"{k} {v}" for k, v in hist) + " (cumulative since boot)",
                                      src["vmstat"]))
    return out
