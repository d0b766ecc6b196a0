"""The uncharged-memory history a long-running caller (the agent) keeps across checks.

One-shot `check` sees one instant: how much host memory no cgroup is charged for, and who may hold
it. Only successive samples show *how fast* it grows, *when* MemAvailable will reach the kernel's min
watermark at that rate, and which workload was present whenever it grew (or gave memory back when it
left). `MemoryHistory` holds those samples; `trend()` is a pure function of them.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable, Deque

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class MemSample:
    t: float  # seconds (monotonic or epoch: only differences are used)
    gap: int  # bytes of host memory in no meminfo field and charged to no cgroup
    available: int | None = None  # MemAvailable
    min_watermark: int | None = None  # sum of the zones' min watermarks
    #: candidate holders present at this sample: key (pod uid, or "pid:N") -> display reference
    candidates: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Freed:
    """Memory that came back when a candidate left: strong evidence it was the holder."""

    key: str
    ref: str
    bytes: int
    t: float


@dataclass(frozen=True)
class Trend:
    rate: float | None  # bytes per second, least squares over the window; None until the window is covered
    span_s: float
    samples: int
    growth_intervals: int  # consecutive sample pairs in which the gap grew by more than the noise
    #: candidates present in every growth interval, most samples first
    present_in_growth: list[str]
    refs: dict[str, str]
    freed: list[Freed]
    #: candidate -> the gap at the last sample before it first appeared (when the history covers its arrival)
    before: dict[str, int]
    seconds_to_min_watermark: float | None  # at this rate; None when not growing or unknown
    available: int | None
    min_watermark: int | None
    growing: bool  # rate at or above the growth threshold

    @property
    def per_min(self) -> float:
        return (self.rate or 0.0) * 60

    def implicated(self) -> str | None:
        """The one candidate present whenever the gap grew, if exactly one."""
        return self.present_in_growth[0] if len(self.present_in_growth) == 1 else None

    def to_json(self) -> dict:
        return {"rate_bytes_per_s": None if self.rate is None else round(self.rate, 1), "span_s": round(self.span_s, 1), "samples": self.samples,
                "growth_intervals": self.growth_intervals, "present_in_growth": self.present_in_growth,
                "freed": [f.__dict__ for f in self.freed], "before": self.before, "growing": self.growing,
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
        #: the caller's clock for sample times (the agent's); None: the check's own time
        self.clock = clock
        self.window_s = float(window_s)
        self.growth_bytes_per_min = int(growth_bytes_per_min)
        self.noise_bytes = int(noise_bytes)

    def add(self, s: MemSample) -> None:
        if self.samples and s.t <= self.samples[-1].t:
            return  # a clock that went back, or the same check twice: keep the series monotonic
        self.samples.append(s)

    def trend(self) -> Trend | None:
        return trend(list(self.samples), self.window_s, self.growth_bytes_per_min, self.noise_bytes)

    def trend_with(self, s: MemSample) -> Trend | None:
        """What the samples show with `s` as the latest, without recording it (the caller adds it)."""
        xs = list(self.samples)
        if not xs or s.t > xs[-1].t:
            xs.append(s)
        return trend(xs, self.window_s, self.growth_bytes_per_min, self.noise_bytes)


def trend(samples: list[MemSample], window_s: float, growth_bytes_per_min: int, noise_bytes: int) -> Trend | None:
    """What the samples show; None with fewer than two. The rate needs three samples over 80 % of the window."""
    if len(samples) < 2:
        return None
    end = samples[-1].t
    win = [s for s in samples if s.t >= end - window_s]
    span = win[-1].t - win[0].t if win else 0.0
    rate = slope([(s.t, s.gap) for s in win]) if len(win) >= 3 and span >= 0.8 * window_s else None
    refs: dict[str, str] = {}
    for s in samples:
        refs.update(s.candidates)
    growth = 0
    present: collections.Counter[str] = collections.Counter()
    freed: list[Freed] = []
    for a, b in zip(samples, samples[1:]):
        d = b.gap - a.gap
        if d > noise_bytes:
            growth += 1
            for k in set(a.candidates) & set(b.candidates):
                present[k] += 1
        elif d < -noise_bytes:
            gone = [k for k in a.candidates if k not in b.candidates]
            if len(gone) == 1:
                freed.append(Freed(gone[0], refs.get(gone[0], gone[0]), -d, b.t))
    before: dict[str, int] = {}
    seen: set[str] = set(samples[0].candidates)
    for a, b in zip(samples, samples[1:]):
        for k in b.candidates:
            if k not in seen:
                seen.add(k)
                before[k] = a.gap
    always = sorted((k for k, n in present.items() if n == growth and growth), key=lambda k: (-present[k], k))
    last = samples[-1]
    tte = None
    if rate is not None and rate > 0 and last.available is not None and last.min_watermark is not None:
        tte = max(0.0, (last.available - last.min_watermark) / rate)
    return Trend(rate, span, len(win), growth, always, refs, freed, before, tte, last.available, last.min_watermark,
                 rate is not None and rate * 60 >= growth_bytes_per_min)
