"""The memory parsers on real text (dev machine, H200 GPU host, incident 4) and on garbage."""

from __future__ import annotations

import pytest

from gpuwarden.examples import HERE as EXAMPLES
from gpuwarden.parsers import memory_stat, meminfo, pressure, slabinfo, vmstat, zoneinfo

from tests.support.bundles import DEVBOX, H200, text

INCIDENT = EXAMPLES / "driver-memory-cascade" / "files" / "proc"
GARBAGE = ["", "\0\0\xff", "hello world\n", "::::\n", "MemTotal\n", "a b c d e f g h\n" * 3, "😀 12 kB\n",
           "MemTotal: -5 kB\n", "MemTotal: 12 parsecs\n"]


# ---------------------------------------------------------------- meminfo

def test_meminfo_devbox_in_bytes():
    m = meminfo.parse(text(DEVBOX / "meminfo"))
    assert not m.problems and not m.truncated
    assert m.get("MemTotal") == m.kb("MemTotal") * 1024 > 16 << 30
    assert m.get("HugePages_Total") == 0  # unitless count kept as a count
    assert m.get("Active(anon)") is not None  # keys with parentheses
    assert "SecPageTables" in m and "Hugetlb" in m


def test_meminfo_incident_verbatim():
    m = meminfo.parse(text(INCIDENT / "meminfo"))
    assert m.kb("MemTotal") == 63596320 and m.kb("MemAvailable") == 16240
    assert m.get("AnonPages") == 27100712 * 1024
    assert "KReclaimable" not in m and "SecPageTables" not in m  # 5.10: absent, not zero
    assert m.quote("MemFree", "Nope", "HugePages_Total") == "MemFree 433348 kB; HugePages_Total 0"


@pytest.mark.parametrize("garbage", GARBAGE)
def test_meminfo_garbage_never_raises(garbage):
    m = meminfo.parse(garbage)
    assert "MemTotal" not in m or m.get("MemTotal", 0) >= 0


def test_meminfo_cut_in_a_number_drops_the_partial_line():
    full = text(DEVBOX / "meminfo")
    cut = full[: full.index("MemAvailable:") + len("MemAvailable:    123")]
    m = meminfo.parse(cut)
    assert m.truncated and "MemAvailable" not in m and "MemFree" in m
    assert any("cut short" in p for p in m.problems)


def test_meminfo_renamed_and_repeated_fields():
    m = meminfo.parse("MemTotal: 100 kB\nMemTotal: 200 kB\nSlab_Renamed: 5 kB\nHugePages_Total:   3\nFoo: 7\n")
    assert m.kb("MemTotal") == 100 and m.get("Slab_Renamed") == 5 * 1024
    assert m.get("Foo") == 7 * 1024  # unitless sized field read as kB, and said so
    assert any("repeated" in p for p in m.problems) and any("no unit" in p for p in m.problems)


def test_meminfo_not_text():
    assert meminfo.parse(None).problems == ("not text",)  # type: ignore[arg-type]


# ---------------------------------------------------------------- slabinfo

def test_slabinfo_devbox():
    s = slabinfo.parse(text(DEVBOX / "slabinfo"))
    assert s.version == "2.1" and not s.problems and len(s.caches) > 100
    kmalloc = s.by_name("kmalloc-64")
    assert kmalloc is not None and kmalloc.num_slabs is not None
    assert kmalloc.size_bytes() == kmalloc.num_slabs * kmalloc.pagesperslab * 4096
    assert s.nvidia() == [] and s.tracked_driver_pages() == 0


def test_slabinfo_h200_driver_580_has_no_pte_cache():
    s = slabinfo.parse(text(H200 / "slabinfo.managed"))
    names = {c.name for c in s.nvidia()}
    assert "nvidia_stack_cache" in names and any(n.startswith("uvm_") for n in names)
    assert s.driver_page_trackers() == []  # 580.x: page table by kvzalloc, no per-page slab


def test_slabinfo_incident_pte_cache():
    s = slabinfo.parse(text(INCIDENT / "slabinfo"))
    pte = s.by_name("nvidia_pte_cache-2782818403")
    assert pte is not None and pte.active_objs == 8650926 and pte.objperslab == 102
    assert pte.size_bytes() == 339252 * 1024  # slabtop's CACHE SIZE
    assert s.tracked_driver_pages() == 8650926
    assert [c.name for c in s.driver_page_trackers()] == ["nvidia_pte_cache-2782818403"]


@pytest.mark.parametrize("name,nv,pte", [("nvidia_pte_cache", True, True), ("nvidia0_pte_cache-17", True, True),
                                         ("nv_pte_t", True, True), ("nv_stack_t", True, False),
                                         ("nvidia_stack_cache", True, False), ("uvm_va_block_t", True, False),
                                         ("nvme_ns", False, False), ("kmalloc-64", False, False)])
def test_slabinfo_nvidia_names(name, nv, pte):
    c = slabinfo.SlabCache(name, 1, 1, 40, 102, 1, 1, 1)
    assert c.nvidia is nv and c.tracks_driver_pages is pte


def test_slabinfo_truncated_and_garbage():
    full = text(DEVBOX / "slabinfo")
    cut = slabinfo.parse(full[: len(full) // 2])
    assert len(cut.caches) > 10 and any("cut short" in p for p in cut.problems)
    for g in GARBAGE + ["x 1 2 3 4 5 : slabdata a b c\n", "y -1 2 3 4 5\n"]:
        slabinfo.parse(g)
    s = slabinfo.parse("z 4 8 64 64 1\n")  # no slabdata: size from objects
    assert s.caches[0].size_bytes() == 4096


# ---------------------------------------------------------------- pressure

def test_pressure_devbox_and_h200():
    for p in (DEVBOX / "pressure_memory", H200 / "pressure_memory.managed", DEVBOX / "pressure_io"):
        ps = pressure.parse(text(p))
        assert ps.some is not None and ps.full is not None and not ps.problems
        assert ps.full.total_us is not None


def test_pressure_values_and_cpu_without_full():
    ps = pressure.parse("some avg10=12.40 avg60=10.93 avg300=9.02 total=1203349871\n")
    assert ps.full is None and ps.some.avg60 == pytest.approx(10.93)
    assert "avg10=12.40" in ps.quote()


@pytest.mark.parametrize("g", GARBAGE + ["full avg10=NaN avg60=1 avg300=1\n", "some avg10=1.0\n",
                                         "full avg10=1.0 avg60=2.0 avg300=-3 total=4\n", "some avg10=3.2 avg6"])
def test_pressure_garbage(g):
    ps = pressure.parse(g)
    assert ps.full is None or ps.full.avg10 >= 0


# ---------------------------------------------------------------- vmstat

def test_vmstat_devbox_sums():
    v = vmstat.parse(text(DEVBOX / "vmstat"))
    assert not v.problems and v.get("nr_free_pages") is not None
    c = v.counters
    # pgsteal_anon/file count the same pages as pgsteal_kswapd/direct/...: not added twice
    assert v.pgsteal() == sum(c[k] for k in ("pgsteal_kswapd", "pgsteal_direct", "pgsteal_khugepaged",
                                             "pgsteal_proactive") if k in c)
    assert v.refaults() == c["workingset_refault_anon"] + c["workingset_refault_file"]
    assert v.allocstalls() == sum(val for k, val in c.items() if k.startswith("allocstall_"))


def test_vmstat_old_kernel_names():
    v = vmstat.parse("pgsteal_kswapd_normal 5\npgsteal_direct_dma32 2\npgscan_kswapd_normal 9\n"
                     "pgscan_direct_throttle 100\nworkingset_refault 7\nallocstall 3\n")
    assert (v.pgsteal(), v.pgscan_kswapd(), v.pgscan_direct(), v.refaults(), v.allocstalls()) == (7, 9, None, 7, 3)


def test_vmstat_rates_from_two_real_samples():
    a, b = vmstat.parse(text(H200 / "vmstat.before")), vmstat.parse(text(H200 / "vmstat.managed"))
    r = vmstat.rates(a, b, 3.18)
    assert r.pgmajfault is not None and r.pgmajfault >= 0
    assert vmstat.rates(b, a, 3.18).pgmajfault is None or b.pgmajfault() == a.pgmajfault()  # backwards → None
    assert vmstat.rates(a, b, 0).pgmajfault is None


@pytest.mark.parametrize("g", GARBAGE + ["pgmajfault x\n", "pgmajfault 1 2\n", "pgmajfault 12"])
def test_vmstat_garbage(g):
    assert vmstat.parse(g).get("pgmajfault") is None  # bad, doubled, or cut short ("12" may be "12345")


# ---------------------------------------------------------------- memory.stat

def test_memory_stat_v1_root_devbox():
    st = memory_stat.parse(text(DEVBOX / "memory.stat.v1-root"))
    assert st.version == 1 and not st.problems
    ch = memory_stat.charges(st, kmem_usage=123)
    assert ch.anon == st.get("total_rss") and ch.file == st.get("total_cache") and ch.kernel == 123
    assert ch.kernel_other is None  # v1 cannot split kernel memory


def test_memory_stat_v2_h200_managed_memory_is_kernel_other():
    before = memory_stat.charges(memory_stat.parse(text(H200 / "memory.stat.before")))
    after = memory_stat.charges(memory_stat.parse(text(H200 / "memory.stat.managed")))
    assert before.version == after.version == 2
    assert before.kernel_other < 1 << 20
    assert after.kernel_other - before.kernel_other == pytest.approx(4 << 30, rel=0.01)
    assert after.driver_mapped == pytest.approx(4 << 30, rel=0.01)  # file_mapped beyond file
    pinned = memory_stat.charges(memory_stat.parse(text(H200 / "memory.stat.pinned")))
    assert pinned.shmem - after.shmem == pytest.approx(2 << 30, rel=0.01)


def test_memory_stat_single_numbers():
    assert memory_stat.parse_bytes("max\n") is None
    assert memory_stat.parse_bytes("9223372036854771712\n") is None  # v1 unlimited
    assert memory_stat.parse_bytes("42949672960\n") == 40 << 30
    assert memory_stat.parse_bytes("garbage") is None and memory_stat.parse_bytes(None) is None


@pytest.mark.parametrize("g", GARBAGE + ["anon x\n", "anon -1\n", "anon 5 6\n", "file 1\nanon 12"])
def test_memory_stat_garbage(g):
    st = memory_stat.parse(g)
    assert st.get("anon") is None
    assert memory_stat.charges(st) is None or st.version is not None


# ---------------------------------------------------------------- zoneinfo

def test_zoneinfo_devbox_watermarks_skip_empty_zones():
    z = zoneinfo.parse(text(DEVBOX / "zoneinfo"))
    assert not z.problems and [x.name for x in z.zones][:3] == ["DMA", "DMA32", "Normal"]
    movable = next(x for x in z.zones if x.name == "Movable")
    assert movable.managed == 0 and movable.min == 32
    assert z.min_pages == sum(x.min for x in z.zones if x.managed)  # the empty zone's token 32 is not summed
    assert z.low_pages > z.min_pages and z.high_pages > z.low_pages


def test_zoneinfo_pageset_high_is_not_a_watermark():
    z = zoneinfo.parse(text(H200 / "zoneinfo.managed"))
    normal = next(x for x in z.zones if x.name == "Normal")
    assert normal.high is not None and normal.high > normal.low > normal.min > 0


def test_zoneinfo_incident_derived():
    z = zoneinfo.parse(text(INCIDENT / "zoneinfo"))
    assert z.min_pages == 67584 // 4 - 1 or z.min_pages == 67584 // 4  # min_free_kbytes split by managed pages
    assert z.free_pages == 433348 // 4 and z.managed_pages == 63596320 // 4


@pytest.mark.parametrize("g", GARBAGE + ["Node 0, zone Normal\n  pages free abc\n        min x\n"])
def test_zoneinfo_garbage(g):
    z = zoneinfo.parse(g)
    assert z.min_pages is None


def test_zoneinfo_truncated():
    full = text(DEVBOX / "zoneinfo")
    z = zoneinfo.parse(full[: full.index("managed", full.index("DMA32"))])
    assert any(x.name == "DMA32" for x in z.zones)
