"""The uncharged-memory history a long-running caller (the agent) keeps across checks.

One-shot `check` sees one instant: how much host memory no cgroup is charged for, and who may hold
it. Only successive samples show *how fast* it grows, *when* MemAvailable will reach the kernel's min
watermark at that rate, and which workload was present whenever it grew (or gave memory back when it
left). `MemoryHistory` holds those samples; `trend()` is a pure function of them.
"""

from __future__ import annotations

import collections
from typing import Callable, Deque

from msgspec import Struct, field
from msgspec.structs import asdict, replace

from gpuwarden.memory.tracking import ProcSignals, Tracking, tracking

MiB = 1 << 20
GiB = 1 << 30
#: where the agent keeps its samples on the node, so that a one-shot `check` there sees what it saw
SAMPLES_FILE = "/run/gpuwarden/memory-samples.json"
#: samples older than this (against the check's time) are not the same episode any more
SAMPLES_MAX_AGE_S = 900.0
#: fine samples kept for the per-process tracking
FINE_LEN = 600
#: the span of the recent rate (whether a growth still goes on)
RECENT_S = 10.0


class MemSample(Struct, frozen=True):
    """One sample of the node's memory, kept between agent checks."""
    t: float  # seconds (monotonic or epoch: only differences are used)
    gap: int  # bytes of host memory in no meminfo field and charged to no cgroup
    available: int | None = None  # MemAvailable
    min_watermark: int | None = None  # sum of the zones' min watermarks
    #: candidate holders present at this sample: key (pod uid, or "pid:N") -> display reference
    candidates: dict[str, str] = field(default_factory=dict)
    #: candidate key -> its processes at this sample: a new pid in a pod is a new arrival
    pids: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: GPUs whose memory was full at this sample (None: unknown)
    full_gpus: tuple[str, ...] | None = None
    #: candidate key -> its per-process signals (kernel time, faults, device mappings, NVML memory): memory/tracking
    signals: dict[str, ProcSignals] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"t": self.t, "gap": self.gap, "available": self.available, "min_watermark": self.min_watermark,
                "candidates": self.candidates, "pids": {k: list(v) for k, v in self.pids.items()},
                "full_gpus": None if self.full_gpus is None else list(self.full_gpus),
                "signals": {k: v.to_json() for k, v in self.signals.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "MemSample":
        """A recorded sample; raises ValueError/TypeError/KeyError on anything malformed."""
        pids = {str(k): tuple(int(p) for p in v) for k, v in (d.get("pids") or {}).items()}
        full = d.get("full_gpus")
        av, mw = d.get("available"), d.get("min_watermark")
        return cls(float(d["t"]), int(d["gap"]), None if av is None else int(av), None if mw is None else int(mw),
                   {str(k): str(v) for k, v in (d.get("candidates") or {}).items()}, pids,
                   None if full is None else tuple(str(g) for g in full),
                   {str(k): ProcSignals.from_json(v) for k, v in (d.get("signals") or {}).items()})


class Freed(Struct, frozen=True):
    """Memory that came back when a candidate left: strong evidence it was the holder."""

    key: str
    ref: str
    bytes: int
    t: float


class Presence(Struct, frozen=True):
    """One candidate across the samples, against the growth of the gap."""

    key: str
    #: when its newest process appeared (sample time); None when present, unchanged, since the first sample
    arrived: float | None
    #: its newest process appeared at most two samples before the growth began (or with it)
    arrived_as_growth_began: bool
    #: intervals before the growth in which it was present, with the same processes, and nothing grew
    quiet_before: int
    growth_with: int  # growth intervals at whose end it was present
    growth_without: int  # growth intervals at whose end it was absent
    #: samples in which a GPU it uses was full (None: unknown)
    full_seen: int | None = None


class Trend(Struct, frozen=True):
    """How fast the memory no meminfo field or cgroup counts grows over the samples."""
    rate: float | None  # bytes per second, least squares over the window; None until the window is covered
    span_s: float
    samples: int
    growth_intervals: int  # sample pairs in the current growth in which the gap grew by more than the noise
    refs: dict[str, str]
    freed: list[Freed]
    #: candidate -> the gap at the last sample before it first appeared (when the history covers its arrival)
    before: dict[str, int]
    seconds_to_min_watermark: float | None  # at the rate (or the early rate); None when not growing or unknown
    available: int | None
    min_watermark: int | None
    growing: bool  # rate at or above the growth threshold
    #: what the samples show at once: the gap's change since the current growth began (or the first sample)
    change_bytes: int = 0
    change_s: float = 0.0
    #: sample time before the first growth interval of the current growth (None: no growth seen)
    growth_began: float | None = None
    presence: dict[str, Presence] = field(default_factory=dict)
    source: str = "agent history"  # or the agent's samples file a one-shot check read
    #: bytes per second over the latest samples (the last `RECENT_S`): whether the growth still goes on
    recent_rate: float | None = None
    #: whose per-process signals move with the growth (the agent's fine samples; memory/tracking)
    tracking: Tracking | None = None

    @property
    def per_min(self) -> float:
        return (self.rate or 0.0) * 60

    @property
    def early_rate(self) -> float | None:
        """Bytes per second from the first samples of the growth: known from two samples on."""
        return self.change_bytes / self.change_s if self.change_s > 0 and self.growth_intervals else None

    def to_json(self) -> dict:
        return {"rate_bytes_per_s": None if self.rate is None else round(self.rate, 1), "span_s": round(self.span_s, 1),
                "samples": self.samples, "growth_intervals": self.growth_intervals,
                "change_bytes": self.change_bytes, "change_s": round(self.change_s, 1),
                "growth_began": self.growth_began, "freed": [asdict(f) for f in self.freed], "before": self.before,
                "growing": self.growing, "presence": {k: asdict(p) for k, p in self.presence.items()},
                "recent_rate_bytes_per_s": None if self.recent_rate is None else round(self.recent_rate, 1),
                "tracking": self.tracking.to_json() if self.tracking else None,
                "seconds_to_min_watermark": None if self.seconds_to_min_watermark is None
                else round(self.seconds_to_min_watermark, 1)}


def slope(points: list[tuple[float, int]]) -> float | None:
    """Least-squares bytes per second; None when the times do not spread."""
    n = len(points)
    if n < 2:
        return None
    mt = sum(t for t, _ in points) / n
    mb = sum(b for _, b in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if den <= 0:
        return None
    return sum((t - mt) * (b - mb) for t, b in points) / den


class MemoryHistory:
    """Bounded samples of the uncharged gap, and what they show.

    `window_s` is the span the rate is fitted over; a rate needs at least three samples covering 80 %
    of it (a rate over a few seconds is noise). `noise_bytes` is the change between two samples that
    counts as growth (driver bookkeeping moves by a few MiB between checks).
    """

    def __init__(self, maxlen: int = 120, window_s: float = 600.0, growth_bytes_per_min: int = 256 * MiB,
                 noise_bytes: int = 64 * MiB, clock: Callable[[], float] | None = None) -> None:
        self.samples: Deque[MemSample] = collections.deque(maxlen=max(3, int(maxlen)))
        #: every sample, fast ones not coalesced, for the per-process tracking (FINE_LEN: 5 min at 0.5 s)
        self.fine: Deque[MemSample] = collections.deque(maxlen=FINE_LEN)
        #: the caller's clock for sample times (the agent's); None: the check's own time
        self.clock = clock
        self.window_s = float(window_s)
        self.growth_bytes_per_min = int(growth_bytes_per_min)
        self.noise_bytes = int(noise_bytes)
        #: where the samples came from: "" (this process) or the agent's samples file a check read
        self.source = ""

    def to_json(self) -> dict:
        return {"version": 1, "window_s": self.window_s, "growth_bytes_per_min": self.growth_bytes_per_min,
                "noise_bytes": self.noise_bytes, "samples": [s.to_json() for s in self.samples]}

    @classmethod
    def from_json(cls, d: dict, maxlen: int = 120) -> "MemoryHistory":
        """The agent's recorded samples (`samples_file`); ValueError on anything malformed."""
        try:
            h = cls(maxlen, float(d["window_s"]), int(d["growth_bytes_per_min"]), int(d["noise_bytes"]))
            for x in d["samples"]:
                h.add(MemSample.from_json(x))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not the agent's memory samples: {type(exc).__name__}: {exc}") from None
        return h

    def add(self, s: MemSample, coalesce_s: float = 0.0) -> None:
        """Append `s`; with `coalesce_s`, replace the latest sample instead while it is within `coalesce_s`
        of the one before it (the agent's fast sampling: the newest reading counts, the series stays as long)."""
        if self.samples and s.t <= self.samples[-1].t:
            return  # a clock that went back, or the same check twice: keep the series monotonic
        if s.signals:  # only samples with candidates' signals can make a window (a node without GPU tenants keeps none)
            self.fine.append(s)
        if coalesce_s > 0 and len(self.samples) >= 2 and self.samples[-1].t - self.samples[-2].t < coalesce_s:
            self.samples.pop()
        self.samples.append(s)

    def trend(self, gpus_of: dict[str, tuple[str, ...]] | None = None) -> Trend | None:
        return trend(list(self.samples), self.window_s, self.growth_bytes_per_min, self.noise_bytes, gpus_of)

    def trend_with(self, s: MemSample, gpus_of: dict[str, tuple[str, ...]] | None = None) -> Trend | None:
        """What the samples show with `s` as the latest, without recording it (the caller adds it)."""
        xs = list(self.samples)
        if not xs or s.t > xs[-1].t:
            xs.append(s)
        t = trend(xs, self.window_s, self.growth_bytes_per_min, self.noise_bytes, gpus_of)
        if t is not None:
            fine = list(self.fine) or xs[:-1]
            if not fine or s.t > fine[-1].t:
                fine.append(s)
            t = replace(t, tracking=tracking(fine, self.growth_bytes_per_min, self.noise_bytes))
        return replace(t, source=f"the agent's samples ({self.source})") if t and self.source else t


def _presence(samples: list[MemSample], g: int | None, noise: int, full_for: dict[str, tuple[str, ...]]) -> dict[str, Presence]:
    """Each candidate against the growth that began at interval (g-1, g)."""
    out: dict[str, Presence] = {}
    keys = {k for s in samples for k in s.candidates}
    for k in keys:
        arrived_i: int | None = None
        for i, s in enumerate(samples):
            if k not in s.candidates:
                continue
            prev = samples[i - 1] if i else None
            if prev is None:
                continue
            if k not in prev.candidates or (s.pids.get(k) and prev.pids.get(k) is not None
                                            and set(s.pids[k]) - set(prev.pids[k])):
                arrived_i = i
        quiet = with_ = without = 0
        for i in range(1, len(samples)):
            a, b = samples[i - 1], samples[i]
            d = b.gap - a.gap
            if g is not None and i >= g and d > noise:
                if k in b.candidates:
                    with_ += 1
                else:
                    without += 1
            elif (g is None or i < g) and abs(d) <= noise and k in a.candidates and k in b.candidates \
                    and a.pids.get(k) == b.pids.get(k):
                quiet += 1
        full_seen = None
        gpus = full_for.get(k)
        if gpus is not None and all(s.full_gpus is not None for s in samples if k in s.candidates):
            full_seen = sum(1 for s in samples if k in s.candidates and set(gpus) & set(s.full_gpus or ()))
        out[k] = Presence(k, samples[arrived_i].t if arrived_i is not None else None,
                          arrived_i is not None and g is not None and g - 2 <= arrived_i <= g,
                          quiet, with_, without, full_seen)
    return out


def trend(samples: list[MemSample], window_s: float, growth_bytes_per_min: int, noise_bytes: int,
          gpus_of: dict[str, tuple[str, ...]] | None = None) -> Trend | None:
    """What the samples show; None with fewer than two. The sustained rate needs three samples over 80 % of the
    window; the change since the growth began is reported from the second sample on."""
    if len(samples) < 2:
        return None
    end = samples[-1].t
    win = [s for s in samples if s.t >= end - window_s]
    span = win[-1].t - win[0].t if win else 0.0
    rate = slope([(s.t, s.gap) for s in win]) if len(win) >= 3 and span >= 0.8 * window_s else None
    refs: dict[str, str] = {}
    for s in samples:
        refs.update(s.candidates)
    freed: list[Freed] = []
    start = 0  # the current growth: after the last fall of the gap
    for i, (a, b) in enumerate(zip(samples, samples[1:]), 1):
        d = b.gap - a.gap
        if d < -noise_bytes:
            start = i
            gone = [k for k in a.candidates if k not in b.candidates]
            if len(gone) == 1:
                freed.append(Freed(gone[0], refs.get(gone[0], gone[0]), -d, b.t))
    grow = [i for i in range(start + 1, len(samples)) if samples[i].gap - samples[i - 1].gap > noise_bytes]
    g = grow[0] if grow else None
    before: dict[str, int] = {}
    seen: set[str] = set(samples[0].candidates)
    for a, b in zip(samples, samples[1:]):
        for k in b.candidates:
            if k not in seen:
                seen.add(k)
                before[k] = a.gap
    last = samples[-1]
    base = samples[g - 1] if g is not None else samples[start]
    change, dt = last.gap - base.gap, last.t - base.t
    fast = rate if rate is not None else (change / dt if g is not None and dt > 0 else None)
    tte = None
    if fast is not None and fast > 0 and last.available is not None and last.min_watermark is not None:
        tte = max(0.0, (last.available - last.min_watermark) / fast)
    recent = [s for s in samples if s.t >= last.t - RECENT_S] or samples[-2:]
    if len(recent) < 2:
        recent = samples[-2:]
    rdt = recent[-1].t - recent[0].t
    return Trend(rate, span, len(win), len(grow), refs, freed, before, tte, last.available, last.min_watermark,
                 rate is not None and rate * 60 >= growth_bytes_per_min, change, dt,
                 base.t if g is not None else None, _presence(samples, g, noise_bytes, gpus_of or {}),
                 recent_rate=(recent[-1].gap - recent[0].gap) / rdt if rdt > 0 else None)
