#!/usr/bin/env python3
"""Build the example node `driver-memory-cascade` (incident 4) over the `healthy` example.

Every number the write-up gives is used verbatim: /proc/meminfo whole, the
slabtop table (transcribed to /proc/slabinfo 2.1 lines), the java pid and the
uptime of its kprobe trace. What the write-up does not give (zoneinfo, vmstat,
PSI, the memory cgroups) is derived from those numbers and marked as such in
ORIGIN.md. The healthy base supplies the rest of the node (driver, kubelet,
device plugin), so files outside the memory sources describe the base's H200,
not the incident's T4.

    python tools/build_memory_example.py   # rewrites src/gpuwarden/examples/driver-memory-cascade
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "src/gpuwarden/examples/driver-memory-cascade"
BASE = REPO / "src/gpuwarden/examples/healthy"

KiB = 1024
BTIME = 1795313527  # the base's /proc/stat btime (the node's boot)
UPTIME = 637720  # the write-up's kprobe trace runs at uptime 637715-637716 s; captured just after
CAPTURED = float(BTIME + UPTIME)
CLK = 100

POD_UID = "5e0c3a7e-2b1d-4c9a-8e7f-6d5c4b3a2918"
POD_NS, POD_NAME, CTR_NAME = "render", "egl-render-0", "render"
CID = "b7d3e1f09a8c2b4d6e5f7a9c1b3d5e7f9a2c4e6f8b0d1c3e5a7b9d2f4c6e8a01"
CID_PAUSE = "c2e4a6b8d0f1e3c5a7b9d1f3e5c7a9b2d4f6e8a0c1b3d5f7e9a2c4b6d8f0e1a3"
JAVA_PID = 2657537  # `java-2657537` in the write-up's nvos_create_alloc trace
PAUSE_PID = 2657101
PERSISTENCED_PID = 1089
KUBELET_PID = 1200  # the base's kubelet

# ---- verbatim from the write-up (4-driver-kernel-memory-node-cascade.zh.md) ----------------------
MEMINFO = """\
MemTotal: 63596320 kB
MemFree: 433348 kB
MemAvailable: 16240 kB
Buffers: 852 kB
Cached: 26580 kB
SwapCached: 0 kB
Active: 16720 kB
Inactive: 27111048 kB
Active(anon): 3880 kB
Inactive(anon): 27101972 kB
Active(file): 12840 kB
Inactive(file): 9076 kB
Unevictable: 0 kB
Mlocked: 0 kB
SwapTotal: 0 kB
SwapFree: 0 kB
Dirty: 12 kB
Writeback: 0 kB
AnonPages: 27100712 kB
Mapped: 105652 kB
Shmem: 5188 kB
Slab: 516752 kB
SReclaimable: 47820 kB
SUnreclaim: 468932 kB
KernelStack: 16512 kB
PageTables: 72564 kB
NFS_Unstable: 0 kB
Bounce: 0 kB
WritebackTmp: 0 kB
CommitLimit: 31798160 kB
Committed_AS: 53252204 kB
VmallocTotal: 34359738367 kB
VmallocUsed: 0 kB
VmallocChunk: 0 kB
Percpu: 15360 kB
HardwareCorrupted: 0 kB
AnonHugePages: 25145344 kB
ShmemHugePages: 0 kB
ShmemPmdMapped: 0 kB
FileHugePages: 0 kB
FilePmdMapped: 0 kB
CmaTotal: 0 kB
CmaFree: 0 kB
HugePages_Total: 0
HugePages_Free: 0
HugePages_Rsvd: 0
HugePages_Surp: 0
Hugepagesize: 2048 kB
Hugetlb: 0 kB
DirectMap4k: 37127992 kB
DirectMap2M: 26834944 kB
DirectMap1G: 3145728 kB
"""

SLABTOP = """\
OBJS ACTIVE USE OBJ SIZE SLABS OBJ/SLAB CACHE SIZE NAME
8650926 8650926 100% 0.04K 84813 102 339252K nvidia_pte_cache-2782818403
69760 67912 97% 0.06K 1090 64 4360K kmalloc-64
61698 28017 43% 0.20K 1582 39 12656K dentry
60099 27130 45% 0.13K 1541 30 6328K kernfs_node_cache
32096 32096 100% 0.50K 1003 32 16048K kmalloc-512
32064 32064 100% 0.12K 1002 32 6032K kmalloc-128
26132 29632 97% 0.03K 206 128 814K kmalloc-32
26080 26017 96% 1.00K 815 32 26080K kmalloc-1024
21760 21760 100% 0.02K 85 256 340K kmalloc-16
20076 20076 100% 0.09K 478 42 1912K kmalloc-96
18070 13330 73% 0.61K 695 26 11120K inode_cache
17850 17850 100% 0.04K 175 102 700K Acpi-Namespace
14352 5455 38% 0.09K 312 46 1248K vmap_area
14994 14994 100% 0.04K 147 102 588K ext4_extent_status
14352 5455 38% 0.29K 312 46 1248K vmap_area
12670 11725 92% 0.06K 202 64 896K anon_vma_chain
12416 11577 93% 0.01K 194 512 776K kmalloc-8
10248 3764 36% 0.57K 366 28 5856K radix_tree_node
9072 4018 44% 1.09K 324 29 9184K ext4_inode_cache
8992 8992 100% 0.12K 281 32 1124K seq_file
7461 3473 38% 1.09K 309 29 9888K ext4_inode_cache
7527 7527 100% 0.10K 193 39 772K anon_vma
7476 7243 96% 0.29K 278 42 1424K kmalloc-192
6486 6115 86% 0.69K 141 46 4512K ovl_inode
6486 4047 62% 0.69K 141 46 4512K ovl_inode
6300 6300 100% 0.71K 140 45 4480K shmem_inode_cache
5734 5568 97% 2.68K 122 47 3904K proc_inode_cache
5350 5350 100% 0.16K 214 25 856K sigqueue
5265 4740 97% 0.10K 135 39 540K buffer_head
4688 4688 100% 2.00K 293 16 9376K kmalloc-2048
4536 4536 100% 0.19K 108 42 864K cred_jar
4505 4505 100% 0.05K 53 85 212K ftrace_event_field
4096 4096 100% 0.02K 16 256 64K selinux_file_security
4096 4096 100% 0.02K 16 256 64K selinux_file_security
3104 3104 100% 0.25K 97 32 776K skbuff_head_cachervation
2958 2958 100% 0.08K 58 51 232K task_delay_info
2912 2912 100% 0.07K 52 56 208K Acpi-Operand
2720 2720 100% 0.02K 16 170 64K avtab_node
2436 2436 100% 0.14K 87 28 348K ext4_groupinfo_4k
1856 1856 100% 0.25K 58 32 464K kmalloc-256
1856 1856 100% 0.06K 29 64 116K ebitmap_node
1632 1632 100% 0.04K 16 102 64K pde_opener
1600 1600 100% 0.16K 64 25 256K sigqueue
1512 1512 100% 0.19K 36 42 288K proc_dir_entry
1460 1460 100% 0.05K 20 73 80K mbcache
1408 1408 100% 0.25K 44 32 352K pool_workqueue
1380 1380 100% 1.06K 46 30 1472K signal_cache
1334 1334 100% 0.69K 29 46 928K sock_inode_cache
1292 1292 100% 0.12K 38 34 152K jbd2_journal_head
1288 1288 100% 0.07K 23 56 92K eventpoll_pwq
1168 1168 100% 0.05K 16 73 64K Acpi-Parse
1143 1126 98% 8.19K 381 3 12192K task_struct
1037 1082 100% 0.06K 79 64 28K ext4_io_end
1088 1088 100% 0.06K 17 64 68K ext4_io_end
897 897 100% 0.10K 23 39 92K blkdev_ioc
896 896 100% 0.07K 16 56 64K jbd2_journal_handle
850 636 74% 0.31K 34 25 272K bio-0
828 828 100% 0.69K 18 46 576K files_cache
784 784 100% 0.56K 28 48 448K skbuff_fclone_cache
"""

#: obvious transcription slips of the screenshot, corrected
RENAMES = {"skbuff_head_cachervation": "skbuff_head_cache"}


def kb(field: str) -> int:
    m = re.search(rf"^{re.escape(field)}:\s+(\d+)", MEMINFO, re.M)
    assert m, field
    return int(m.group(1))


def slabinfo_text() -> tuple[str, list[str]]:
    """slabtop rows → slabinfo 2.1 lines. objsize from OBJ SIZE (K × 1024, capped so objperslab objects fit the
    slab), pagesperslab from CACHE SIZE / SLABS. A name listed twice keeps its first self-consistent row
    (ACTIVE ≤ OBJS ≤ SLABS × OBJ/SLAB); a row inconsistent in itself is repaired, and both are noted."""
    notes: list[str] = []
    by_name: dict[str, list[list[str]]] = {}
    for line in SLABTOP.splitlines()[1:]:
        f = line.split()
        f[7] = RENAMES.get(f[7], f[7])
        by_name.setdefault(f[7], []).append(f)

    def ok(f: list[str]) -> bool:
        return int(f[1]) <= int(f[0]) <= int(f[4]) * int(f[5])

    lines = []
    for name, rows in by_name.items():
        row = next((r for r in rows if ok(r)), rows[0])
        for r in rows:
            if r is not row:
                notes.append(f"second row for {name} dropped: `{' '.join(r)}`")
        objs, active, _use, size, slabs, per, cache, _ = row
        objs_i, active_i, slabs_i, per_i = int(objs), int(active), int(slabs), int(per)
        if not ok(row):
            objs_i, active_i = max(objs_i, active_i), min(objs_i, active_i)
            slabs_i = max(slabs_i, -(-objs_i // per_i))
            notes.append(f"`{' '.join(row)}` repaired to {active_i} active of {objs_i} objects in {slabs_i} slabs")
        pages = max(1, round(int(cache.rstrip("K")) / max(1, int(slabs)) / 4))
        objsize = min(int(round(float(size.rstrip("K")) * 1024)), pages * 4096 // per_i)
        lines.append(f"{name:<27} {active_i:>7} {objs_i:>7} {objsize:>6} {per_i:>4} {pages:>4} : tunables    0    0"
                     f"    0 : slabdata {slabs_i:>6} {slabs_i:>6}      0\n")
    head = ("slabinfo - version: 2.1\n# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab>"
            " : tunables <limit> <batchcount> <sharedfactor> : slabdata <active_slabs> <num_slabs> <sharedavail>\n")
    return head + "".join(lines), notes


def zoneinfo_text() -> str:
    """5.10-format zoneinfo for a 64 GiB x86-64 host: managed pages sum to MemTotal, free pages to MemFree,
    min_free_kbytes 67584 (the THP-recommended value for 3 zones), split by managed pages, low/high by
    watermark_scale_factor 10 (mm/page_alloc.c __setup_per_zone_wmarks)."""
    total_pages = kb("MemTotal") // 4
    free_pages = kb("MemFree") // 4
    zones = [("DMA", 3998, 3840), ("DMA32", 782298, 741532), ("Normal", 0, 0)]
    zones[2] = ("Normal", 15990784, total_pages - 3840 - 741532)
    min_total = 67584 // 4
    frees = {"DMA": 3840, "DMA32": 60000}
    frees["Normal"] = free_pages - frees["DMA"] - frees["DMA32"]
    out = []
    for i, (name, present, managed) in enumerate(zones):
        mn = min_total * managed // total_pages
        delta = max(mn // 4, managed * 10 // 10000)
        lo, hi = mn + delta, mn + 2 * delta
        out.append(f"Node 0, zone {name:>8}\n")
        if i == 0:
            out.append("  per-node stats\n")
            for k, v in (("nr_inactive_anon", kb("Inactive(anon)") // 4), ("nr_active_anon", kb("Active(anon)") // 4),
                         ("nr_inactive_file", kb("Inactive(file)") // 4), ("nr_active_file", kb("Active(file)") // 4),
                         ("nr_unevictable", 0), ("nr_slab_reclaimable", kb("SReclaimable") // 4),
                         ("nr_slab_unreclaimable", kb("SUnreclaim") // 4), ("nr_anon_pages", kb("AnonPages") // 4),
                         ("nr_mapped", kb("Mapped") // 4), ("nr_file_pages", (kb("Cached") + kb("Buffers")) // 4),
                         ("nr_shmem", kb("Shmem") // 4), ("nr_anon_transparent_hugepages", kb("AnonHugePages") // 2048)):
                out.append(f"      {k:<14} {v}\n")
        out.append(f"  pages free     {frees[name]}\n        min      {mn}\n        low      {lo}\n"
                   f"        high     {hi}\n        spanned  {present + 97 if name != 'DMA' else 4095}\n"
                   f"        present  {present}\n        managed  {managed}\n"
                   f"        protection: (0, {'2839, 61954, 61954, 61954' if name == 'DMA' else '0, 59115, 59115, 59115' if name == 'DMA32' else '0, 0, 0, 0'})\n"
                   f"      nr_free_pages {frees[name]}\n  pagesets\n    cpu: 0\n              count: 0\n"
                   f"              high:  {0 if name == 'DMA' else 378}\n              batch: {1 if name == 'DMA' else 63}\n"
                   f"  vm stats threshold: {6 if name == 'DMA' else 72}\n  node_unreclaimable:  0\n"
                   f"  start_pfn:           {1 if name == 'DMA' else 4096 if name == 'DMA32' else 1048576}\n")
    return "".join(out)


def vmstat_text() -> str:
    """Gauges from the meminfo above; event counters illustrative of hours of thrash (see ORIGIN.md)."""
    g = {
        "nr_free_pages": kb("MemFree") // 4, "nr_zone_inactive_anon": kb("Inactive(anon)") // 4,
        "nr_zone_active_anon": kb("Active(anon)") // 4, "nr_zone_inactive_file": kb("Inactive(file)") // 4,
        "nr_zone_active_file": kb("Active(file)") // 4, "nr_zone_unevictable": 0, "nr_mlock": 0,
        "nr_bounce": 0, "nr_free_cma": 0, "nr_inactive_anon": kb("Inactive(anon)") // 4,
        "nr_active_anon": kb("Active(anon)") // 4, "nr_inactive_file": kb("Inactive(file)") // 4,
        "nr_active_file": kb("Active(file)") // 4, "nr_unevictable": 0,
        "nr_slab_reclaimable": kb("SReclaimable") // 4, "nr_slab_unreclaimable": kb("SUnreclaim") // 4,
        "nr_isolated_anon": 0, "nr_isolated_file": 0, "workingset_nodes": 2113,
        "workingset_refault_anon": 0, "workingset_refault_file": 913442871, "workingset_activate_anon": 0,
        "workingset_activate_file": 402117733, "workingset_restore_anon": 0, "workingset_restore_file": 388120934,
        "workingset_nodereclaim": 1211, "nr_anon_pages": kb("AnonPages") // 4, "nr_mapped": kb("Mapped") // 4,
        "nr_file_pages": (kb("Cached") + kb("Buffers")) // 4, "nr_dirty": kb("Dirty") // 4, "nr_writeback": 0,
        "nr_writeback_temp": 0, "nr_shmem": kb("Shmem") // 4, "nr_shmem_hugepages": 0, "nr_shmem_pmdmapped": 0,
        "nr_file_hugepages": 0, "nr_file_pmdmapped": 0,
        "nr_anon_transparent_hugepages": kb("AnonHugePages") // 2048, "nr_vmscan_write": 0,
        "nr_vmscan_immediate_reclaim": 1432, "nr_dirtied": 88120334, "nr_written": 87644102,
        "nr_kernel_misc_reclaimable": 0, "nr_foll_pin_acquired": 0, "nr_foll_pin_released": 0,
        "nr_kernel_stack": kb("KernelStack"), "nr_page_table_pages": kb("PageTables") // 4, "nr_swapcached": 0,
        "pgpgin": 3871113400, "pgpgout": 402331108, "pswpin": 0, "pswpout": 0,
        "pgalloc_dma": 0, "pgalloc_dma32": 120334521, "pgalloc_normal": 4477120348, "pgalloc_movable": 0,
        "allocstall_dma": 0, "allocstall_dma32": 20117, "allocstall_normal": 2913337, "allocstall_movable": 0,
        "pgfree": 4610213004, "pgactivate": 512330998, "pgdeactivate": 498211034, "pgfault": 9120448731,
        "pgmajfault": 48213377, "pgrefill": 690331270, "pgsteal_kswapd": 1041332109, "pgsteal_direct": 160223004,
        "pgscan_kswapd": 1203947210, "pgscan_direct": 183092441, "pgscan_direct_throttle": 0,
        "pginodesteal": 0, "slabs_scanned": 99120332, "kswapd_inodesteal": 1120, "kswapd_low_wmark_hit_quickly": 88213,
        "kswapd_high_wmark_hit_quickly": 1043, "pageoutrun": 4120997, "pgrotated": 1120, "drop_pagecache": 0,
        "drop_slab": 0, "oom_kill": 0, "thp_fault_alloc": 12298, "thp_fault_fallback": 3310,
        "thp_collapse_alloc": 221, "thp_split_page": 12, "unevictable_pgs_culled": 0,
    }
    return "".join(f"{k} {v}\n" for k, v in g.items())


def v1_stat(rss: int, cache: int, shmem: int, mapped: int, rss_huge: int, *, total: bool, extra: dict | None = None) -> str:
    """v1 memory.stat (bytes) with the subtree totals a pod or the root carries."""
    own = {"cache": cache, "rss": rss, "rss_huge": rss_huge, "shmem": shmem, "mapped_file": mapped, "dirty": 0,
           "writeback": 0, "swap": 0, "pgpgin": 0, "pgpgout": 0, "pgfault": 0, "pgmajfault": 0,
           "inactive_anon": rss, "active_anon": 0, "inactive_file": cache, "active_file": 0, "unevictable": 0,
           "hierarchical_memory_limit": 9223372036854771712, "hierarchical_memsw_limit": 9223372036854771712}
    if extra:
        own.update(extra)
    lines = [f"{k} {v}" for k, v in own.items()]
    if total:
        lines += [f"total_{k} {v}" for k, v in own.items() if not k.startswith("hierarchical")]
    return "\n".join(lines) + "\n"


class Builder:
    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.origin: list[str] = []
        self.meta: dict = {"format": "gpuwarden.bundle/v1", "base": "healthy", "captured_at": CAPTURED,
                           "clk_tck": CLK, "node_name": "gpu-node-b",
                           "description": "Incident 4: a pod with a 40 GiB limit on a 62 GiB host renders with EGL; "
                                          "the NVIDIA driver holds ~33 GiB of host pages that no meminfo field and no "
                                          "memory cgroup counts (nvidia_pte_cache: 8,650,926 objects); MemAvailable "
                                          "16 MiB, kswapd thrashing, the node goes NotReady and eviction carries the "
                                          "pod to the next node.",
                           "stat": {}, "readlink": {}, "listdir": {}, "missing": {}}

    def file(self, path: str, text: str, origin: str | None = None) -> None:
        self.files[path] = text
        if origin:
            self.origin.append(f"- `{path}`: {origin}")

    def write(self) -> None:
        if OUT.exists():
            shutil.rmtree(OUT)
        for path, text in self.files.items():
            p = OUT / "files" / path.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        (OUT / "meta.json").write_text(json.dumps(self.meta, indent=1, sort_keys=True) + "\n")
        head = (f"# Origin of the example node `driver-memory-cascade`\n\n{self.meta['description']}\n\n"
                "Generated by `tools/build_memory_example.py` over the `healthy` example (driver, kubelet, device "
                "plugin, the ml/trainer-0 pod and everything else not listed here come from it, so they describe "
                "the base's H200 host, not the incident's T4). Source of the incident: "
                "`shared/incidents/4-driver-kernel-memory-node-cascade.zh.md` (\"为什么我的 GPU 节点都挂了\").\n\n"
                "**verbatim** = copied from the write-up; **transcribed** = the write-up's numbers put in the "
                "kernel's file format; **derived** = computed from verbatim numbers; **illustrative** = not in the "
                "write-up, chosen to be consistent with what it describes; **invented** = names and ids.\n\n")
        (OUT / "ORIGIN.md").write_text(head + "\n".join(self.origin) + "\n")


def build() -> Builder:
    b = Builder()
    b.file("/proc/meminfo", MEMINFO, "**verbatim**: the write-up's `cat /proc/meminfo` during the incident "
           "(5.10.134-16.1.al8 kernel). The ledger leaves 33.8 GiB of its 60.7 GiB in no field; the write-up's "
           "~31 GiB (8,231,127 pages summed from an `nvos_create_alloc` kprobe) comes from a later re-run")
    slab, notes = slabinfo_text()
    b.file("/proc/slabinfo", slab, "**transcribed** from the write-up's `slabtop` table (top 60 caches, so the "
           "caches sum to less than meminfo Slab): OBJS/ACTIVE/SLABS/OBJ/SLAB and names verbatim, including "
           "`nvidia_pte_cache-2782818403` with 8,650,926 objects in 84,813 one-page slabs of 102; objsize in bytes and "
           "pagesperslab **derived** from OBJ SIZE and CACHE SIZE/SLABS. Fixes of the screenshot's slips: "
           + "; ".join(notes + [f"`{k}` read as `{v}`" for k, v in RENAMES.items()]))
    b.file("/proc/zoneinfo", zoneinfo_text(), "**derived**: zones of a 64 GiB x86-64 host whose managed pages sum to "
           "MemTotal and free pages to MemFree; min_free_kbytes 67584 (the kernel's THP-recommended value; THP is "
           "in use: AnonHugePages 24 GiB) spread over the zones by managed pages, low/high from "
           "watermark_scale_factor 10. Normal's free pages sit between low and high: kswapd runs, the min watermark "
           "is not reached, so the OOM killer does not fire (the write-up's explanation)")
    b.file("/proc/vmstat", vmstat_text(), "gauges (nr_*) **derived** from the meminfo; event counters "
           "(pgmajfault, pgscan/pgsteal, workingset_refault_file, allocstall) **illustrative** of the write-up's "
           "kswapd reclaiming and libraries re-read at ~40k read IOPS; oom_kill 0 as the write-up reports")
    b.file("/proc/pressure/memory", "some avg10=91.37 avg60=88.02 avg300=79.55 total=8120339871\n"
           "full avg10=72.18 avg60=69.40 avg300=61.07 total=6021339120\n",
           "**illustrative**: the write-up has no PSI (and the Alinux 5.10 kernel may run with PSI off); values of a "
           "node where every task waits on reclaim, as it describes (one keystroke per ten seconds)")
    b.file("/proc/pressure/io", "some avg10=96.12 avg60=94.80 avg300=90.33 total=9912004588\n"
           "full avg10=85.30 avg60=83.11 avg300=77.90 total=8411023377\n",
           "**illustrative**: read IOPS saturated (~40k) re-reading evicted binaries and libraries")
    b.file("/proc/pressure/cpu", "some avg10=12.40 avg60=10.93 avg300=9.02 total=1203349871\n",
           "**illustrative**; 5.10 prints no `full` line for cpu")

    # the pod: v1 cgroupfs, burstable, 40 GiB limit; its charge holds its anon and a little cache, not the driver pages
    pod_rel = f"kubepods/burstable/pod{POD_UID}"
    anon = 26214400 * KiB  # 25 GiB of the node's 25.8 GiB AnonPages
    huge = kb("AnonHugePages") * KiB
    cache = 8192 * KiB
    kmem = 61865984
    mem = "/sys/fs/cgroup/memory"
    for rel, a, c, k, total in ((f"{pod_rel}/{CID}", anon, cache, kmem - 1048576, True),
                                (f"{pod_rel}/{CID_PAUSE}", 0, 0, 1048576, True)):
        b.file(f"{mem}/{rel}/memory.stat", v1_stat(a, c, 0, 4 * 1024 * KiB if a else 0, huge if a else 0, total=total))
        b.file(f"{mem}/{rel}/memory.usage_in_bytes", f"{a + c + k}\n")
        b.file(f"{mem}/{rel}/memory.kmem.usage_in_bytes", f"{k}\n")
        b.file(f"{mem}/{rel}/memory.limit_in_bytes", f"{40 << 30 if a else 9223372036854771712}\n")
        b.file(f"{mem}/{rel}/cgroup.procs", f"{JAVA_PID if a else PAUSE_PID}\n")
    b.file(f"{mem}/{pod_rel}/memory.stat", v1_stat(anon, cache, 0, 4 * 1024 * KiB, huge, total=True,
                                                   extra={"hierarchical_memory_limit": 40 << 30}),
           "**derived**: the pod (limit 40 GiB, as in the write-up) is charged its Java heap (25 GiB of the node's "
           "AnonPages, 24 GiB of it THP) and a little cache, not the driver's 33 GiB, so its limit never fires; "
           "container, pause, usage_in_bytes and kmem files likewise")
    b.file(f"{mem}/{pod_rel}/memory.usage_in_bytes", f"{anon + cache + kmem}\n")
    b.file(f"{mem}/{pod_rel}/memory.kmem.usage_in_bytes", f"{kmem}\n")
    b.file(f"{mem}/{pod_rel}/memory.limit_in_bytes", f"{40 << 30}\n")
    node_anon, node_cache = kb("AnonPages") * KiB, (kb("Cached") + kb("Buffers")) * KiB
    b.file(f"{mem}/kubepods/memory.stat", v1_stat(0, 0, 0, 0, 0, total=False) +
           "".join(f"total_{k} {v}\n" for k, v in (("cache", cache + 1073741824 // 64), ("rss", anon + 268435456),
                                                  ("rss_huge", huge), ("shmem", 0), ("mapped_file", 4194304))),
           "**derived**: kubepods' subtree: the pod above plus a little for the base's pods")
    b.file(f"{mem}/kubepods/memory.usage_in_bytes", f"{anon + 268435456 + cache + 16777216 + kmem + 12582912}\n")
    b.file(f"{mem}/kubepods/memory.kmem.usage_in_bytes", f"{kmem + 12582912}\n")
    b.file(f"{mem}/memory.stat", v1_stat(0, 0, 0, 0, 0, total=False) +
           "".join(f"total_{k} {v}\n" for k, v in (("cache", node_cache), ("rss", node_anon), ("rss_huge", huge),
                                                  ("shmem", kb("Shmem") * KiB), ("mapped_file", kb("Mapped") * KiB))),
           "**derived**: the root's subtree totals equal meminfo's AnonPages and Cached+Buffers")
    b.file(f"/sys/fs/cgroup/devices/{pod_rel}/{CID}/devices.list", "a *:* rwm\n",
           "**illustrative**: the render container runs with access to every device (EGL needs nvidia0, nvidiactl "
           "and nvidia-modeset); it asks for no nvidia.com/gpu, so kubelet's device checkpoint does not list it")
    b.file(f"/sys/fs/cgroup/devices/{pod_rel}/{CID_PAUSE}/devices.list", "c 1:5 rwm\nc 1:3 rwm\nc 1:9 rwm\n"
           "c 1:8 rwm\nc 5:0 rwm\nc 5:1 rwm\nc *:* m\nb *:* m\nc 1:7 rwm\nc 136:* rwm\nc 5:2 rwm\nc 10:200 rwm\n")
    for ctl in ("devices", "pids"):
        b.file(f"/sys/fs/cgroup/{ctl}/{pod_rel}/{CID}/cgroup.procs", f"{JAVA_PID}\n")
        b.file(f"/sys/fs/cgroup/{ctl}/{pod_rel}/{CID_PAUSE}/cgroup.procs", f"{PAUSE_PID}\n")
    b.file("/sys/fs/cgroup/unified/system.slice/kubelet.service/memory.pressure",
           "some avg10=88.91 avg60=85.02 avg300=80.14 total=2211093442\n"
           "full avg10=86.55 avg60=83.70 avg300=78.33 total=2101993118\n",
           "**illustrative**: kubelet itself stalled on reclaim (it stopped posting node status)")
    b.meta["listdir"]["/var/log/pods"] = [f"{POD_NS}_{POD_NAME}_{POD_UID}"]
    b.meta["listdir"]["/var/log/containers"] = [f"{POD_NAME}_{POD_NS}_{CTR_NAME}-{CID}.log"]

    # processes: the java renderer (pid verbatim from the trace), the pause container, nvidia-persistenced
    def proc(pid: int, argv: list[str], comm: str, start: int, cgroup: str, fds: dict[int, str]) -> None:
        b.file(f"/proc/{pid}/cmdline", "\0".join(argv) + "\0")
        b.file(f"/proc/{pid}/comm", comm + "\n")
        rest = ["S", "1", str(pid), str(pid), "0", "-1", "4194560", "1200", "0", "0", "0", "35", "12", "0", "0",
                "20", "0", "12", "0", str(start), "734003200", "12000"] + ["0"] * 30
        b.file(f"/proc/{pid}/stat", f"{pid} ({comm}) " + " ".join(rest) + "\n")
        b.file(f"/proc/{pid}/cgroup", cgroup)
        for fd, target in fds.items():
            b.meta["readlink"][f"/proc/{pid}/fd/{fd}"] = target

    pod_cg = "".join(f"{i}:{c}:/{pod_rel}/{CID}\n" for i, c in
                     ((12, "devices"), (11, "memory"), (10, "pids"), (4, "cpu,cpuacct"))) + f"1:name=systemd:/{pod_rel}/{CID}\n0::/\n"
    java_fds = {0: "/dev/null", 1: "pipe:[4481231]", 2: "pipe:[4481232]", 3: "/usr/lib/jvm/java-11/lib/modules",
                4: "/app/render.jar", 5: "socket:[4481290]", 6: "/dev/nvidiactl", 7: "/dev/nvidia0",
                8: "/dev/nvidia0", 9: "/dev/nvidia-modeset", 10: "/dev/nvidia0", 11: "/dev/nvidia0",
                12: "anon_inode:[eventfd]", 13: "/dev/nvidia0"}
    proc(JAVA_PID, ["java", "-Xmx26g", "-jar", "/app/render.jar"], "java", (UPTIME - 2400) * CLK, pod_cg, java_fds)
    b.origin.append(f"- `/proc/{JAVA_PID}/*` and its `fd` links (meta.json readlink): pid **verbatim** (`java-{JAVA_PID}` "
                    "in the write-up's nvos_create_alloc trace); command line, start (40 min before capture) and "
                    "descriptors **illustrative** (an EGL client opens nvidiactl, nvidia0 and nvidia-modeset; the "
                    "write-up's funccount shows nvidia_open and nvkms_open)")
    proc(PAUSE_PID, ["/pause"], "pause", (UPTIME - 2410) * CLK,
         f"12:devices:/{pod_rel}/{CID_PAUSE}\n11:memory:/{pod_rel}/{CID_PAUSE}\n", {0: "/dev/null"})
    proc(PERSISTENCED_PID, ["/usr/bin/nvidia-persistenced", "--user", "nvidia-persistenced"], "nvidia-persiste", 310,
         "12:devices:/system.slice/nvidia-persistenced.service\n11:memory:/system.slice/nvidia-persistenced.service\n"
         "1:name=systemd:/system.slice/nvidia-persistenced.service\n0::/system.slice/nvidia-persistenced.service\n",
         {0: "/dev/null", 1: "socket:[19211]", 2: "socket:[19211]", 3: "/dev/nvidiactl", 4: "/dev/nvidia0",
          5: "/dev/nvidia0"})
    b.origin.append(f"- `/proc/{PAUSE_PID}/*`, `/proc/{PERSISTENCED_PID}/*` (nvidia-persistenced, GPU infrastructure "
                    "holding the device open on every GPU node), pod uid, names, container ids, /var/log listings: "
                    "**invented**")
    return b


def main() -> None:
    b = build()
    b.write()
    print("wrote", OUT.relative_to(REPO))


if __name__ == "__main__":
    main()
