"""cgroup `memory.stat`, v2 and v1, brought to one view of what the cgroup is charged for.

v2 (bytes): `anon file kernel kernel_stack pagetables sec_pagetables percpu sock vmalloc
shmem file_mapped … slab_reclaimable slab_unreclaimable slab …`. `kernel` (5.18+) is
every kernel page charged to the cgroup: slab, stacks, page tables, percpu,
vmalloc *and* anything a driver charged with __GFP_ACCOUNT (measured on an H200,
driver 580: unified memory touched on the host is charged here one for one).
`sock` is charged beside `kernel`, not inside it.

v1 (bytes): `cache rss rss_huge shmem mapped_file … unevictable` for the cgroup
itself and `total_*` for its whole subtree (pod cgroups hold their containers
as children, so the `total_*` keys are the pod's). v1 has no kernel breakdown;
kernel memory is the separate `memory.kmem.usage_in_bytes`, which is also
included in `memory.usage_in_bytes`.
"""

from __future__ import annotations

from msgspec import Struct, field

from gpuwarden.parsers import keyvalue

#: v1 `memory.limit_in_bytes` of an unlimited cgroup is PAGE_COUNTER_MAX rounded to pages;
#: anything this big means "no limit"
V1_UNLIMITED = 1 << 62


class MemoryStat(Struct, frozen=True):
    """A memory cgroup's memory.stat."""
    values: dict[str, int] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    @property
    def version(self) -> int | None:
        """2 when the v2 keys are present, 1 for v1 keys, None when neither (garbage)."""
        v = self.values
        if "anon" in v or "file" in v:
            return 2
        if "cache" in v or "rss" in v or "total_cache" in v or "total_rss" in v:
            return 1
        return None

    def get(self, key: str) -> int | None:
        return self.values.get(key)

    def v1(self, key: str) -> int | None:
        """A v1 value for the whole subtree: `total_<key>` when present, else the cgroup's own."""
        t = self.values.get(f"total_{key}")
        return t if t is not None else self.values.get(key)


def parse(text: str) -> MemoryStat:
    """Parse memory.stat text; never raises. A cut final line is dropped, and so is a negative value."""
    return MemoryStat(*keyvalue.parse_numbers(text, negatives=False))


def parse_bytes(text: str | None) -> int | None:
    """A single-number cgroup file (memory.current, memory.usage_in_bytes, memory.min …); 'max' → None."""
    if not isinstance(text, str):
        return None
    t = text.strip()
    if not t or t == "max":
        return None
    try:
        v = int(t.split()[0])
    except ValueError:
        return None
    return v if 0 <= v < V1_UNLIMITED else None


class Charges(Struct, frozen=True):
    """What one cgroup (and its subtree) is charged for, in bytes; None = not reported by this cgroup version."""

    version: int
    anon: int | None = None
    file: int | None = None
    shmem: int | None = None
    file_mapped: int | None = None
    unevictable: int | None = None
    kernel: int | None = None  # every charged kernel page (v2 `kernel`, v1 kmem usage)
    slab: int | None = None
    kernel_stack: int | None = None
    pagetables: int | None = None
    sec_pagetables: int | None = None
    percpu: int | None = None
    vmalloc: int | None = None
    sock: int | None = None

    @property
    def kernel_known(self) -> int | None:
        """Kernel charges that /proc/meminfo also shows (slab, stacks, page tables, percpu, vmalloc); v2 only."""
        parts = (self.slab, self.kernel_stack, self.pagetables)
        if self.version != 2 or any(p is None for p in parts):
            return None
        return sum(p or 0 for p in (*parts, self.sec_pagetables, self.percpu, self.vmalloc))

    @property
    def kernel_other(self) -> int | None:
        """Kernel charges beyond slab/stacks/page tables/percpu/vmalloc: pages that no meminfo field shows
        (driver allocations charged with __GFP_ACCOUNT, pipe buffers …). v2 only; None on v1."""
        known = self.kernel_known
        if self.kernel is None or known is None:
            return None
        return max(0, self.kernel - known)

    @property
    def driver_mapped(self) -> int | None:
        """file_mapped beyond file: pages mapped as if file-backed but not page cache
        (UVM pages touched on the host appear here on driver 580)."""
        if self.file_mapped is None or self.file is None:
            return None
        return max(0, self.file_mapped - self.file)


def charges(stat: MemoryStat, kmem_usage: int | None = None) -> Charges | None:
    """Normalise a parsed memory.stat; None when it is neither v1 nor v2."""
    ver = stat.version
    g = stat.get
    if ver == 2:
        return Charges(2, anon=g("anon"), file=g("file"), shmem=g("shmem"), file_mapped=g("file_mapped"),
                       unevictable=g("unevictable"), kernel=g("kernel"), slab=g("slab") if "slab" in stat.values
                       else _sum(g("slab_reclaimable"), g("slab_unreclaimable")),
                       kernel_stack=g("kernel_stack"), pagetables=g("pagetables"),
                       sec_pagetables=g("sec_pagetables"), percpu=g("percpu"), vmalloc=g("vmalloc"), sock=g("sock"))
    if ver == 1:
        return Charges(1, anon=stat.v1("rss"), file=stat.v1("cache"), shmem=stat.v1("shmem"),
                       file_mapped=stat.v1("mapped_file"), unevictable=stat.v1("unevictable"), kernel=kmem_usage)
    return None


def _sum(*xs: int | None) -> int | None:
    if any(x is None for x in xs):
        return None
    return sum(x or 0 for x in xs)
