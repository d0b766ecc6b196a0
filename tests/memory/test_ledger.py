"""The ledger's arithmetic: a hand-computed case, the incident's numbers, the H200 measurement."""

from __future__ import annotations

import pytest

from gpuwarden.memory import attribution as A
from gpuwarden.memory import ledger as L
from gpuwarden.examples import HERE as EXAMPLES
from gpuwarden.parsers import memory_stat, meminfo, pressure, slabinfo, vmstat, zoneinfo
from tests.support.bundles import DEVBOX, H200, text

KB = 1024
INCIDENT = EXAMPLES / "driver-memory-cascade" / "files" / "proc"

HAND = """\
MemTotal:        1000000 kB
MemFree:          100000 kB
MemAvailable:     300000 kB
Buffers:           10000 kB
Cached:           200000 kB
SwapCached:            0 kB
Active:           300000 kB
Inactive:         210000 kB
Unevictable:           0 kB
AnonPages:        300000 kB
Mapped:            40000 kB
Shmem:             50000 kB
KReclaimable:      60000 kB
Slab:              80000 kB
SReclaimable:      50000 kB
SUnreclaim:        30000 kB
KernelStack:        5000 kB
PageTables:         7000 kB
SecPageTables:      1000 kB
VmallocUsed:       20000 kB
Percpu:             2000 kB
AnonHugePages:    100000 kB
Zswap:              3000 kB
HugePages_Total:      10
Hugepagesize:       2048 kB
Hugetlb:           20480 kB
"""
HAND_SLAB = """\
slabinfo - version: 2.1
nvidia_pte_cache    1000   1020     40  102    1 : tunables    0    0    0 : slabdata     10     10      0
nv_stack_t             2      2  12288    2    8 : tunables    0    0    0 : slabdata      1      1      0
kmalloc-64           640    640     64   64    1 : tunables    0    0    0 : slabdata     10     10      0
"""


def _sum_is_total(n: L.NodeLedger) -> None:
    assert sum(x.bytes for x in n.lines) + n.unexplained == n.total
    keys = [x.key for x in n.lines]
    assert len(keys) == len(set(keys))


def test_hand_computed_ledger():
    n = L.node_ledger(meminfo.parse(HAND), slabinfo.parse(HAND_SLAB))
    got = {x.key: x.bytes // KB for x in n.lines}
    assert got == {
        "free": 100000, "page_cache": 200000, "buffers": 10000, "anon": 300000,  # Shmem and THP inside, not added
        "slab_reclaimable": 50000, "slab_unreclaimable": 30000 - 72, "slab_nvidia": 72,  # 10 one-page + 1 8-page slab
        "kreclaimable_other": 10000, "kernel_stack": 5000, "page_tables": 7000, "sec_page_tables": 1000,
        "vmalloc": 20000 - 5000, "percpu": 2000, "hugetlb": 20480, "zswap": 3000,
    }
    assert n.unexplained // KB == 1000000 - 753480 == 246520
    assert n.tracked_driver_pages == 1000 and n.tracked_driver_bytes == 1000 * 4096
    assert n.line("shmem").part_of == "page_cache" and n.line("anon_huge").part_of == "anon"
    assert n.line("driver_pages_tracked").part_of == "unexplained"
    assert n.reliable and n.missing == []
    _sum_is_total(n)


def test_hugetlb_from_pool_when_no_hugetlb_field():
    n = L.node_ledger(meminfo.parse(HAND.replace("Hugetlb:           20480 kB\n", "")))
    assert n.line("hugetlb").bytes == 10 * 2048 * KB and n.line("hugetlb").source.endswith("Hugepagesize")


def test_without_slabinfo_nothing_is_broken_out():
    n = L.node_ledger(meminfo.parse(HAND))
    assert n.line("slab_nvidia") is None and n.line("slab_unreclaimable").bytes == 30000 * KB
    assert n.tracked_driver_pages is None
    _sum_is_total(n)


def test_incident_ledger():
    mi = meminfo.parse(text(INCIDENT / "meminfo"))
    n = L.node_ledger(mi, slabinfo.parse(text(INCIDENT / "slabinfo")))
    assert n.reliable and n.page_size == 4096
    assert n.unexplained == 35413640 * KB  # 33.8 GiB of 60.7 GiB in no field
    assert n.unexplained_ratio == pytest.approx(0.557, abs=0.001)
    assert n.line("slab_nvidia").bytes == 339252 * KB
    assert n.line("slab_unreclaimable").bytes == (468932 - 339252) * KB
    assert n.line("vmalloc") is None and n.line("kreclaimable_other") is None  # VmallocUsed 0, no KReclaimable
    assert n.tracked_driver_bytes == 8650926 * 4096
    assert n.tracked_driver_bytes / n.unexplained == pytest.approx(0.977, abs=0.002)
    _sum_is_total(n)


def test_devbox_ledger_is_small():
    n = L.node_ledger(meminfo.parse(text(DEVBOX / "meminfo")), slabinfo.parse(text(DEVBOX / "slabinfo")))
    assert n.reliable and 0 <= n.unexplained_ratio < 0.02
    _sum_is_total(n)


def test_h200_managed_memory_grows_the_remainder_one_for_one():
    def node(moment: str) -> L.NodeLedger:
        return L.node_ledger(meminfo.parse(text(H200 / f"meminfo.{moment}")))
    before, managed, pinned, freed = node("before"), node("managed"), node("pinned"), node("freed")
    assert before.unexplained < 256 << 20
    assert managed.unexplained - before.unexplained == pytest.approx(4 << 30, rel=0.03)
    assert managed.line("mapped_not_cached") is not None  # Mapped > Cached: driver pages mapped like file pages
    # pinned memory lands in Cached/Shmem: explained, the remainder does not move
    assert abs(pinned.unexplained - managed.unexplained) < 64 << 20
    assert pinned.line("page_cache").bytes - managed.line("page_cache").bytes == pytest.approx(2 << 30, rel=0.02)
    assert freed.unexplained < 512 << 20


@pytest.mark.parametrize("cut", ["MemTotal: 63596320 kB\nMemFree: 433348 kB\nMemAvailable: 16240 kB\n",
                                 "", "garbage\n", "MemTotal: 0 kB\n"])
def test_unreliable_ledger_says_why(cut):
    n = L.node_ledger(meminfo.parse(cut))
    assert not n.reliable and n.reason


def test_truncated_meminfo_is_unreliable():
    full = text(INCIDENT / "meminfo")
    n = L.node_ledger(meminfo.parse(full[: full.index("Hugetlb") + len("Hugetlb: 0 k")]))
    assert not n.reliable and "cut short" in n.reason
    # cut at a line boundary before the HugeTLB lines: indistinguishable from a kernel without them, so noted
    n = L.node_ledger(meminfo.parse(full[: full.index("HugePages_Total")]))
    assert n.reliable and "Hugetlb" in n.missing and any("HugeTLB" in x for x in n.notes)


# ------------------------------------------------------------------ cgroups

def _cg(path: str, stat_text: str, kmem: int | None = None, **kw) -> L.CgroupMemory:
    return L.CgroupMemory(path, memory_stat.charges(memory_stat.parse(stat_text), kmem), source=f"{path}/memory.stat",
                          **kw)


def test_split_v2_root_wins_and_is_exact():
    node = L.node_ledger(meminfo.parse(text(H200 / "meminfo.managed")))
    root = _cg("/sys/fs/cgroup", text(H200 / "root-memory.stat.managed"))
    pod = L.PodMemory("u", "p", "ns", _cg("/sys/fs/cgroup/kubepods.slice/x", text(H200 / "memory.stat.managed")))
    s = L.cgroup_split(node, [pod], None, root)
    assert s.exact and s.charged_outside_meminfo == root.kernel_other
    assert root.kernel_other == pytest.approx(4 << 30, rel=0.01)
    assert s.uncharged_unexplained == node.unexplained - root.kernel_other < 512 << 20
    assert s.pods_kernel_other()[0][0] is pod


def test_split_falls_back_to_pods_then_nothing():
    node = L.node_ledger(meminfo.parse(text(H200 / "meminfo.managed")))
    pod = L.PodMemory("u", "p", "ns", _cg("/x", text(H200 / "memory.stat.managed")))
    s = L.cgroup_split(node, [pod])
    assert s.charged_outside_source.startswith("pods") and s.exact
    none = L.cgroup_split(node, [], reason="containers section unavailable")
    assert not none.available and none.uncharged_unexplained is None and "unavailable" in none.reason


def test_split_v1_subtracts_whole_kmem_as_upper_bound():
    mi = meminfo.parse(text(INCIDENT / "meminfo"))
    node = L.node_ledger(mi, slabinfo.parse(text(INCIDENT / "slabinfo")))
    pod_dir = next((EXAMPLES / "driver-memory-cascade/files/sys/fs/cgroup/memory/kubepods/burstable").iterdir())
    kube = _cg("/k", text(EXAMPLES / "driver-memory-cascade/files/sys/fs/cgroup/memory/kubepods/memory.stat"),
               kmem=74448896)
    pod = L.PodMemory("u", "p", "ns", _cg(str(pod_dir), (pod_dir / "memory.stat").read_text(), kmem=61865984,
                                          limit=40 << 30))
    s = L.cgroup_split(node, [pod], kube)
    assert not s.exact and s.charged_outside_meminfo == 74448896
    assert s.uncharged_unexplained == node.unexplained - 74448896
    assert pod.cgroup.charges.anon == 25 << 30 and pod.cgroup.kernel_other is None


# ------------------------------------------------------------------ thrash

def test_incident_thrash_without_psi():
    mi = meminfo.parse(text(INCIDENT / "meminfo"))
    t = L.thrash_precursors(mi, zoneinfo.parse(text(INCIDENT / "zoneinfo")),
                            vmstat=vmstat.parse(text(INCIDENT / "vmstat")))
    keys = {s.key: s.strong for s in t.signals}
    assert keys == {"mem-available-low": True, "near-min-watermark": True, "reclaim-history": False}
    assert t.present and t.available_to_min == pytest.approx(16240 / 67584, abs=0.01)


def test_devbox_no_thrash():
    mi = meminfo.parse(text(DEVBOX / "meminfo"))
    t = L.thrash_precursors(mi, zoneinfo.parse(text(DEVBOX / "zoneinfo")),
                            pressure.parse(text(DEVBOX / "pressure_memory")),
                            pressure.parse(text(DEVBOX / "pressure_io")),
                            vmstat.parse(text(DEVBOX / "vmstat")))
    assert not t.present and not [s for s in t.signals if s.strong]


def test_psi_kubelet_and_rate_signals():
    mi = meminfo.parse(HAND)
    hot = pressure.parse("some avg10=50.00 avg60=40.00 avg300=30.00 total=1\n"
                         "full avg10=12.00 avg60=1.00 avg300=1.00 total=1\n")
    calm = pressure.parse("some avg10=1.00 avg60=1.00 avg300=1.00 total=1\n"
                          "full avg10=0.50 avg60=4.99 avg300=1.00 total=1\n")
    assert [s.key for s in L.thrash_precursors(mi, psi_memory=hot).signals] == ["psi-memory-full"]
    assert L.thrash_precursors(mi, psi_memory=calm).signals == []
    t = L.thrash_precursors(mi, kubelet_pressure=hot)
    assert t.present and t.signals[0].key == "psi-kubelet-full"
    a = vmstat.parse("pgmajfault 1000\npgscan_kswapd 0\n")
    b = vmstat.parse("pgmajfault 31000\npgscan_kswapd 500\n")
    r = L.thrash_rates(a, b, 10.0)
    assert r.pgmajfault == 3000.0
    t = L.thrash_precursors(mi, vm_rates=r)
    assert {s.key: s.strong for s in t.signals} == {"majfault-rate": True, "kswapd-scanning": False}
    strict = L.ThrashThresholds(majfault_per_s=5000.0)
    assert not L.thrash_precursors(mi, vm_rates=r, thresholds=strict).present


# ------------------------------------------------------------------ attribution

def _h(pid: int, name: str, devs: tuple[str, ...] = ("/dev/nvidiactl", "/dev/nvidia0"), uid: str | None = None):
    return A.DeviceHolder(pid, name, devs, "", uid)


def test_attribution_levels():
    infra = [_h(1089, "nvidia-persistenced"), _h(2301, "nvidia-device-p", uid="plugin")]
    one = A.attribute(infra + [_h(500, "java", uid="a")], gap=33 << 30)
    assert one.confidence == "high" and one.suspects[0].uid == "a" and len(one.infrastructure) == 2
    assert "nvidia-persistenced" in one.explanation
    assert A.attribute([_h(500, "java", uid="a")], gap=1 << 30).confidence == "medium"  # gap not large
    two = A.attribute([_h(500, "java", ("/dev/nvidiactl",), "a"), _h(600, "python", uid="b")], gap=33 << 30)
    assert two.confidence == "medium" and two.suspects[0].uid == "b"  # GPU holder ranked before ctl-only
    many = A.attribute([_h(i, "w", uid=str(i)) for i in range(5)], gap=33 << 30)
    assert many.confidence == "low"
    assert A.attribute(infra, gap=33 << 30).confidence == "none"
    assert A.attribute([], gap=33 << 30, scan_complete=False).confidence == "low"
    cut = A.attribute([_h(500, "java", uid="a")], gap=33 << 30, scan_complete=False)
    assert cut.confidence == "medium" and "stopped early" in cut.explanation
    host = A.attribute([_h(77, "Xorg")], gap=33 << 30)
    assert host.suspects[0].kind == "process" and host.suspects[0].ref == "Xorg (pid 77)"


def test_attribution_names_pods_charged_kernel_memory():
    pod = L.PodMemory("u", "uvm-train-0", "ml", _cg("/p", text(H200 / "memory.stat.managed")))
    small = L.PodMemory("v", "small", "ml", _cg("/q", text(H200 / "memory.stat.before")))
    a = A.attribute([_h(4242, "python3", uid="u")], [pod, small], gap=0)
    assert [s.uid for s in a.charged] == ["u"] and a.charged[0].kernel_other == pytest.approx(4 << 30, rel=0.01)
    assert a.charged[0].pids == [4242]
    assert A.attribute([], [pod], gap=0, charged_threshold=8 << 30).charged == []


def test_human():
    assert (L.human(35413640 * KB), L.human(16240 * KB), L.human(512), L.human(None)) == \
        ("33.8 GiB", "15.9 MiB", "512 B", "unknown")
