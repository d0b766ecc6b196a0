"""/proc/vmstat: `name value` counters, and the reclaim/thrash sums built from them.

Counter names moved between kernels, and naive sums double count:
- 4.8+ split `pgsteal_kswapd_<zone>` into `pgsteal_kswapd`/`pgsteal_direct`
  (+ `_khugepaged` 5.19, `_proactive` 6.x), and 5.x adds `pgsteal_anon`/`pgsteal_file`,
  the *same* pages counted by type. Likewise for `pgscan_*`.
- `workingset_refault` became `workingset_refault_anon` + `_file` (5.9).
- `allocstall` became per-zone `allocstall_<zone>` (4.10).
Most values are cumulative since boot: one sample proves only that something
has happened once; `rates()` turns two samples into per-second rates.
"""

from __future__ import annotations

from msgspec import Struct, field

from gpuwarden.parsers import keyvalue

_RECLAIMERS = ("kswapd", "direct", "khugepaged", "proactive")


class VmStat(Struct, frozen=True):
    """/proc/vmstat's counters."""
    counters: dict[str, int] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def get(self, key: str) -> int | None:
        return self.counters.get(key)

    def _by_reclaimer(self, prefix: str, who: tuple[str, ...]) -> int | None:
        c = self.counters
        named = [c[f"{prefix}_{w}"] for w in who if f"{prefix}_{w}" in c]
        if named:
            return sum(named)
        # 4.x and older: per zone, e.g. pgsteal_kswapd_normal
        zoned = [v for k, v in c.items()
                 if any(k.startswith(f"{prefix}_{w}_") for w in who) and not k.endswith("_throttle")]
        if zoned:
            return sum(zoned)
        return None

    def pgscan_kswapd(self) -> int | None:
        return self._by_reclaimer("pgscan", ("kswapd",))

    def pgscan_direct(self) -> int | None:
        return self._by_reclaimer("pgscan", ("direct",))

    def pgsteal(self) -> int | None:
        """Pages reclaimed by every reclaimer (not double counted by type)."""
        v = self._by_reclaimer("pgsteal", _RECLAIMERS)
        if v is None and ("pgsteal_anon" in self.counters or "pgsteal_file" in self.counters):
            v = self.counters.get("pgsteal_anon", 0) + self.counters.get("pgsteal_file", 0)
        return v

    def refaults(self) -> int | None:
        """Evicted pages read back soon after (thrashing), anon + file."""
        c = self.counters
        if "workingset_refault_anon" in c or "workingset_refault_file" in c:
            return c.get("workingset_refault_anon", 0) + c.get("workingset_refault_file", 0)
        return c.get("workingset_refault")

    def allocstalls(self) -> int | None:
        """Allocations that entered direct reclaim."""
        c = self.counters
        zoned = [v for k, v in c.items() if k.startswith("allocstall_")]
        if zoned:
            return sum(zoned)
        return c.get("allocstall")

    def pgmajfault(self) -> int | None:
        return self.counters.get("pgmajfault")


def parse(text: str) -> VmStat:
    """Parse vmstat text; never raises. A cut final line is dropped."""
    return VmStat(*keyvalue.parse_numbers(text))


class VmRates(Struct, frozen=True):
    """Per-second rates between two vmstat samples; None where a counter is missing or went backwards."""

    dt: float
    pgmajfault: float | None
    pgscan_kswapd: float | None
    pgscan_direct: float | None
    pgsteal: float | None
    refaults: float | None
    allocstalls: float | None


def _rate(a: int | None, b: int | None, dt: float) -> float | None:
    if a is None or b is None or dt <= 0 or b < a:
        return None
    return (b - a) / dt


def rates(before: VmStat, after: VmStat, dt: float) -> VmRates:
    """Rates of the thrash counters between two samples taken `dt` seconds apart."""
    return VmRates(
        dt,
        _rate(before.pgmajfault(), after.pgmajfault(), dt),
        _rate(before.pgscan_kswapd(), after.pgscan_kswapd(), dt),
        _rate(before.pgscan_direct(), after.pgscan_direct(), dt),
        _rate(before.pgsteal(), after.pgsteal(), dt),
        _rate(before.refaults(), after.refaults(), dt),
        _rate(before.allocstalls(), after.allocstalls(), dt),
    )
