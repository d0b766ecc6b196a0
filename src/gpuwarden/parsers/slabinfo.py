"""/proc/slabinfo (format 2.1): one line per kmem cache.

    # name <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab>
      : tunables … : slabdata <active_slabs> <num_slabs> <sharedavail>

A cache's memory is `num_slabs * pagesperslab` pages (what `slabtop` prints as
CACHE SIZE). NVIDIA's kernel modules create caches whose names start with
`nvidia` (`nvidia_stack_cache`, `nvidia_pte_cache`, `nvidia_p2p_page_cache`,
sometimes with a `-<n>` suffix) or `nv_` (`nv_pte_t`, `nv_stack_t` in older
drivers); nvidia-uvm's start with `uvm_`.

`nvidia_pte_cache` matters beyond its own size: in drivers whose
`nvos_create_alloc` allocates one `nvidia_pte_t` per page of a driver
allocation, its active object count is the number of host pages the driver
holds (incident 4: 8,650,926 objects of 40 bytes = 331 MiB of slab, tracking
33 GiB of pages). Drivers that allocate that table with kvzalloc (580.x) have
no such cache; its absence proves nothing.
"""

from __future__ import annotations

import re

from msgspec import Struct

NVIDIA_PREFIXES = ("nvidia", "nv_")
UVM_PREFIXES = ("uvm_",)
#: caches with one object per host page allocated by the driver
_PTE_CACHE = re.compile(r"^(?:nvidia[0-9]*_pte_cache|nv_pte_t)(?:[-_].*)?$")


class SlabCache(Struct, frozen=True):
    """One cache of /proc/slabinfo."""
    name: str
    active_objs: int
    num_objs: int
    objsize: int
    objperslab: int
    pagesperslab: int
    active_slabs: int | None = None
    num_slabs: int | None = None

    def size_bytes(self, page_size: int = 4096) -> int:
        """Memory the cache holds: whole slabs, as slabtop's CACHE SIZE."""
        if self.num_slabs is not None:
            return self.num_slabs * self.pagesperslab * page_size
        if self.objperslab > 0:
            slabs = -(-self.num_objs // self.objperslab)
            return slabs * self.pagesperslab * page_size
        return self.num_objs * self.objsize

    @property
    def nvidia(self) -> bool:
        return is_nvidia(self.name)

    @property
    def tracks_driver_pages(self) -> bool:
        return bool(_PTE_CACHE.match(self.name))


def is_nvidia(name: str) -> bool:
    """A cache created by the NVIDIA kernel modules (nvidia.ko or nvidia-uvm.ko)."""
    return name.startswith(NVIDIA_PREFIXES) or name.startswith(UVM_PREFIXES)


class SlabInfo(Struct, frozen=True):
    """/proc/slabinfo."""
    version: str | None
    caches: tuple[SlabCache, ...] = ()
    problems: tuple[str, ...] = ()

    def nvidia(self) -> list[SlabCache]:
        return [c for c in self.caches if c.nvidia]

    def nvidia_bytes(self, page_size: int = 4096) -> int:
        return sum(c.size_bytes(page_size) for c in self.nvidia())

    def driver_page_trackers(self) -> list[SlabCache]:
        return [c for c in self.caches if c.tracks_driver_pages]

    def tracked_driver_pages(self) -> int:
        """Host pages the driver holds, counted by its per-page slab objects (0 when no such cache)."""
        return sum(c.active_objs for c in self.driver_page_trackers())

    def total_bytes(self, page_size: int = 4096) -> int:
        return sum(c.size_bytes(page_size) for c in self.caches)

    def by_name(self, name: str) -> SlabCache | None:
        for c in self.caches:
            if c.name == name:
                return c
        return None


def _ints(fields: list[str]) -> list[int] | None:
    try:
        return [int(x) for x in fields]
    except ValueError:
        return None


def parse(text: str) -> SlabInfo:
    """Parse slabinfo text; never raises. Bad or cut lines go to `problems`."""
    if not isinstance(text, str):
        return SlabInfo(None, (), ("not text",))
    version = None
    caches: list[SlabCache] = []
    problems: list[str] = []
    lines = text.splitlines()
    truncated = bool(text) and not text.endswith("\n")
    for i, raw in enumerate(lines):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("slabinfo - version:"):
            version = line.split(":", 1)[1].strip()
            continue
        if line.startswith("#"):
            continue
        if truncated and i == len(lines) - 1:
            problems.append(f"line {i + 1}: cut short; dropped")
            continue
        head, _, rest = line.partition(":")
        fields = head.split()
        if len(fields) < 6:
            problems.append(f"line {i + 1}: unparsable {line[:60]!r}")
            continue
        name = fields[0]
        nums = _ints(fields[1:6])
        if nums is None or any(n < 0 for n in nums):
            problems.append(f"line {i + 1}: bad numbers for {name}")
            continue
        active_slabs = num_slabs = None
        if "slabdata" in rest:
            sd = _ints(rest.split("slabdata", 1)[1].split()[:2])
            if sd and len(sd) == 2:
                active_slabs, num_slabs = sd
        caches.append(SlabCache(name, *nums, active_slabs=active_slabs, num_slabs=num_slabs))
    if version is not None and not version.startswith("2."):
        problems.append(f"slabinfo version {version}: parsed as 2.x")
    return SlabInfo(version, tuple(caches), tuple(problems))
