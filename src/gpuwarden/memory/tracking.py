"""Which candidate's own signals move with the uncharged growth: separation by evidence over time, not by arrival.

When every graphics tenant was there from the start, arrival cannot tell who leaks. What a driver allocation
leaves in the allocating process can: kernel time (the driver allocates and zeroes pages in its context), page
faults, mappings of the NVIDIA/DRM device files, and NVML's per-process memory where the driver reports it. The
agent samples them per candidate at the fast memory cadence; this module compares, per candidate, how fast each
signal moved in the windows in which the gap grew against the fastest it moved while the gap was quiet (its own
baseline: a tenant that renders steadily moves all the time, and so never beats its baseline). A candidate
watched in too few quiet windows (the leak began before the samples did) is held to the signals' floors instead:
a tenant that moves at all in most growth windows then counts as tracking, so such a baseline can only make
naming harder, never easier. A candidate *tracks* the growth when it beat its baseline in most growth windows.
One is named only when it tracks and every other candidate was watched as long and did not (docs/memory.md,
section 8).
"""

from __future__ import annotations

from typing import Sequence

from msgspec import Struct, field

MiB = 1 << 20

#: the signals, in the order they are reported: (field, label, unit per second, floor per second)
SIGNALS = (
    ("kernel_ticks", "kernel time", "ticks/s", 2.0),
    ("faults", "page faults", "/s", 50.0),
    ("dev_maps", "NVIDIA/DRM mappings", "/s", 0.0),
    ("dev_map_bytes", "NVIDIA/DRM mapped bytes", "B/s", float(MiB)),
    ("nvml_used", "NVML per-process memory", "B/s", float(MiB)),
)
#: a growth window counts for a candidate when a signal moved faster than this multiple of its quiet-time maximum
#: (plus the signal's floor)
BEAT = 1.5
#: the holder beat its baseline in at least this share of the growth windows ...
TRACK_MIN = 0.8
#: ... and every other candidate in at most this share (the stated margin)
OTHERS_MAX = 0.2
#: how long each candidate must have been watched for either statement
MIN_GROWTH_WINDOWS = 3
MIN_QUIET_WINDOWS = 2
#: a window spans at least this long: the agent samples every 0.5 s while memory grows, and a driver's
#: allocation (its kernel time) and the memory it takes need not land in the same half second (run 22 on the
#: H200: a leaker allocating in bursts every 1.8 s beat its baseline in 2 of 6 half-second windows)
MIN_WINDOW_S = 2.0


class ProcSignals(Struct, frozen=True):
    """A candidate's cumulative per-process signals at one sample (summed over its processes; None: unread)."""

    kernel_ticks: int | None = None
    faults: int | None = None
    dev_maps: int | None = None
    dev_map_bytes: int | None = None
    nvml_used: int | None = None  # NVML's usedGpuMemory of its processes, where the driver gives it

    def plus(self, o: "ProcSignals") -> "ProcSignals":
        def add(a: int | None, b: int | None) -> int | None:
            return None if a is None and b is None else (a or 0) + (b or 0)
        return ProcSignals(*(add(getattr(self, n), getattr(o, n)) for n, *_ in SIGNALS))

    def to_json(self) -> list:
        return [getattr(self, n) for n, *_ in SIGNALS]

    @classmethod
    def from_json(cls, v: list) -> "ProcSignals":
        if not isinstance(v, list) or len(v) != len(SIGNALS):
            raise ValueError("signals: a list of five counters")
        return cls(*(None if x is None else int(x) for x in v))


class Track(Struct):
    """One candidate against the growth."""

    key: str
    ref: str
    growth_windows: int = 0  # growth windows in which it was present, same processes, signals read
    hits: int = 0  # of those, the windows in which a signal beat its quiet-time baseline
    quiet_windows: int = 0
    baseline: dict[str, float] = field(default_factory=dict)  # signal -> its fastest rate while the gap was quiet
    beat: dict[str, int] = field(default_factory=dict)  # signal -> growth windows in which it beat its baseline

    @property
    def floors_only(self) -> bool:
        """Too few quiet windows for a baseline of its own: held to the signals' floors (any movement counts)."""
        return self.quiet_windows < MIN_QUIET_WINDOWS

    @property
    def watched(self) -> bool:
        return self.growth_windows >= MIN_GROWTH_WINDOWS

    @property
    def share(self) -> float:
        return self.hits / self.growth_windows if self.growth_windows else 0.0

    def line(self) -> str:
        if not self.watched:
            return (f"{self.ref}: watched in {self.growth_windows} growth and {self.quiet_windows} quiet window(s), "
                    f"fewer than {MIN_GROWTH_WINDOWS} and {MIN_QUIET_WINDOWS}: cannot say whether it tracks")
        by = ", ".join(f"{lab} {self.beat[n]}" for n, lab, *_ in SIGNALS if self.beat.get(n))
        if self.floors_only:
            floors = ", ".join(f"{lab} {_fmt(floor)} {unit}" for _, lab, unit, floor in SIGNALS)
            return (f"{self.ref}: its signals moved above their floors in {self.hits} of {self.growth_windows} "
                    f"growth windows ({self.share:.0%}" + (f"; by {by}" if by else "") + f"); watched in "
                    f"{self.quiet_windows} quiet window(s), too few for a baseline of its own, so held to the "
                    f"floors ({floors})")
        base = ", ".join(f"{lab} {_fmt(self.baseline[n])} {unit}" for n, lab, unit, _ in SIGNALS if n in self.baseline)
        return (f"{self.ref}: its signals beat their quiet-time maximum in {self.hits} of {self.growth_windows} "
                f"growth windows ({self.share:.0%}" + (f"; by {by}" if by else "") + f"); quiet-time maximum over "
                f"{self.quiet_windows} quiet windows: {base or 'no signal read'}")

    def to_json(self) -> dict:
        return {"key": self.key, "ref": self.ref, "growth_windows": self.growth_windows, "hits": self.hits,
                "quiet_windows": self.quiet_windows, "share": round(self.share, 3), "baseline": self.baseline,
                "beat": self.beat}


class Tracking(Struct):
    """Whose signals track the growth; `holder` only when one does and the others, watched as long, do not."""

    holder: str | None  # candidate key
    strength: str  # "strong" | "sufficient" | "none"
    why: str
    tracks: list[Track] = field(default_factory=list)

    @property
    def evidence(self) -> list[str]:
        return [self.why] + [t.line() for t in self.tracks]

    def to_json(self) -> dict:
        return {"holder": self.holder, "strength": self.strength, "why": self.why,
                "tracks": [t.to_json() for t in self.tracks]}


def _fmt(x: float) -> str:
    return f"{x / MiB:.1f} Mi" if x >= MiB else f"{x:.1f}"


def _rates(a: ProcSignals, b: ProcSignals, dt: float) -> dict[str, float]:
    """Per-second rates of the counters both samples have; a counter that went back (a restart) is left out."""
    out = {}
    for n, *_ in SIGNALS:
        x, y = getattr(a, n), getattr(b, n)
        if x is not None and y is not None and (y >= x or n in ("dev_maps", "dev_map_bytes", "nvml_used")):
            out[n] = (y - x) / dt
    return out


def _windows(samples: Sequence, min_window_s: float) -> list[tuple]:
    """Consecutive windows of at least `min_window_s`: each from the end of the last to the first sample that far
    after it (a series sampled that slowly already is its pairs)."""
    out, start = [], None
    for s in samples:
        if start is None:
            start = s
        elif s.t - start.t >= min_window_s:
            out.append((start, s))
            start = s
    return out


def tracking(samples: Sequence, growth_bytes_per_min: int, noise_bytes: int,
             min_window_s: float = MIN_WINDOW_S) -> Tracking:
    """Compare each candidate's signals with the gap over the same windows (consecutive spans of at least
    `min_window_s`).

    `samples` are MemSample-like: `.t`, `.gap`, `.candidates` (key -> ref), `.pids` (key -> pids) and `.signals`
    (key -> ProcSignals). A growth window: the gap grew by more than `noise_bytes / 8` at `growth_bytes_per_min` or
    faster. A quiet window: any other in which it moved by at most `noise_bytes` (at the fast cadence the driver's
    bookkeeping moves it by a few MiB a second either way, which is no growth). A candidate counts in a window only
    when it is present at both ends with the same processes.
    """
    growth_per_s = growth_bytes_per_min / 60.0
    per: dict[str, list[tuple[bool, dict[str, float]]]] = {}
    refs: dict[str, str] = {}
    for a, b in _windows(samples, min_window_s):
        dt = b.t - a.t
        if dt <= 0:
            continue
        d = b.gap - a.gap
        rate = d / dt
        grew = d > noise_bytes / 8 and rate >= growth_per_s
        quiet = not grew and abs(d) <= noise_bytes
        if not (grew or quiet):
            continue
        sa, sb = getattr(a, "signals", {}) or {}, getattr(b, "signals", {}) or {}
        for k, sig in sb.items():
            if k not in sa or a.pids.get(k) != b.pids.get(k):
                continue
            refs[k] = b.candidates.get(k, k)
            per.setdefault(k, []).append((grew, _rates(sa[k], sig, dt)))
    tracks = []
    for k, ws in per.items():
        t = Track(k, refs[k])
        for grew, r in ws:
            if not grew:
                t.quiet_windows += 1
                for n, v in r.items():
                    t.baseline[n] = max(t.baseline.get(n, v), v)
        floors_only = t.floors_only
        for grew, r in ws:
            if not grew:
                continue
            t.growth_windows += 1
            if floors_only:  # no baseline of its own: any movement above the floor counts (naming gets harder)
                beat = [n for n, _, _, floor in SIGNALS if n in r and r[n] > floor]
            else:
                beat = [n for n, _, _, floor in SIGNALS
                        if n in r and n in t.baseline and r[n] > BEAT * max(t.baseline[n], 0.0) + floor]
            for n in beat:
                t.beat[n] = t.beat.get(n, 0) + 1
            t.hits += bool(beat)
        tracks.append(t)
    tracks.sort(key=lambda t: (-t.share, t.ref))
    return judge(tracks)


def judge(tracks: list[Track]) -> Tracking:
    """Name the one candidate that tracks while every other, watched as long, does not; else nobody."""
    if not tracks:
        return Tracking(None, "none", "no candidate's per-process signals were sampled while the memory grew")
    rule = (f"named only when one candidate's signals beat their quiet-time maximum (their floors, where too few "
            f"quiet windows were seen) in at least {TRACK_MIN:.0%} of {MIN_GROWTH_WINDOWS} or more growth windows "
            f"and every other candidate's, watched as long, in at most {OTHERS_MAX:.0%}")
    trackers = [t for t in tracks if t.watched and t.share >= TRACK_MIN]
    unwatched = [t for t in tracks if not t.watched]
    if len(trackers) == 1 and not unwatched and all(t.share <= OTHERS_MAX for t in tracks if t is not trackers[0]):
        h = trackers[0]
        others = [t for t in tracks if t is not h]
        strong = (h.share == 1.0 and h.growth_windows >= 2 * MIN_GROWTH_WINDOWS and all(t.hits == 0 for t in others)
                  and not any(t.floors_only for t in tracks))
        margin = h.share - max((t.share for t in others), default=0.0)
        why = (f"{h.ref}'s own signals moved with the growth in {h.hits} of {h.growth_windows} growth windows "
               f"({h.share:.0%})" + (", the others' in " + ", ".join(f"{t.hits} of {t.growth_windows}" for t in others)
                                     if others else "")
               + f": a margin of {margin:.0%}, enough because {rule}"
               + (" (strong: every growth window, over twice the minimum, and no other candidate ever)" if strong else "")
               + ("; no quiet-time baseline for " + ", ".join(t.ref for t in tracks if t.floors_only)
                  + ": held to the signals' floors" if any(t.floors_only for t in tracks) else ""))
        return Tracking(h.key, "strong" if strong else "sufficient", why, tracks)
    if len(trackers) > 1:
        why = "several candidates' signals track the growth (" + ", ".join(f"{t.ref} {t.share:.0%}" for t in trackers) + ")"
    elif unwatched:
        why = "not every candidate was watched long enough (" + ", ".join(t.ref for t in unwatched) + ")"
    elif trackers:
        why = "another candidate's signals also moved with the growth too often"
    else:
        why = "no candidate's signals track the growth"
    return Tracking(None, "none", f"not separated by per-process signals: {why}; {rule}", tracks)
